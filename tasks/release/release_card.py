"""The release root's Hugging Face dataset card: which tars form which split, and the features.

Without it, ``datasets``' webdataset builder infers the schema from the first five samples
of one shard: it refuses a shard whose samples differ in member names (``.jpg`` beside
``.png``), and a JSON value that is empty there (``"split": []`` in val/test, a null
licence) is typed ``null`` and fails on the first real value later. The card declares
both, so ``load_dataset("OUT/shards")`` reads every layout and image format as it is:
one image column per extension the release uses, None where a sample has another.
"""

from __future__ import annotations

from typing import Any

import yaml

from tasks.release.files import GPIC_JSON_FIELDS
from tasks.shared.samples import SAMPLE_JSON_FIELDS

HF_SPLIT = {"train": "train", "val": "validation", "test": "test"}
INT_FIELDS = {"width", "height", "img_width", "img_height"}
LIST_FIELDS = {"split", "tiers"}  # lists of tier names (gpic: split; default: tiers)


def json_fields(layout: str) -> list[str]:
    if layout == "gpic":
        return list(GPIC_JSON_FIELDS)
    return [*SAMPLE_JSON_FIELDS, "split", "tiers", "format"]


def _feature(name: str, layout: str) -> dict[str, Any]:
    if name in LIST_FIELDS and not (layout == "default" and name == "split"):
        return {"name": name, "list": "string"}
    return {"name": name, "dtype": "int64" if name in INT_FIELDS else "string"}


def dataset_card(layout: str, splits: list[str], image_exts: list[str]) -> bytes:
    """README.md with YAML front matter: one config whose splits are the split folders'
    tars, and the features of a sample in ``layout``."""
    features: list[dict[str, Any]] = [{"name": "json", "struct": [_feature(f, layout) for f in json_fields(layout)]}]
    if layout == "default":
        features.append({"name": "txt", "dtype": "string"})
    features += [{"name": ext, "dtype": "image"} for ext in sorted(image_exts)]
    features += [{"name": "__key__", "dtype": "string"}, {"name": "__url__", "dtype": "string"}]
    meta = {"configs": [{"config_name": "default",
                         "data_files": [{"split": HF_SPLIT[s], "path": f"{s}/*.tar"} for s in splits]}],
            "dataset_info": {"features": features}}
    body = (f"Release shards written by corpusforge in the `{layout}` layout. Load with "
            "`datasets.load_dataset(\"<this folder>\")`, or stream the tars with `webdataset`.\n")
    return f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n\n{body}".encode()
