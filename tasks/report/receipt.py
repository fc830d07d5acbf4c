"""The run receipt and the human-readable report.

``receipt.json`` makes a build reproducible and auditable (what it holds, and
``receipt_outputs.parquet`` beside it: docs/receipt.md). Output digests come from the units'
markers, which recorded them when the files were written: the receipt re-reads no output. No
wall-clock time enters either file, so a rerun of a finished build writes the same bytes.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, TypedDict

import pyarrow as pa

from corpusforge.contract import Unit, digest_of, require_markers
from corpusforge.layout import MARKERS
from tasks.ingest.files import ingest_path
from tasks.release.files import CURRENT, VERSIONS_DIR
from tasks.report.files import (CHANGES_MD, CHANGES_TABLE, RECEIPT, RECEIPT_OUTPUTS, RECEIPT_OUTPUTS_SCHEMA, REPORT,
                                REPORT_HTML)
from corpusforge.receipts import BUILD_FLOW
from tasks.report.run_log import POINTER
from corpusforge.storage import Store
from tasks.shared.caption_summary import mix_by_split, share_table, word_stats
from tasks.shared.output_hashes import output_hashes
from tasks.shared.provenance import NOT_RECORDED, RANDOM_INIT_LABEL, weights_label

_UNLISTED = ("work/", f"{VERSIONS_DIR}/")  # neither listed nor stamped (published versions: links of listed files)
_SKIP_PREFIXES = (*_UNLISTED, f"{MARKERS}/")
_SKIP_FILES = (RECEIPT, RECEIPT_OUTPUTS, REPORT, REPORT_HTML, CHANGES_MD, CHANGES_TABLE, CURRENT)  # written after it
OUTPUT_LIST_SKIPS = (*_SKIP_PREFIXES, *_SKIP_FILES)  # what the output list leaves out


def input_snapshot_hash(store: Store, n_parts: int) -> str:
    """Hash of the ingest tables (key, source path, SHA-256, size of every input record)."""
    h = hashlib.sha256()
    rels = [ingest_path(part) for part in range(n_parts)]
    for rel, marker in zip(rels, require_markers(store, rels, "ingest"), strict=True):  # read side by side
        h.update(marker.outputs[rel].encode())
    return h.hexdigest()


def output_stamp(store: Store) -> str:
    """What changes when the output list would (the key of :data:`WRITE_OUTPUT_LIST`, with the
    rest of the receipt): the path and size of every file it lists, and each marker's stamp
    (size and modification time; an object's ETag), from one walk of names and metadata, no
    bytes read. A unit that writes rewrites its marker; a file written outside the unit
    protocol (the dataset card, the graph's summary) is rewritten each run from results the
    receipt holds, so its path and size are enough.

    It runs in the flow process, so it holds one folder's listing at a time (and those of the
    folders above it), never the whole output's, and never lists ``work/``, the published
    versions or a hidden folder, none of whose files it would count."""
    h = hashlib.sha256()
    if not store.remote:
        root = store.root.rstrip("/")
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not _pruned(os.path.relpath(os.path.join(folder, d), root)))
            for name in sorted(names):
                rel = os.path.relpath(os.path.join(folder, name), root)
                if _stamped(rel):
                    st = os.stat(os.path.join(folder, name))
                    h.update(f"{rel}:{st.st_size}:{st.st_mtime_ns if rel.startswith(MARKERS) else ''}\n".encode())
        return h.hexdigest()
    for rel, info in _objects(store.fs, store.fs._strip_protocol(store.root).rstrip("/"), ""):
        if _stamped(rel):
            version = info.get("ETag") or info.get("LastModified") if rel.startswith(MARKERS) else ""
            h.update(f"{rel}:{info.get('size')}:{version}\n".encode())
    return h.hexdigest()


def _stamped(rel: str) -> bool:
    return not (rel.startswith(_UNLISTED) or rel in _SKIP_FILES or "/." in f"/{rel}")


def _pruned(rel: str) -> bool:
    """A folder none of whose files :func:`_stamped` counts."""
    return f"{rel}/".startswith(_UNLISTED) or "/." in f"/{rel}"


def _objects(fs: Any, folder: str, rel: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object under ``folder`` (relative path, details) in sorted path order, one
    ``ls`` per folder. A folder's entries are sorted by name with ``/`` after a folder's:
    all the paths under folder ``a`` start ``a/``, so they sort after ``a-b`` and ``a.b``
    and before ``a0``, exactly where a sort of every path puts them."""
    entries = sorted(((e["name"].rstrip("/").rsplit("/", 1)[-1] + ("/" if e["type"] == "directory" else ""), e)
                      for e in fs.ls(folder, detail=True) if e["name"].rstrip("/") != folder),  # not a folder marker
                     key=lambda pair: pair[0])
    for key, info in entries:
        if key.endswith("/"):
            if not _pruned(rel + key[:-1]):
                yield from _objects(fs, f"{folder}/{key[:-1]}", rel + key)
        else:
            yield rel + key, info


class OutputList(TypedDict):
    """The receipt's ``outputs`` entry (:func:`write_output_list`)."""

    list: str
    files: int
    sha256: str
    digest: str


def write_output_list(store: Store) -> OutputList:
    """Write ``receipt_outputs.parquet`` (every output file's path and SHA-256, sorted by
    path) and return the receipt's ``outputs`` entry: where the list is, how many files,
    the list file's SHA-256 and the digest of its pairs (:func:`corpusforge.contract.digest_of`)."""
    hashes = output_hashes(store, skip=OUTPUT_LIST_SKIPS, recorded=True)
    table = pa.table({"path": list(hashes), "sha256": list(hashes.values())}, schema=RECEIPT_OUTPUTS_SCHEMA)
    return {"list": RECEIPT_OUTPUTS, "files": len(hashes), "sha256": store.write_parquet(RECEIPT_OUTPUTS, table),
            "digest": digest_of(hashes)}


# Both read the whole output (every ingest marker; every file and marker): tasks on the
# cluster, not the flow process.
INPUT_SNAPSHOT = Unit(input_snapshot_hash, "input-snapshot-hash")
WRITE_OUTPUT_LIST = Unit(write_output_list, "write-output-list")


def count_outcomes(manifest_parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    by_status: Counter[str] = Counter()
    by_reason: Counter[str] = Counter()
    for part in manifest_parts:
        by_status.update(part["by_status"])
        by_reason.update(part["by_reason"])
    return {"records": sum(p["rows"] for p in manifest_parts),
            "by_status": dict(sorted(by_status.items())), "by_reason": dict(sorted(by_reason.items()))}


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_report(receipt: dict[str, Any]) -> str:
    """A short Markdown report: outcomes, splits, per-shard counts and caption mix."""
    out = ["# corpusforge build report", "", *(f"> **WARNING:** {w}" for w in receipt.get("warnings", []))]
    counts = receipt["counts"]
    out += ["", f"Input records: **{counts['records']}** (source `{receipt['source']}`, kind {receipt['source_kind']}).",
            "", "## Outcomes", "", _table(["status", "records"], [[s, n] for s, n in counts["by_status"].items()]),
            "", "### By reason", "",
            _table(["status/reason", "records"], [[r, n] for r, n in counts["by_reason"].items()])]
    out += _licenses_section(receipt.get("licenses") or {}, counts["by_reason"])
    out += fetch_lines(receipt.get("fetch") or {})
    release = receipt["release"]
    types = sorted({t for s in release["shards"].values() for t in s["caption_type"]})
    out += ["", "## Splits", "", _table(["split", "samples", "shards"],
                                          [[s, v["samples"], v["shards"]] for s, v in release["splits"].items()])]
    if release.get("tiers"):
        out += ["", "Tiers (prefixes of the train shards): " +
                ", ".join(f"{t} = {n} shards" for t, n in release["tiers"])]
    if release.get("split_rule"):
        out += ["", f"Split rule: {release['split_rule']}."]
    if images := release.get("images"):
        out += ["", f"Layout `{release.get('layout', 'default')}`; image members: rule `{images['rule']}` "
                f"(splits.image_format `{images['image_format']}`), encodings " +
                ", ".join(f"{e} = {n}" for e, n in images["encodings"].items()) + f". {release.get('loaders', '')}"]
    rows = [[name, s["count"], *[f"{100 * s['caption_type'].get(t, 0) / max(1, s['count']):.1f}%" for t in types]]
            for name, s in release["shards"].items()]
    out += ["", "## Release shards", "", _table(["shard", "samples", *types], rows)]
    out += _captions_section(receipt, types)
    out += _features_section(receipt.get("features") or {})
    out += _near_duplicates_section(receipt.get("near_duplicates") or {})
    out += _stats_section(receipt.get("stats") or {})
    out += ["", f"Code version `{receipt['code_version']}`; input snapshot `{receipt['input_snapshot_sha256'][:16]}…`."]
    if receipt.get("corpusforge") == BUILD_FLOW:
        out += ["", POINTER]
    return "\n".join(out + [""])


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _licenses_section(licenses: dict[str, Any], by_reason: dict[str, int]) -> list[str]:
    if not licenses:
        return []
    allow = ", ".join(licenses["allow"]) if licenses.get("allow") else "off (every licence accepted)"
    filtered = {r: n for r, n in by_reason.items() if r.startswith("filtered/license_")}
    out = ["", "## Licences", "", f"Allow-list: {allow}. Filtered: "
           + (", ".join(f"{n} `{r.split('/', 1)[1]}`" for r, n in filtered.items()) or "none") + ".",
           "", conflict_line(licenses), ""]
    families = licenses.get("input_by_family") or {}
    if families:
        out.append(_table(["licence family (input records)", "records"], [[f, n] for f, n in families.items()]))
    return out


FETCH_HOST_COLUMNS = ("urls", "requests", "bytes", "status_429", "seconds_waited")


def fetch_lines(fetch: dict[str, Any]) -> list[str]:
    """A URL list's fetch: outcomes by reason and the figures per host (empty for other sources)."""
    if not fetch:
        return []
    return ["", "## Fetch", "", f"URLs: {fetch['urls']}, fetched: {fetch['fetched']}, left for the next run "
            f"(deferred or failed): {fetch['pending']}.", "",
            _table(["outcome", "URLs"], [[o, n] for o, n in fetch["by_outcome"].items()]), "",
            _table(["host", *FETCH_HOST_COLUMNS], [[h, *(f[c] for c in FETCH_HOST_COLUMNS)]
                                                  for h, f in fetch["hosts"].items()])]


def conflict_line(licenses: dict[str, Any]) -> str:
    """How many input records carry a licence name and URL that disagree, and what became of them."""
    n = licenses.get("conflicts", 0)
    fate = {"filter": "filtered as `license_conflict`",
            "stricter": "judged on both statements (kept only when both are allowed)"}.get(
        licenses.get("on_conflict") or "", "not checked (licence check off)")
    return f"Name/URL conflicts: {n} input record(s); on_conflict `{licenses.get('on_conflict')}`: {fate}."


def _captions_section(receipt: dict[str, Any], types: list[str]) -> list[str]:
    """Captioning outcomes, word counts per type, the realised mix per split; the eval caption set."""
    out: list[str] = []
    cap = receipt.get("captioning")
    if cap:
        out += ["", "## Captions", "",
                f"Model `{cap['model']}` (prompts: " + ", ".join(f"{t} `{h[:12]}`" for t, h in cap["prompts"].items())
                + f"; questions: {', '.join(q['name'] for q in cap['questions']) or 'none'}). "
                f"{cap['records']} records: " + ", ".join(f"{n} {s}" for s, n in cap["by_status"].items())
                + (" (" + ", ".join(f"{n} `{r}`" for r, n in cap["by_reason"].items()) + ")" if cap["by_reason"]
                   else "") + "." + (f" **{cap['unfinished_requests']} requests gave up on transient errors: "
                                     "rerun to ask them again.**" if cap["unfinished_requests"] else ""), ""]
        stats = word_stats(cap["words"])
        if stats:
            out += [_table(["caption type", "captions", "mean words", "p10", "median", "p90", "max"],
                           [[t, s["captions"], s["mean"], s["p10"], s["median"], s["p90"], s["max"]]
                            for t, s in stats.items()]), ""]
    mix = mix_by_split(receipt["release"]["shards"])
    if cap and mix:
        out += ["Caption-type mix per split (per release shard: the table below):", "",
                _table(["split", "samples", *types], share_table(mix, types))]
    ev = receipt.get("eval_captions")
    if ev:
        out += ["", f"Evaluation caption set `{ev['path']}`: {ev['captions']} test captions (size {ev['size']}, "
                    f"seed {ev['seed']}), SHA-256 `{ev['sha256']}`."]
    return out


def _features_section(features: dict[str, Any]) -> list[str]:
    if not features:
        return []
    rows = [[m, t["dim"], t["ok"], t["errors"], _weights_md({**t["fingerprint"], "random_init": t["random_init"]})]
            for m, t in features["models"].items()]
    out = ["", "## Features", "", _table(["model", "dim", "images", "errors", "weights"], rows)]
    deviations = [(m, t["fingerprint"]["protocol_deviation"]) for m, t in features["models"].items()
                  if t["fingerprint"].get("protocol_deviation")]
    if deviations:
        out += ["", *(f"**Protocol deviation** (`{m}`): {d}." for m, d in deviations)]
    return out


def _collision_lines(c: dict[str, Any]) -> list[str]:
    """The fits with the subsets they rest on, actual removals at full size beside the
    prediction, and the reason wherever a fit or a prediction is refused."""
    notes: list[str] = []

    def cell(value: Any, note: str | None) -> str:
        if value is not None:
            return f"{value:.3g}"
        if note is None:
            return "–"
        if note not in notes:
            notes.append(note)
        return f"not given ({notes.index(note) + 1})"

    rows = []
    for t, f in c["fits"].items():
        if f["fitted"]:
            lo, hi = f["fit_sizes"]
            rows.append([t, f"{f['points']} sizes, {lo}–{hi}", _fmt(f["A"]), _fmt(f["beta"]), _fmt(f["r2"]),
                         _fmt(f.get("actual_full")), cell(f["predicted_full"], f.get("predicted_full_note")),
                         cell(f["predicted_target"], f.get("predicted_target_note"))])
        else:
            rows.append([t, cell(None, f"no fit: {f.get('reason', 'too few subsets with removals')}"), "", "", "",
                         _fmt(f.get("actual_full")), "", ""])
    whole = "counted whole" if c.get("counted_whole") else "too big to count whole here"
    head = (f"Collision models (D(N) = A·N^β on nested subsets; full corpus {c['full_size']} images, {whole}; "
            f"target {c['target_size']}):")
    out = [head, "",
           _table(["θ", "fitted on", "A", "β", "R²", "removed at full size", "predicted full", "predicted target"],
                  rows), ""]
    out += [f"({i}) {n}" for i, n in enumerate(notes, 1)]
    return out + ([""] if notes else [])


def _near_duplicates_section(near: dict[str, Any]) -> list[str]:
    if not near:
        return []
    d, choice = near["decisions"], near["index"]["plan"]
    out = ["", "## Near-duplicates", "",
           f"Model `{near['model_id']}`, index {choice['factory']} over {near['index']['vectors']} vectors, "
           f"{near['graph']['edges']} edges ≥ {near['graph']['threshold']}, graph recall vs exact search "
           f"{_fmt(near['recall'].get('recall'))}. Removed {d['removed']} of {d['images']}: "
           + ", ".join(f"{n} by `{rule}`" for rule, n in d["removed_by_rule"].items()) + ".",
           f"{d['flagged_components']} component(s) flagged by the chaining guard.", ""]
    if d.get("largest_components"):
        out += [_table(["component", "size", "weakest edge", "kept", "chained"],
                       [[c["component_id"], c["size"], _fmt(c["weakest_edge"]), c["kept_key"],
                         "yes" if c["flagged"] else "no"] for c in d["largest_components"][:10]]), ""]
    if near.get("collision"):
        out += _collision_lines(near["collision"])
    if near.get("calibration"):
        out += ["Calibration sheet: `graph/calibration/index.html`."]
    return out


def _weights_md(identity: dict[str, Any]) -> str:
    label = weights_label(identity)
    return f"**{label}**" if label == RANDOM_INIT_LABEL else label


def stats_deviations(stats: dict[str, Any], group: str) -> str:
    """A statistics group's protocol deviations as the receipt records them (the sidecar's
    list); ``none`` only when the list is recorded and empty."""
    recorded = stats.get("protocol_deviations")
    if not isinstance(recorded, dict) or group not in recorded:
        return NOT_RECORDED
    return "; ".join(recorded[group]) or "none"


def _stats_section(stats: dict[str, Any]) -> list[str]:
    """The statistics table: images, weights, preprocessing and deviations per group."""
    if not stats:
        return []
    model = stats.get("model") or {}
    rows = [[g, n, _weights_md(model), model.get("preprocessing", NOT_RECORDED), stats_deviations(stats, g)]
            for g, n in (stats.get("n") or {}).items()]
    return ["", "## Reference statistics", "", f"Model `{stats['model_id']}`.", "",
            _table(["split", "images", "weights", "preprocessing", "deviations from the protocol"], rows)]
