"""Signal 2, output variance: do a model's N images for one prompt cluster unusually tightly?

Per (prompt, model): the trace of the covariance (ddof 1) of its images' embeddings, the total
variance in feature space; flagged below that model's mean minus ``sd_threshold`` sd (ddof 1)
over its prompts, and the strong case when flagged for ``strong_min_models`` models (the seed:
"consistent across multiple models"). One unit per (model, chunk of prompts), read from the
listing (:mod:`tasks.prompts.generated`). Low variance can also mean a prompt that models render
consistently well: a reason to review, never proof of memorisation.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from typing import Any

import numpy as np
import pyarrow as pa

from corpusforge.contract import UnitKey, UnitResult, prune, remove_tree, run_unit, unit_fingerprint
from tasks.prompts.files import GENERATED_VARIANCE_SCHEMA, PROMPTS_GENERATED, generated_variance_path
from corpusforge.version import code_version
from tasks.prompts.generated import chunk_name, unit_prompts
from tasks.shared.inputs import read_image

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # object addresses in error messages differ between runs


def trace_covariance(x: np.ndarray) -> float:
    """Total variance: the trace of the sample covariance (ddof 1) of the rows of ``x``."""
    x = np.asarray(x, dtype=np.float64)
    return float(((x - x.mean(axis=0)) ** 2).sum() / (len(x) - 1))


def variance_flags(variances: np.ndarray, sd_threshold: float) -> dict[str, Any]:
    """One model's flags: variance < mean − sd_threshold · sd (ddof 1) over its prompts (NaN = no
    variance). Fewer than three prompts with a variance give no usable sd, hence no flags."""
    ok = ~np.isnan(variances)
    values = variances[ok]
    if len(values) < 3:
        return {"mean": None, "sd": None, "cut": None, "flags": np.zeros(len(variances), bool), "n": len(values)}
    mean, sd = float(values.mean()), float(values.std(ddof=1))
    cut = mean - sd_threshold * sd
    return {"mean": mean, "sd": sd, "cut": cut, "flags": ok & (np.nan_to_num(variances, nan=np.inf) < cut),
            "n": len(values)}


def variance_key(generated: str, model: str, prompts: list[tuple[str, list[tuple[str, str]]]], cfg: Any) -> UnitKey:
    """One variance unit's fingerprint: what the unit and ``corpusforge plan`` key it by."""
    config = {"variance": {"model": cfg.model.model_dump(mode="json"), "min_images": cfg.min_images}}
    return unit_fingerprint("prompt-output-variance", code_version(__name__), config,
                            [generated.rstrip("/"), model, prompts])


def variance_unit(out: Any, generated: str, options: dict[str, Any], model: str, unit: int, cfg: Any) -> UnitResult:
    """One unit: the variance of every prompt of unit ``unit`` of generating ``model``, its
    prompts and their images read from the listing (:func:`tasks.prompts.generated.unit_prompts`).
    ``cfg`` is a :class:`~tasks.prompts.config.VarianceConfig`."""
    rel = generated_variance_path(model, chunk_name(unit))
    prompts = unit_prompts(out, model, unit)
    fp = variance_key(generated, model, prompts, cfg)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        from tasks.shared.features.decode import decode_rgb
        from tasks.shared.features.registry import load_model

        batch = cfg.runtime.batch_size
        feature_model = load_model(cfg.model, cfg.runtime)
        root = generated.rstrip("/")
        rows = []
        for prompt_id, files in prompts:
            images, pixels = [], []
            for name, _ in files:
                image = posixpath.join(model, prompt_id, name)
                data, error = read_image(posixpath.join(root, image), [root], options, image)
                sha = None if data is None else hashlib.sha256(data).hexdigest()
                if data is not None:
                    try:
                        pixels.append(np.asarray(feature_model.preprocess(decode_rgb(data)), dtype=np.float32))
                    except Exception as exc:  # noqa: BLE001 - one bad image is that image's error
                        error = _ADDRESS.sub("", f"{type(exc).__name__}: {exc}")[:300]
                images.append([name, sha, error])
            variance = None
            if len(pixels) >= cfg.min_images:
                vectors = np.concatenate([np.asarray(feature_model.embed(np.stack(pixels[i:i + batch])))
                                          for i in range(0, len(pixels), batch)])
                variance = trace_covariance(vectors)
            rows.append({"prompt_id": prompt_id, "model": model, "n_images": len(files), "n_embedded": len(pixels),
                         "images": json.dumps(images), "variance": variance})
        table = pa.Table.from_pylist(rows, schema=GENERATED_VARIANCE_SCHEMA)
        return {rel: out.write_parquet(rel, table)}, {"identity": feature_model.fingerprint(),
                                                       "prompts": len(rows)}

    return run_unit(out, rel, fp, compute)


def prune_generated(out: Any, cuts: dict[str, list[str]]) -> None:
    """Keep only the units of the current cuts (``{model: [chunk, …]}``) and models."""
    for model in out.listdir(PROMPTS_GENERATED):
        if model not in cuts:
            remove_tree(out, f"{PROMPTS_GENERATED}/{model}")
    for model, chunks in cuts.items():
        prune(out, f"{PROMPTS_GENERATED}/{model}", chunks)
