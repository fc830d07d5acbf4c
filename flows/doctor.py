"""``corpusforge doctor``: what this machine offers corpusforge. Reads only, changes nothing.

Python, torch and its CUDA devices, the FAISS flavour (CPU or GPU build), dask-cuda,
the weights each configured model would use (found, pinned hash matching), the Prefect
API in use (and whether it answers), the Dask scheduler in use (and its workers and
their resources).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from collections.abc import Iterator
from typing import Any


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch() -> Iterator[tuple[str, str]]:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken install is what doctor is for
        yield "torch", f"not importable ({type(exc).__name__}: {exc})"
        return
    yield "torch", f"{torch.__version__}"
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        yield "CUDA devices", f"{len(names)}: " + ", ".join(names)
    else:
        yield "CUDA devices", "none (features run on the CPU)"


def _faiss() -> str:
    try:
        import faiss
    except Exception as exc:  # noqa: BLE001
        return f"not importable ({exc})"
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    flavour = "GPU build" if hasattr(faiss, "StandardGpuResources") else "CPU build"
    return f"{faiss.__version__}, {flavour}" + (f", {gpus} GPU(s) visible" if gpus else "")


def _weights(config: Any) -> Iterator[tuple[str, str]]:
    from flows.preflight import UserError, allowlists, check_model, model_specs

    specs = model_specs(config)
    if not specs:
        yield "weights", "no feature model in this config"
    for spec in specs:
        label = f"model {spec.model_id}"
        if spec.name == "wfd":
            yield label, "weight-free descriptor (no weights needed)"
        elif spec.weights is None:
            yield label, "RANDOM INIT (no weights)" if spec.random_init else "NO WEIGHTS configured: refused"
        else:
            try:
                check_model(spec, allowlists(config))
            except UserError as exc:
                yield label, f"{spec.weights.uri}: {exc}"
            else:
                yield label, f"{spec.weights.uri}: found, SHA-256 matches the pin"


def _prefect() -> Iterator[tuple[str, str]]:
    url = os.environ.get("PREFECT_API_URL")
    if not url:
        try:
            from prefect.settings import get_current_settings

            url = get_current_settings().api.url
        except Exception:  # noqa: BLE001
            url = None
    if not url:
        yield "Prefect API", "none configured: each run starts a temporary local server (set PREFECT_API_URL)"
        return
    import httpx

    try:
        ok = httpx.get(url.rstrip("/") + "/health", timeout=5).status_code == 200
    except httpx.HTTPError as exc:
        yield "Prefect API", f"{url}: NOT REACHABLE ({type(exc).__name__})"
        return
    yield "Prefect API", f"{url}: {'answers' if ok else 'answers with an error'}"


def _dask(address: str | None) -> Iterator[tuple[str, str]]:
    if not address:
        yield "Dask scheduler", "none configured: runs start an embedded LocalCluster (set dask.address)"
        return
    try:
        from distributed import Client

        with Client(address, timeout=5) as client:
            workers = client.scheduler_info()["workers"].values()
            resources: dict[str, float] = {}
            for w in workers:
                for k, v in (w.get("resources") or {}).items():
                    resources[k] = resources.get(k, 0) + v
    except Exception as exc:  # noqa: BLE001 - unreachable is the answer
        yield "Dask scheduler", f"{address}: NOT REACHABLE ({type(exc).__name__}: {exc})"
        return
    res = ", ".join(f"{k}={v:g}" for k, v in sorted(resources.items())) or "none declared"
    yield "Dask scheduler", f"{address}: {len(list(workers))} worker(s), resources {res}"


def doctor(config_path: str | None = None, scheduler: str | None = None) -> list[tuple[str, str]]:
    """(name, finding) pairs, in the order they are printed."""
    from flows.preflight import load_config

    rows: list[tuple[str, str]] = [("Python", f"{platform.python_version()} ({sys.executable})"),
                                   ("corpusforge", _version("corpusforge") or "not installed (run from a checkout)")]
    rows += list(_torch())
    rows.append(("FAISS", _faiss()))
    rows.append(("dask", f"{_version('dask')}, distributed {_version('distributed')}, dask-cuda "
                         f"{_version('dask-cuda') or 'not installed'}"))
    rows.append(("prefect", f"{_version('prefect')}, prefect-dask {_version('prefect-dask')}"))
    config = None
    if config_path:
        cls = _config_class(config_path)
        placeholders = {"source": "-", "out": "-"} if cls.__name__ == "BuildConfig" else {}
        config = load_config(cls, config_path, **{k: v for k, v in placeholders.items()
                                                  if k not in _keys(config_path)})
        rows += list(_weights(config))
    rows += list(_prefect())
    address = scheduler or (config.dask.address if config is not None and hasattr(config, "dask") else None) \
        or os.environ.get("DASK_SCHEDULER_ADDRESS")
    rows += list(_dask(address))
    return rows


def _keys(path: str) -> set[str]:
    import yaml

    try:
        data = yaml.safe_load(open(path)) or {}
    except Exception:  # noqa: BLE001 - load_config reports the real problem
        return set()
    return set(data) if isinstance(data, dict) else set()


def _config_class(path: str) -> type:
    """The flow config a YAML file is for: the first whose required keys it has."""
    from flows.build_corpus import BuildConfig
    from flows.contamination import ContaminationConfig
    from flows.evaluate import EvaluateConfig
    from flows.extract_features import ExtractFeaturesConfig
    from flows.near_dedup import NearDedupFlowParams
    from flows.reference_stats import ReferenceStatsFlowParams

    keys = _keys(path)
    for cls in (ContaminationConfig, EvaluateConfig, NearDedupFlowParams, ReferenceStatsFlowParams,
                ExtractFeaturesConfig):
        required = {n for n, f in cls.model_fields.items() if f.is_required()}
        if required and required <= keys and keys <= set(cls.model_fields):
            return cls
    return BuildConfig
