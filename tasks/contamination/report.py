"""The contamination report: Markdown (``report.md``) and HTML with image pairs (``report.html``).

Rendered from the receipt alone (plus image bytes for the thumbnails), so a rerun that writes
the same receipt writes the same report; worded as seed 003 words it (docs/contamination.md).
"""

from __future__ import annotations

import base64
import io
from typing import Any

from PIL import Image

from corpusforge.html import Markup, render
from corpusforge.layout import staging_index, staging_tar
from corpusforge.storage import Store

IMAGE_EXTS = ("jpg", "png", "webp", "gif", "bmp", "tif", "bin")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f} %"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join("–" if c is None else str(c) for c in row) + " |" for row in rows]
    return out


def render_markdown(receipt: dict[str, Any]) -> str:
    r = receipt["results"]
    bench = receipt.get("benchmark") or {}
    out = [f"# Contamination report: {bench.get('name', '(no evaluation set)')} against "
           f"`{receipt['corpus']['root']}`", "",
           f"> **What this shows:** {receipt['claim_boundary']}", "",
           f"Scanner `{receipt['code_version']}`; benchmark manifest SHA-256 "
           f"`{bench.get('manifest_sha256', '–')}`; corpus receipt SHA-256 "
           f"`{receipt['corpus'].get('receipt_sha256')}`.", ""]
    for w in receipt.get("warnings", []):
        out += [f"> **WARNING:** {w}", ""]
    for name, section in (("images", _images_md), ("text", _text_md), ("image_text", _judge_md),
                          ("leakage", _leakage_md)):
        if r.get(name):
            out += section(r[name])
    if receipt.get("edition"):
        out += _edition_md(receipt["edition"])
    return "\n".join(out) + "\n"


def _score_name(scan: dict[str, Any]) -> str:
    """What the similarity is: the feature model's pair rule (tasks/shared/pair_score.py)."""
    if (scan.get("pair_score") or {"name": "cosine"})["name"] == "cosine":
        return "cosine"
    return "similarity (cosine; of the layout alone when either image is colourless, so greyscale copies count)"


def _images_md(s: dict[str, Any]) -> list[str]:
    scan = s.get("scan") or {}
    recall = (scan.get("recall") or {}).get("recall_flagged")
    out = ["## Image overlap (image-only rate)", "",
           f"Overlap found for **{s['flagged']} of {s['embedded']}** embedded evaluation images: "
           f"rate **{_pct(s['rate'])}** (best {_score_name(scan)} to any training image > {s['threshold']}, model "
           f"`{s['model_id']}`{', RANDOM-INIT weights' if (s.get('feature_identity') or {}).get('random_init') else ''}"
           f"; training splits {s.get('corpus_splits') or 'all staged images'}).",
           f"{s['exact_copies']} of them are byte-identical copies of their match. "
           f"{s['image_errors']} images could not be read or embedded and {s['no_image']} items have no image; "
           f"neither is in the denominator.",
           f"Search: {scan.get('search')} over {scan.get('targets')} training images"
           + (f"; recall of flagged images on a sample: {recall}" if scan.get("search") == "ivf" else
              " (every pair compared)") + ".", "", "### Rate by threshold", ""]
    out += _table(["threshold (>)", "flagged", "embedded", "rate"],
                  [[c["threshold"], c["flagged"], c["embedded"], _pct(c["rate"])] for c in s["curve"]])
    if s.get("top_pairs"):
        out += ["", "### Highest-similarity pairs", ""]
        out += _table(["evaluation item", "training key", "similarity", "byte-identical", "flagged"],
                      [[p["item_id"], p["match_key"], f"{p['max_similarity']:.4f}", p["exact_copy"], p["flagged"]]
                       for p in s["top_pairs"][:10]])
    return out + [""]


def _text_md(s: dict[str, Any]) -> list[str]:
    d = s["decisions"]
    rec = s.get("recall") or {}
    t = s["thresholds"]
    out = ["## Text canaries", "",
           f"{s['item_texts']} item texts (fields {', '.join(s['fields'])}) against {s['corpus_texts']} corpus texts "
           f"({s['source']['kind']}). Overlap found → **slice quarantined: {d['quarantine']}**; review: "
           f"{d['review']}; retained: {d['retain']} (clean only relative to this snapshot); empty: {d['empty']}.",
           f"Rules (declared before scanning): exact bytes {t['exact']}, normalised {t['normalized']}, direct "
           f"3-shingle Jaccard >= {t['direct_jaccard']}, seeded signature >= {t['signature']} (seeds "
           f"{', '.join(map(str, s['seeds']))}); review band: Jaccard >= {t['review_direct_jaccard']}, signature >= "
           f"{t['review_signature']}.",
           f"Candidates: {s['mode']}; {s['pairs_compared']} of {s['all_pairs']} pairs compared.", ""]
    if rec.get("sampled_queries"):
        out += [f"LSH recall against comparing every pair, on {rec['sampled_queries']} sampled item texts: "
                f"**{rec['recall']}** ({rec['found']} of {rec['rule_pairs']} rule-meeting pairs proposed).", ""]
    return out


