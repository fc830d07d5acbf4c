"""The other flows' planning that reads data, at scale: evaluate's listing of the generated
images and qualify-prompts' listing of its generated images, each a task now
(flows/evaluate.py PLAN_GENERATED, tasks/prompts/signals.py LIST_GENERATED).

Evaluate lists the benchmark's source folder (N small image files and a tenth as many
caption sidecars, which it skips); qualify-prompts a ``{model}/{prompt_id}/{image}`` tree
of N images (4 models, 4 images a prompt). Both return what they found to the flow
process, O(N) there: the listing's result size is reported (``result_bytes``), and for
evaluate the embedding tasks' parameters (one chunk of ``chunk_size`` file names each).
"""

from __future__ import annotations

import os
import pickle
from typing import Any

from bench.scale import INPUTS, Scale, step

MODELS = 4
IMAGES_PER_PROMPT = 4


def _generated(data: str) -> str:
    return os.path.join(data, "generated")


def write_generated(store, sc: Scale, src: str) -> None:
    """N image files as qualify-prompts reads them: {model}/{prompt_id}/{n}.png."""
    root = _generated(os.path.dirname(src))
    per_model = sc.n // MODELS
    for m in range(MODELS):
        for p in range(per_model // IMAGES_PER_PROMPT):
            folder = os.path.join(root, f"model{m}", f"p{p:07d}")
            os.makedirs(folder)
            for i in range(IMAGES_PER_PROMPT):
                open(os.path.join(folder, f"{i}.png"), "wb").close()


INPUTS["generated"] = write_generated


@step("evaluate_plan", ("folder",), "task", ("tasks.stats.evaluate",), max_n=100_000)
def run_evaluate_plan(store, sc: Scale, data: str) -> dict[str, Any]:
    """Evaluate's listing task (plan_generated): every file listed, resolved and stamped,
    cut into chunks; params: the listing task's and the largest embedding task's."""
    from tasks.stats.evaluate import plan_generated

    kwargs = dict(sources=[os.path.join(data, "src")], storage_options={}, chunk_size=1000)
    chunks = plan_generated(**kwargs)
    embed = max(({"chunk": c} for c in chunks), key=lambda c: len(pickle.dumps(c)))
    return {"tasks": 1 + len(chunks), "params": [kwargs, embed], "chunks": len(chunks),
            "result_bytes": len(pickle.dumps(chunks))}


@step("prompts_listing", ("generated",), "task", ("tasks.prompts.variance",), max_n=100_000)
def run_prompts_listing(store, sc: Scale, data: str) -> dict[str, Any]:
    """Qualify-prompts' listing task (list_generated): one listing of the generated tree,
    each image resolved and stamped."""
    from tasks.prompts.variance import list_generated

    kwargs = dict(generated=_generated(data), options={})
    listing = list_generated(**kwargs)
    found = sum(len(images) for prompts in listing["found"].values() for images in prompts.values())
    return {"tasks": 1, "params": [kwargs], "images": found, "result_bytes": len(pickle.dumps(listing))}
