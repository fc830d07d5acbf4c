"""The release's files (tasks/release/): its assignment, the facts decided after staging, the release
shards, the dataset card and the published versions. The captions stage and the report read
these through this module; the manifest, which every stage reads, is corpusforge/layout.py's.

::

    work/release/{split}-{n}.parquet   the samples of one release shard, in order, with the staging
                                       spans (shard, offset, size, SHA-256) its writer copies
    work/late/{part}.parquet           facts decided after staging, joined into the manifest
    work/release_staged.parquet        the staging shards a release is assigned from: written by the
                                       publishing flow, read by the assignment task, which gets only its SHA-256
    shards/{split}/{split}-{n}.tar     release shards (splits.layout: default)
    shards/{split}/gpic_{split}_{n}.tar   release shards in GPIC's layout (splits.layout: gpic);
                                       shards/ is then a GPIC release root
    shards/README.md                   Hugging Face dataset card: splits and features (tasks/release/release_card.py)
    versions/{version}/shards/…, versions/{version}/manifest/…   a published version: the working copies
                                       linked (local) or copied (object store) once whole
    current.json                       the published version, written last: what readers read first
"""

from __future__ import annotations

import pyarrow as pa

from corpusforge.layout import part_name

RELEASE_ASSIGNMENT_DIR = "work/release"
LATE_DIR = "work/late"
RELEASE_STAGED = "work/release_staged.parquet"  # the assignment's staging shards (tasks/release/shards.py)
RELEASE_DIR = "shards"
RELEASE_CARD = "shards/README.md"

# Published versions (tasks/release/versions.py): readers read current.json, then its folders.
VERSIONS_DIR = "versions"  # versions/{version}/shards/…, versions/{version}/manifest/…
CURRENT = "current.json"  # the published version: written last, the one switch a reader sees


def late_path(part: int) -> str:
    return f"{LATE_DIR}/{part_name(part)}.parquet"


def release_shard_name(split: str, shard: int, layout: str = "default") -> str:
    """A release shard's name: ``train-000000`` (default) or GPIC's ``gpic_train_00000``."""
    if layout == "gpic":
        return f"gpic_{split}_{shard:05d}"
    return f"{split}-{shard:06d}"


def release_assignment_path(name: str) -> str:
    return f"{RELEASE_ASSIGNMENT_DIR}/{name}.parquet"


def release_tar(split: str, shard: int, layout: str = "default") -> str:
    return f"{RELEASE_DIR}/{split}/{release_shard_name(split, shard, layout)}.tar"


def version_dir(version: str) -> str:
    return f"{VERSIONS_DIR}/{version}"


# GPIC_FORMAT.md: a release sample's JSON in the gpic layout, these fields in this order
# (strings, except img_width/img_height: int and split: the list of tiers holding the sample).
GPIC_JSON_FIELDS = ("retrieved_at", "license", "license_url", "attribution", "key", "img_width", "img_height",
                    "split", "caption_type", "caption")

# Where one staged member lies in its staging tar (from the staging index): a release
# writer copies these spans and nothing else.
MEMBER_SPAN = pa.struct([("ext", pa.string()), ("offset", pa.int64()), ("size", pa.int64()),
                         ("sha256", pa.string())])
RELEASE_STAGED_SCHEMA = pa.schema([("shard", pa.string())])  # work/release_staged.parquet, in the order given
RELEASE_ASSIGNMENT_SCHEMA = pa.schema([("key", pa.string()), ("staging_shard", pa.string()), ("tier", pa.string()),
                                       ("caption", pa.string()), ("caption_type", pa.string()),
                                       ("caption_origin", pa.string()), ("release_ext", pa.string()),
                                       ("image_encoding", pa.string()),
                                       ("members", pa.list_(MEMBER_SPAN))])  # the sample's staged members, by ext
LATE_SCHEMA = pa.schema([
    ("row", pa.int32()), ("staging_shard", pa.string()), ("status", pa.string()), ("reason", pa.string()),
    ("duplicate_of", pa.string()), ("component_id", pa.int64()), ("component_size", pa.int32()),
    ("max_similarity", pa.float32()), ("split", pa.string()), ("shard", pa.string()), ("tier", pa.string()),
    ("caption_type", pa.string()), ("caption_origin", pa.string()), ("vlm_model", pa.string()),
    ("vlm_answers", pa.string()),
    ("release_ext", pa.string()), ("image_encoding", pa.string()),
])