def _judge_md(s: dict[str, Any]) -> list[str]:
    j = s["judge"]
    return ["## Image–text overlap", "",
            f"Judge: `{j['judge']}` ({', '.join(f'{k}={v}' for k, v in sorted(j.items()) if k != 'judge')}).",
            f"Answer inferable from retrieved training captions: **{s['inferable']} of {s['judged']}** judged items "
            f"(rate {_pct(s['rate'])}); not inferable: {s['not_inferable']}; exposure unresolved: "
            f"**{s['unresolved']}** (not counted as clean); no answer: {s['no_answer']}; no image: "
            f"{s['no_image']}.", ""]


def _leakage_md(s: dict[str, Any]) -> list[str]:
    out = ["## Cross-split leakage", "",
           f"Held-out splits {s['held_out_splits']} of `{s['corpus']}` against training splits {s['train_splits']} "
           f"of `{s['against']}` (model `{s['model_id']}`; build thresholds {s['build_thresholds']}). A held-out image "
           f"counts when its best training match is >= the threshold.", ""]
    rows = [[r["threshold"], split, v["leaking"], v["held_out"], _pct(v["rate"])]
            for r in s["rates"] for split, v in r["splits"].items()]
    out += _table(["threshold (>=)", "split", "overlap found", "held-out images", "rate"], rows)
    return out + ["", f"{s['pairs_at_review_threshold']} pairs at or above the review threshold "
                      f"{s['review_threshold']} are listed in contamination/leakage/.", ""]


def _edition_md(e: dict[str, Any]) -> list[str]:
    d = e["denominators"]
    out = ["## New benchmark edition", "",
           f"Edition **{e['edition']}** (from {e['previous']['name']}, manifest `{e['previous']['manifest_sha256']}`): "
           f"original denominator {d['original']}, revised {d['revised']}; slice quarantined: {d['quarantined']} "
           f"(on {', '.join(e['quarantine_on'])}); review: {e['review']}. The input benchmark is unchanged; "
           f"edition/mapping.parquet maps every previous id to its new id.", "", "### Coverage lost per category", ""]
    out += _table(["category", "original", "revised", "lost", "share lost"],
                  [[c["category"], c["original"], c["revised"], c["lost"], _pct(c["lost_share"])]
                   for c in e["coverage"]])
    return out + [""]


# ---- HTML ---------------------------------------------------------------------------------
def _thumb(store: Store, shard: str, key: str, size: int = 128) -> str | None:
    """A JPEG data URI of one staged image, or None when it cannot be read."""
    try:
        index = store.read_parquet(staging_index(shard), columns=["key", "ext", "offset", "size"]).to_pylist()
        member = next(r for r in index if r["key"] == key and r["ext"] in IMAGE_EXTS)
        data = store.read_range(staging_tar(shard), member["offset"], member["size"])
        img = Image.open(io.BytesIO(data))
        img.thumbnail((size, size))
        buf = io.BytesIO()
        img.convert("RGB").save(buf, "JPEG", quality=80)
        return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
    except Exception:  # noqa: BLE001 - a missing thumbnail must not fail the report
        return None


def curve_svg(curve: list[dict[str, Any]], width: int = 480, height: int = 220) -> str:
    """The rate against the threshold as an inline SVG polyline."""
    pts = [(c["threshold"], c["rate"] or 0.0) for c in curve]
    if not pts:
        return ""
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    top = max(max(p[1] for p in pts), 1e-9)
    sx = lambda x: 40 + (width - 60) * ((x - x0) / ((x1 - x0) or 1))  # noqa: E731
    sy = lambda y: height - 30 - (height - 50) * (y / top)  # noqa: E731
    line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
            f'<rect width="100%" height="100%" fill="white"/>'
            f'<line x1="40" y1="{height - 30}" x2="{width - 20}" y2="{height - 30}" stroke="black"/>'
            f'<line x1="40" y1="20" x2="40" y2="{height - 30}" stroke="black"/>'
            f'<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{line}"/>'
            f'<text x="40" y="{height - 10}" font-size="11">{x0:.2f}</text>'
            f'<text x="{width - 50}" y="{height - 10}" font-size="11">{x1:.2f}</text>'
            f'<text x="2" y="24" font-size="11">{100 * top:.1f}%</text>'
            f'<text x="{width // 2 - 60}" y="{height - 10}" font-size="11">threshold (similarity &gt;)</text></svg>')


def render_html(receipt: dict[str, Any], markdown: str, eval_store: Store | None, corpus: Store) -> str:
    """The page (template ``corpusforge/templates/contamination.html``): the rate curve, the
    top image pairs with thumbnails, and the Markdown report verbatim."""
    images = receipt["results"].get("images") or {}
    pairs = [{"cells": [(_thumb(eval_store, p["chunk"], p["key"]), p["item_id"]),
                        (_thumb(corpus, p["match_shard"], p["match_key"]), p["match_key"])],
              "similarity": p["max_similarity"], "exact_copy": p["exact_copy"], "flagged": p["flagged"]}
             for p in (images.get("top_pairs") or [] if eval_store is not None else [])]
    return render("contamination.html", title="Contamination report", claim_boundary=receipt["claim_boundary"],
                  curve=Markup(curve_svg(images["curve"])) if images.get("curve") else None, pairs=pairs,
                  markdown=markdown)
