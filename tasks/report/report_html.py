"""The run report as one self-contained HTML page (``report.html`` beside ``report.md``).

Rendered from the written receipt and a few files of the corpus (graph edges, the
collision plot, statistics sidecars): counts per status and reason, split sizes, per-shard
counts and caption mix (GPIC Fig. 8) as a chart, the similarity histogram, the
collision-model plot, a link to the calibration sheet, contamination rates when a
receipt carries them, reference-statistics provenance, and which weights (or none)
produced each number. Charts are inline PNGs (data URIs) and the page has no script and
no external resource, so it can be mailed or archived as one file. No wall-clock time
enters it: the same receipt gives the same bytes.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

import numpy as np

from corpusforge.layout import GRAPH_EDGES, RECEIPT, RUN_LOG_MD
from corpusforge.storage import Store
from tasks.shared.caption_summary import mix_by_split, share_table, word_chart_png, word_stats
from tasks.report.receipt import conflict_line, stats_deviations
from tasks.shared.provenance import NOT_RECORDED, RANDOM_INIT_LABEL, weights_label

SECTIONS = ["summary", "outcomes", "splits", "shards", "captions", "features", "near-duplicates", "contamination",
            "reference-statistics", "provenance"]
CALIBRATION_PAGE = "graph/calibration/index.html"
COLLISION_PLOT = "graph/collision/plot.png"
HIST_BINS = np.linspace(0.9, 1.0, 41)

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.warn{background:#fff3cd;border:1px solid #e0b84c;padding:.6em 1em;font-weight:600}
.random{color:#b00020;font-weight:700}img.chart{max-width:100%;height:auto;display:block;margin:.6em 0}
nav a{margin-right:1em}code{background:#f4f4f4;padding:0 .25em}
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _table(header: list[str], rows: list[list[Any]], raw: bool = False) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c if raw else _esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None}, bbox_inches="tight", dpi=100)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(uri: str, alt: str, name: str) -> str:
    return f'<img class="chart" id="chart-{name}" src="{uri}" alt="{_esc(alt)}">'


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _outcomes_chart(by_status: dict[str, int]) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.45 * max(2, len(by_status)) + 0.6))
    names = list(by_status)
    ax.barh(names, [by_status[n] for n in names], color="#4c78a8")
    for i, n in enumerate(names):
        ax.text(by_status[n], i, f" {by_status[n]}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("records")
    return _png(fig)


def _shards_chart(shards: dict[str, Any], types: list[str]) -> str:
    """Samples per release shard, stacked by caption type (GPIC Fig. 8)."""
    plt = _plt()
    names = list(shards)
    fig, ax = plt.subplots(figsize=(min(14, 2 + 0.35 * len(names)), 3.6))
    bottom = np.zeros(len(names))
    for t in types:
        values = np.array([shards[n]["caption_type"].get(t, 0) for n in names], dtype=float)
        ax.bar(range(len(names)), values, bottom=bottom, label=t)
        bottom += values
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=90, fontsize=7)
    ax.set_ylabel("samples")
    if types:
        ax.legend(fontsize=8, title="caption type", title_fontsize=8)
    return _png(fig)


def _similarity_hist(store: Store) -> tuple[str, int] | None:
    """Histogram of graph edge similarities, streamed file by file (only one column read)."""
    names = [n for n in store.listdir(GRAPH_EDGES) if n.endswith(".parquet") and not n.startswith(".")]
    if not names:
        return None
    counts = np.zeros(len(HIST_BINS) - 1, dtype=np.int64)
    for name in names:
        s = store.read_parquet(f"{GRAPH_EDGES}/{name}", columns=["similarity"])["similarity"].to_numpy()
        counts += np.histogram(np.clip(s, HIST_BINS[0], HIST_BINS[-1]), HIST_BINS)[0]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.stairs(counts, HIST_BINS, fill=True, alpha=0.7, color="#4c78a8")
    ax.set_yscale("symlog")
    ax.set_xlabel("similarity of graph edges")
    ax.set_ylabel("pairs")
    return _png(fig), int(counts.sum())


def _weights(fp: dict[str, Any]) -> str:
    """The weights label of a model identity (tasks/shared/provenance.py), random init in red."""
    label = weights_label(fp)
    return f'<span class="random">{_esc(label)}</span>' if label == RANDOM_INIT_LABEL else _esc(label)


def _features(features: dict[str, Any]) -> str:
    if not features:
        return "<p>No feature models ran.</p>"
    rows = [[_esc(m), _esc(t["dim"]), _esc(t["ok"]), _esc(t["errors"]),
             _weights({**(t.get("fingerprint") or {}), "random_init": t["random_init"]})]
            for m, t in features["models"].items()]
    declared = {m: d for m, t in features["models"].items()
                if (d := (t.get("fingerprint") or {}).get("protocol_deviation"))}
    notes = [f"<p><b>Protocol deviation</b> (<code>{_esc(m)}</code>): {_esc(d)}.</p>" for m, d in declared.items()]
    return _table(["model", "dim", "images", "errors", "weights"], rows, raw=True) + "".join(notes)


def _near(near: dict[str, Any], store: Store, receipt: dict[str, Any]) -> str:
    if not near:
        return "<p>Near-duplicate removal did not run (<code>near_dedup: null</code>).</p>"
    d, plan = near["decisions"], near["index"]["plan"]
    out = [f"<p>Model <code>{_esc(near['model_id'])}</code> (weights: "
           f"{_weights(((receipt.get('features') or {}).get('models') or {}).get(near['model_id'], {}).get('fingerprint') or {})}"
           f"), index {_esc(plan['factory'])} over {_esc(near['index']['vectors'])} vectors, "
           f"{_esc(near['graph']['edges'])} edges &ge; {_esc(near['graph']['threshold'])}, graph recall vs exact "
           f"search {_esc(near['recall'].get('recall'))}. Removed {_esc(d['removed'])} of {_esc(d['images'])}: "
           + ", ".join(f"{_esc(n)} by <code>{_esc(r)}</code>" for r, n in d["removed_by_rule"].items()) + ".</p>"]
    hist = _similarity_hist(store)
    out.append("<h3>Similarity histogram</h3>")
    if hist is not None:
        out.append(_img(hist[0], f"histogram of {hist[1]} graph edge similarities", "similarity"))
    else:
        out.append("<p>No graph edges.</p>")
    out.append("<h3>Collision models</h3>")
    if store.exists(COLLISION_PLOT):
        uri = "data:image/png;base64," + base64.b64encode(store.read_bytes(COLLISION_PLOT)).decode("ascii")
        out.append(_img(uri, "collision models D(N) = A·N^β", "collision"))
    else:
        out.append("<p>Collision models were not fitted.</p>")
    if store.exists(CALIBRATION_PAGE):
        out.append(f'<p id="calibration-link">Calibration sheet: <a href="{CALIBRATION_PAGE}">{CALIBRATION_PAGE}</a> '
                   "(sampled pairs per similarity bin).</p>")
    return "\n".join(out)


def _contamination(receipt: dict[str, Any]) -> str:
    section = receipt.get("contamination")
    if not section:
        return "<p>Contamination rates were not measured in this run.</p>"
    rates = section.get("rates") if isinstance(section, dict) else None
    if isinstance(rates, dict) and rates:
        return _table(["measure", "rate"], [[k, v] for k, v in sorted(rates.items())])
    return f"<pre>{_esc(section)}</pre>"


def _stats(stats: dict[str, Any]) -> str:
    """The statistics table, labelled from what the receipt records of the feature model
    (its markers' identity) and of each group's deviations (the sidecars')."""
    if not stats:
        return "<p>No reference statistics in this run.</p>"
    out = [f"<p>Model <code>{_esc(stats.get('model_id'))}</code>.</p>"]
    if stats.get("warning"):
        out.append(f'<p class="warn">{_esc(stats["warning"])}</p>')
    rows = [[_esc(group), _esc(n), _weights(model := stats.get("model") or {}),
             _esc(model.get("preprocessing", NOT_RECORDED)), _esc(stats_deviations(stats, group))]
            for group, n in sorted((stats.get("n") or {}).items())]
    if rows:
        out.append(_table(["split", "images", "weights", "preprocessing", "deviations from the protocol"], rows,
                          raw=True))
    return "\n".join(out)


def _licenses(licenses: dict[str, Any]) -> str:
    if not licenses:
        return ""
    allow = ", ".join(licenses["allow"]) if licenses.get("allow") else "off (every licence accepted)"
    conflicts = conflict_line(licenses).replace("`", "")
    return (f"<h3>Licences</h3><p>Allow-list: {_esc(allow)}.</p><p id=\"license-conflicts\">{_esc(conflicts)}</p>"
            + _table(["licence family (input records)", "records"],
                     [[f, n] for f, n in (licenses.get("input_by_family") or {}).items()]))


def _captions(receipt: dict[str, Any], types: list[str]) -> str:
    """Word counts per caption type (GPIC Fig. 2), the realised mix per split, the eval caption set."""
    cap, out = receipt.get("captioning"), []
    if not cap:
        out.append("<p>Captions come from the input (captioning off).</p>")
    else:
        out.append(f"<p>Model <code>{_esc(cap['model'])}</code>; {_esc(cap['records'])} records: "
                   + _esc(", ".join(f"{n} {s}" for s, n in cap["by_status"].items())) + ".</p>")
        if cap["unfinished_requests"]:
            out.append(f'<p class="warn">{_esc(cap["unfinished_requests"])} requests gave up on transient errors: '
                       "rerun to ask them again.</p>")
        stats = word_stats(cap["words"])
        if stats:
            out.append(_img(_png(word_chart_png(cap["words"])), "words per caption by caption type", "words"))
            out.append(_table(["caption type", "captions", "mean words", "p10", "median", "p90", "max"],
                              [[t, s["captions"], s["mean"], s["p10"], s["median"], s["p90"], s["max"]]
                               for t, s in stats.items()]))
        mix = mix_by_split(receipt["release"]["shards"])
        if mix:
            out.append("<h3>Caption-type mix per split</h3>" + _table(["split", "samples", *types],
                                                                      share_table(mix, types)))
    ev = receipt.get("eval_captions")
    if ev:
        out.append(f"<p>Evaluation caption set <code>{_esc(ev['path'])}</code>: {_esc(ev['captions'])} test "
                   f"captions, SHA-256 <code>{_esc(ev['sha256'])}</code>.</p>")
    return "".join(out)


def render_html_report(receipt: dict[str, Any], store: Store) -> str:
    """The page for ``receipt`` (as written), reading charts' data from ``store``."""
    counts, release = receipt["counts"], receipt["release"]
    types = sorted({t for s in release["shards"].values() for t in s["caption_type"]})
    title = "corpusforge build report" if receipt.get("corpusforge") == "build_corpus" \
        else f"corpusforge {receipt.get('corpusforge', 'run')} report"
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_esc(title)}</title>"
             f"<style>{_STYLE}</style></head><body>", f"<h1>{_esc(title)}</h1>",
             "<nav>" + "".join(f'<a href="#{s}">{s.replace("-", " ")}</a>' for s in SECTIONS) + "</nav>"]
    for w in receipt.get("warnings", []):
        parts.append(f'<p class="warn">WARNING: {_esc(w)}</p>')
    kept = counts["by_status"].get("kept", 0)
    parts.append(f'<section id="summary"><h2>Summary</h2><p>Input records: <b>{_esc(counts["records"])}</b> '
                 f'(source <code>{_esc(receipt["source"])}</code>, {_esc(receipt["source_kind"])}); kept '
                 f'<b>{_esc(kept)}</b> in {_esc(len(release["shards"]))} release shards.</p></section>')
    parts.append('<section id="outcomes"><h2>Outcomes</h2>'
                 + _img(_outcomes_chart(counts["by_status"]), "records per status", "outcomes")
                 + _table(["status", "records"], [[s, n] for s, n in counts["by_status"].items()])
                 + "<h3>By reason</h3>"
                 + _table(["status/reason", "records"], [[r, n] for r, n in counts["by_reason"].items()])
                 + _licenses(receipt.get("licenses") or {}) + "</section>")
    tiers = release.get("tiers") or []
    parts.append('<section id="splits"><h2>Splits</h2>'
                 + _table(["split", "samples", "shards"],
                          [[s, v["samples"], v["shards"]] for s, v in release["splits"].items()])
                 + (f"<p>Tiers (prefixes of the train shards): {_esc(', '.join(f'{t} = {n} shards' for t, n in tiers))}"
                    "</p>" if tiers else "") + "</section>")
    rows = [[name, s["count"], *[f"{100 * s['caption_type'].get(t, 0) / max(1, s['count']):.1f}%" for t in types]]
            for name, s in release["shards"].items()]
    parts.append('<section id="shards"><h2>Release shards and caption mix</h2>'
                 + (_img(_shards_chart(release["shards"], types), "samples per release shard by caption type", "shards")
                    if release["shards"] else "<p>No release shards.</p>")
                 + _table(["shard", "samples", *types], rows) + "</section>")
    parts.append(f'<section id="captions"><h2>Captions</h2>{_captions(receipt, types)}</section>')
    parts.append(f'<section id="features"><h2>Features</h2>{_features(receipt.get("features") or {})}</section>')
    parts.append('<section id="near-duplicates"><h2>Near-duplicates</h2>'
                 f'{_near(receipt.get("near_duplicates") or {}, store, receipt)}</section>')
    parts.append(f'<section id="contamination"><h2>Contamination</h2>{_contamination(receipt)}</section>')
    parts.append('<section id="reference-statistics"><h2>Reference statistics</h2>'
                 f'{_stats(receipt.get("stats") or {})}</section>')
    parts.append(f'<section id="provenance"><h2>Provenance</h2><p>Code version <code>{_esc(receipt["code_version"])}'
                 f'</code>; input snapshot <code>{_esc(receipt["input_snapshot_sha256"])}</code>; full record in '
                 f'<a href="{RECEIPT}">{RECEIPT}</a> (every output file\'s SHA-256).</p>'
                 + (f'<p>Stage times of the latest run: <a href="{RUN_LOG_MD}">{RUN_LOG_MD}</a> (wall-clock seconds '
                    'differ from run to run, so they are kept out of this page, which a rerun reproduces byte for '
                    'byte).</p>' if receipt.get("corpusforge") == "build_corpus" else "") + '</section>')
    parts.append("</body></html>\n")
    return "\n".join(parts)
