"""The other flows' planning that reads data, at scale: evaluate's listing of the generated
images and qualify-prompts' listing of its generated images, each a task
(tasks/stats/evaluate.py LIST_GENERATED, tasks/prompts/signals.py LIST_GENERATED).

Evaluate lists the benchmark's source folder (N small image files and a tenth as many
caption sidecars, which it skips) into its listing file and returns the chunks' names
(O(chunks) to the flow), and each embedding task reads its chunk's files from that file:
the listing's result size is reported (``result_bytes``) with the largest embedding
task's parameters. Qualify-prompts lists a ``{model}/{prompt_id}/{image}`` tree of N
images (4 models, 4 images a prompt) into its listing file, cut into the variance units,
and returns the models and their unit counts (``result_bytes``); each unit reads its prompts
from that file.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

from bench.scale import FIXED, GUARDED, INPUTS, Scale, step

MODELS = 4
IMAGES_PER_PROMPT = 4


def _generated(data: str) -> str:
    return os.path.join(data, "generated")


def write_generated(store, sc: Scale, src: str) -> None:
    """N image files as qualify-prompts reads them: {model}/{prompt_id}/{n}.png; and the
    valid prompts' order the flow writes for the listing (every prompt, the set in reverse,
    so the listing's order is not the folders')."""
    from tasks.prompts.generated import write_prompt_order

    root = _generated(os.path.dirname(src))
    per_model = sc.n // MODELS
    prompts = per_model // IMAGES_PER_PROMPT
    write_prompt_order(store, [{"prompt_id": f"p{p:07d}", "status": "valid"} for p in reversed(range(prompts))])
    for m in range(MODELS):
        for p in range(prompts):
            folder = os.path.join(root, f"model{m}", f"p{p:07d}")
            os.makedirs(folder)
            for i in range(IMAGES_PER_PROMPT):
                open(os.path.join(folder, f"{i}.png"), "wb").close()


INPUTS["generated"] = write_generated


@step("evaluate_plan", ("folder",), "task", ("tasks.stats.evaluate",))
def run_evaluate_plan(store, sc: Scale, data: str) -> dict[str, Any]:
    """Evaluate's listing task (write_generated_listing): every file listed, resolved and
    stamped, cut into chunks, written to the listing file; then each chunk's files read back
    as its embedding task reads them. Params: the listing task's and an embedding task's."""
    from tasks.stats.evaluate import read_listed_chunk, write_generated_listing

    sources = [os.path.join(data, "src")]
    kwargs = dict(out=store, sources=sources, storage_options={}, chunk_size=1000)
    chunks = write_generated_listing(**kwargs)
    for c in chunks:
        read_listed_chunk(store, c.index, sources)
    embed = {"out": store, "chunk": chunks[-1].index, "sources": sources}
    return {"tasks": 1 + len(chunks), "params": [kwargs, embed], "chunks": len(chunks),
            "result_bytes": len(pickle.dumps(chunks))}


@step("prompts_listing", ("generated",), "task", ("tasks.prompts.generated",))
def run_prompts_listing(store, sc: Scale, data: str) -> dict[str, Any]:
    """Qualify-prompts' listing task (list_generated): one listing of the generated tree, each
    image resolved and stamped, cut into the variance units (100 prompts each) in the
    listing file; then each unit's prompts read back as its task reads them. Params: the
    listing task's and a variance unit's."""
    from tasks.prompts.config import VarianceConfig
    from tasks.prompts.generated import list_generated, unit_prompts

    kwargs = dict(out=store, generated=_generated(data), options={}, prompts_per_unit=100)
    listing = list_generated(**kwargs)
    found = sum(len(images) for model, units in listing["units"].items() for unit in range(units)
                for _, images in unit_prompts(store, model, unit))
    cfg = VarianceConfig(generated=kwargs["generated"])
    unit = {"out": store, "generated": kwargs["generated"], "options": {}, "model": "model0", "unit": 0, "cfg": cfg}
    return {"tasks": 1 + sum(listing["units"].values()), "params": [kwargs, unit], "images": found,
            "result_bytes": len(pickle.dumps(listing))}


FIXED += ["evaluate_plan", "prompts_listing"]
GUARDED += ["evaluate_plan", "prompts_listing"]
