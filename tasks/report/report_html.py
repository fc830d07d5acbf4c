"""The run report as one self-contained HTML page (``report.html`` beside ``report.md``).

Rendered from the written receipt and a few files of the corpus (graph edges, the collision
plot, statistics sidecars); its sections: docs/receipt.md. The numbers and charts are computed
here, the layout is the template ``corpusforge/templates/report.html``. Charts are inline PNGs
(data URIs) and the page has no script and no external resource, so it can be mailed or
archived as one file. No wall-clock time enters it: the same receipt gives the same bytes.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np

from corpusforge.html import Markup, render
from tasks.report.files import RECEIPT, RUN_LOG_MD
from tasks.graph.files import GRAPH_EDGES
from corpusforge.receipts import BUILD_FLOW
from corpusforge.storage import Store
from tasks.shared.caption_summary import mix_by_split, share_table, word_chart_png, word_stats
from tasks.report.receipt import FETCH_HOST_COLUMNS, conflict_line, stats_deviations
from tasks.shared.provenance import NOT_RECORDED, RANDOM_INIT_LABEL, weights_label

SECTIONS = ["summary", "outcomes", "splits", "shards", "captions", "features", "near-duplicates", "contamination",
            "reference-statistics", "provenance"]
CALIBRATION_PAGE = "graph/calibration/index.html"
COLLISION_PLOT = "graph/collision/plot.png"
HIST_BINS = np.linspace(0.9, 1.0, 41)


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None}, bbox_inches="tight", dpi=100)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


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
    return Markup('<span class="random">{}</span>').format(label) if label == RANDOM_INIT_LABEL else label


def _features(features: dict[str, Any]) -> dict[str, Any] | None:
    if not features:
        return None
    rows = [[m, t["dim"], t["ok"], t["errors"], _weights({**(t.get("fingerprint") or {}),
                                                           "random_init": t["random_init"]})]
            for m, t in features["models"].items()]
    declared = [(m, d) for m, t in features["models"].items()
                if (d := (t.get("fingerprint") or {}).get("protocol_deviation"))]
    return {"rows": rows, "deviations": declared}


def _near(near: dict[str, Any], store: Store, receipt: dict[str, Any]) -> dict[str, Any] | None:
    if not near:
        return None
    d, choice = near["decisions"], near["index"]["plan"]
    model_fp = ((receipt.get("features") or {}).get("models") or {}).get(near["model_id"], {}).get("fingerprint")
    hist = _similarity_hist(store)
    collision = ("data:image/png;base64," + base64.b64encode(store.read_bytes(COLLISION_PLOT)).decode("ascii")
                 if store.exists(COLLISION_PLOT) else None)
    return {"model_id": near["model_id"], "weights": _weights(model_fp or {}), "factory": choice["factory"],
            "vectors": near["index"]["vectors"], "edges": near["graph"]["edges"],
            "threshold": near["graph"]["threshold"], "recall": near["recall"].get("recall"),
            "removed": d["removed"], "images": d["images"], "removed_by_rule": list(d["removed_by_rule"].items()),
            "hist": hist[0] if hist else None,
            "hist_alt": f"histogram of {hist[1]} graph edge similarities" if hist else None,
            "collision": collision, "calibration": CALIBRATION_PAGE if store.exists(CALIBRATION_PAGE) else None}


def _contamination(receipt: dict[str, Any]) -> dict[str, Any] | None:
    section = receipt.get("contamination")
    if not section:
        return None
    rates = section.get("rates") if isinstance(section, dict) else None
    return {"rates": sorted(rates.items()) if isinstance(rates, dict) and rates else None, "raw": section}


def _stats(stats: dict[str, Any]) -> dict[str, Any] | None:
    """The statistics table, labelled from what the receipt records of the feature model
    (its markers' identity) and of each group's deviations (the sidecars')."""
    if not stats:
        return None
    model = stats.get("model") or {}
    rows = [[group, n, _weights(model), model.get("preprocessing", NOT_RECORDED), stats_deviations(stats, group)]
            for group, n in sorted((stats.get("n") or {}).items())]
    return {"model_id": stats.get("model_id"), "warning": stats.get("warning"), "rows": rows}


def _fetch(fetch: dict[str, Any]) -> dict[str, Any] | None:
    """A URL list's fetch figures: outcomes by reason, and per host (None for other sources)."""
    if not fetch:
        return None
    return {"urls": fetch["urls"], "fetched": fetch["fetched"], "pending": fetch["pending"],
            "outcomes": list(fetch["by_outcome"].items()),
            "hosts": [[h, *(f[c] for c in FETCH_HOST_COLUMNS)] for h, f in fetch["hosts"].items()]}


def _licenses(licenses: dict[str, Any]) -> dict[str, Any] | None:
    if not licenses:
        return None
    return {"allow": ", ".join(licenses["allow"]) if licenses.get("allow") else "off (every licence accepted)",
            "conflicts": conflict_line(licenses).replace("`", ""),
            "families": list((licenses.get("input_by_family") or {}).items())}


def _captions(receipt: dict[str, Any], types: list[str]) -> dict[str, Any] | None:
    """Word counts per caption type (GPIC Fig. 2) and the realised mix per split."""
    cap = receipt.get("captioning")
    if not cap:
        return None
    stats = word_stats(cap["words"])
    mix = mix_by_split(receipt["release"]["shards"])
    return {"model": cap["model"], "records": cap["records"],
            "by_status": ", ".join(f"{n} {s}" for s, n in cap["by_status"].items()),
            "unfinished": cap["unfinished_requests"],
            "words_chart": _png(word_chart_png(cap["words"])) if stats else None,
            "word_rows": [[t, s["captions"], s["mean"], s["p10"], s["median"], s["p90"], s["max"]]
                          for t, s in stats.items()],
            "mix_rows": share_table(mix, types) if mix else None}


def render_html_report(receipt: dict[str, Any], store: Store) -> str:
    """The page for ``receipt`` (as written), reading charts' data from ``store``."""
    counts, release = receipt["counts"], receipt["release"]
    types = sorted({t for s in release["shards"].values() for t in s["caption_type"]})
    title = "corpusforge build report" if receipt.get("corpusforge") == BUILD_FLOW \
        else f"corpusforge {receipt.get('corpusforge', 'run')} report"
    tiers = release.get("tiers") or []
    shard_rows = [[name, s["count"], *[f"{100 * s['caption_type'].get(t, 0) / max(1, s['count']):.1f}%"
                                       for t in types]] for name, s in release["shards"].items()]
    return render(
        "report.html", title=title, sections=SECTIONS, warnings=receipt.get("warnings", []), receipt=receipt,
        counts=counts, release=release, kept=counts["by_status"].get("kept", 0), types=types,
        outcomes_chart=_outcomes_chart(counts["by_status"]), licenses=_licenses(receipt.get("licenses") or {}),
        fetch=_fetch(receipt.get("fetch") or {}),
        splits=[[s, v["samples"], v["shards"]] for s, v in release["splits"].items()],
        tiers=", ".join(f"{t} = {n} shards" for t, n in tiers),
        shards_chart=_shards_chart(release["shards"], types) if release["shards"] else None, shard_rows=shard_rows,
        captions=_captions(receipt, types), eval_captions=receipt.get("eval_captions"),
        features=_features(receipt.get("features") or {}), near=_near(receipt.get("near_duplicates") or {}, store,
                                                                         receipt),
        contamination=_contamination(receipt), stats=_stats(receipt.get("stats") or {}), receipt_path=RECEIPT,
        run_log=RUN_LOG_MD if receipt.get("corpusforge") == BUILD_FLOW else None)
