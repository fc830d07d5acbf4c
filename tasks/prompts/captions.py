"""The corpus side of the density signal: a seeded sample of a built corpus's kept captions,
embedded shard by shard under the stage contract.

The sample is a bottom-k of ``stable_uniform(seed, key)`` over kept records: independent of part
order or count, holding at most 2·k candidates at a time. Each staging shard with sampled keys
is one embedding unit, reading only the ``.txt`` members by ranged reads. The corpus is only read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from corpusforge.contract import UnitKey, UnitResult, digest_of, read_marker, run_unit, unit_fingerprint
from corpusforge.hashing import canonical_json, sha256_bytes, stable_uniform
from corpusforge.layout import MANIFEST_DIR, staging_tar
from tasks.prompts.files import (PROMPTS_CAPTION_SAMPLE, caption_embeddings_path, caption_keys_path,
                                 text_embeddings_path)
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.prompts.text_model import embed_texts
from tasks.shared.samples import staged_captions

SAMPLE_SCHEMA = pa.schema([("key", pa.string()), ("staging_shard", pa.string()), ("draw", pa.float64())])
KEYS_SCHEMA = pa.schema([("key", pa.string())])


def manifest_digest(corpus: Store) -> tuple[str, list[str]]:
    """One digest over the manifest parts (their markers' digests, else their bytes) and the part names."""
    parts = sorted(n for n in corpus.listdir(MANIFEST_DIR) if n.endswith(".parquet") and not n.startswith("."))
    if not parts:
        raise FileNotFoundError(f"{corpus.path(MANIFEST_DIR)} has no parts: not a finished corpusforge build")
    digests = {}
    for name in parts:
        rel = f"{MANIFEST_DIR}/{name}"
        marker = read_marker(corpus, rel)
        digests[rel] = marker.digest if marker else corpus.sha256(rel)
    return digest_of(digests), parts


def _bottom_k(keys: list[str], shards: list[str], draws: np.ndarray, k: int) -> tuple[list[str], list[str], np.ndarray]:
    if len(keys) <= k:
        return keys, shards, draws
    order = sorted(range(len(keys)), key=lambda i: (draws[i], keys[i]))[:k]
    return [keys[i] for i in order], [shards[i] for i in order], draws[order]


def sample_key(corpus: Store, size: int, seed: int, splits: list[str] | None) -> tuple[UnitKey, str, list[str]]:
    """The caption sample's fingerprint, the manifest's digest and its parts (markers only):
    what the unit and ``corpusforge plan`` key it by."""
    digest, parts = manifest_digest(corpus)
    config = {"density": {"sample_size": size, "sample_seed": seed, "splits": splits}}
    return unit_fingerprint("prompt-caption-sample", code_version(__name__), config, digest), digest, parts


def sample_captions(corpus: Store, out: Store, size: int, seed: int, splits: list[str] | None) -> UnitResult:
    """The caption sample unit (see the module docstring); returns its marker."""
    fp, digest, parts = sample_key(corpus, size, seed, splits)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        keys: list[str] = []
        shards: list[str] = []
        draws = np.zeros(0)
        kept = 0
        for name in parts:
            t = corpus.read_parquet(f"{MANIFEST_DIR}/{name}", columns=["key", "status", "split", "staging_shard"])
            status, split = t["status"].to_pylist(), t["split"].to_pylist()
            chosen = [i for i in range(t.num_rows) if status[i] == "kept" and (splits is None or split[i] in splits)]
            kept += len(chosen)
            all_keys, all_shards = t["key"].to_pylist(), t["staging_shard"].to_pylist()
            k_part = [all_keys[i] for i in chosen]
            s_part = [all_shards[i] for i in chosen]
            d_part = np.array([stable_uniform(seed, k) for k in k_part], dtype=np.float64)
            keys, shards, draws = _bottom_k(keys + k_part, shards + s_part, np.concatenate([draws, d_part]), size)
        order = sorted(range(len(keys)), key=lambda i: (shards[i], keys[i]))
        table = pa.table({"key": [keys[i] for i in order], "staging_shard": [shards[i] for i in order],
                          "draw": [float(draws[i]) for i in order]}, schema=SAMPLE_SCHEMA)
        sha = out.write_parquet(PROMPTS_CAPTION_SAMPLE, table)
        return {PROMPTS_CAPTION_SAMPLE: sha}, {"kept": kept, "sampled": len(keys), "manifest_digest": digest}

    return run_unit(out, PROMPTS_CAPTION_SAMPLE, fp, compute)


def sampled_keys_by_shard(out: Store) -> dict[str, list[str]]:
    t = out.read_parquet(PROMPTS_CAPTION_SAMPLE, columns=["key", "staging_shard"])
    by_shard: dict[str, list[str]] = {}
    for key, shard in zip(t["key"].to_pylist(), t["staging_shard"].to_pylist(), strict=True):
        by_shard.setdefault(shard, []).append(key)
    return by_shard


def shard_captions(corpus: Store, shard: str, keys: list[str]) -> tuple[list[str], list[str]]:
    """``(keys, captions)`` of the sampled keys of one staging shard that have a caption, in shard order."""
    found = [(key, text.strip()) for key, text in zip(*staged_captions(corpus, shard, set(keys)), strict=True)]
    return [key for key, text in found if text], [text for _, text in found if text]


def caption_embeddings_key(corpus: Store, shard: str, keys: list[str] | None, text_model: Any,
                           identity: dict[str, Any]) -> UnitKey:
    """One embedding unit's fingerprint (``keys`` None: the sample is redrawn first, only the
    code and the text model's part are known)."""
    marker = read_marker(corpus, staging_tar(shard))
    source = marker.digest if marker else corpus.sha256(staging_tar(shard))
    return unit_fingerprint("prompt-caption-embeddings", code_version(__name__),
                            _model_config(text_model, identity), [source, "?" if keys is None else sorted(keys)])


def _model_config(text_model: Any, identity: dict[str, Any]) -> dict[str, Any]:
    return {"text_model": {"identity": identity, "chunk_size": text_model.chunk_size}}


def embed_shard_captions(corpus: Store, out: Store, shard: str, keys: list[str], text_model: Any,
                         identity: dict[str, Any]) -> UnitResult:
    """One embedding unit: the sampled captions of ``shard`` (see the module docstring)."""
    fp = caption_embeddings_key(corpus, shard, keys, text_model, identity)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        found, texts = shard_captions(corpus, shard, keys)
        vectors = embed_texts(texts, text_model.name, text_model.batch_size, text_model.chunk_size)
        outputs = {caption_keys_path(shard): out.write_parquet(caption_keys_path(shard),
                                                               pa.table({"key": found}, schema=KEYS_SCHEMA))}
        outputs[caption_embeddings_path(shard)] = out.write_npy(caption_embeddings_path(shard), vectors)
        return outputs, {"sampled": len(keys), "captions": len(found), "without_caption": len(keys) - len(found)}

    return run_unit(out, caption_embeddings_path(shard), fp, compute)


def load_caption_embeddings(out: Store, shards: list[str]) -> np.ndarray:
    """Every sampled caption's embedding, shards in order (the sample is at most ``sample_size`` rows)."""
    arrays = [out.read_npy(caption_embeddings_path(s)) for s in shards]
    return np.concatenate(arrays) if arrays else np.zeros((0, 384), np.float32)


def text_list_key(texts: list[str], text_model: Any, identity: dict[str, Any]) -> UnitKey:
    """The fingerprint of a short list's embeddings (:func:`embed_text_list`)."""
    return unit_fingerprint("prompt-text-embeddings", code_version(__name__), _model_config(text_model, identity),
                            sha256_bytes(canonical_json(texts).encode()))


def embed_text_list(out: Store, name: str, texts: list[str], text_model: Any, identity: dict[str, Any]
                    ) -> np.ndarray:
    """Embeddings of a short list (the prompt set, the pool, the taxonomy) as one unit,
    reused while the texts and the model are unchanged."""
    rel = text_embeddings_path(name)
    fp = text_list_key(texts, text_model, identity)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        vectors = embed_texts(texts, text_model.name, text_model.batch_size, text_model.chunk_size)
        return {rel: out.write_npy(rel, vectors)}, {"texts": len(texts)}

    run_unit(out, rel, fp, compute)
    return out.read_npy(rel)
