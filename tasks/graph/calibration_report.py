"""The self-calibration report: the evidence for the chosen thresholds, in one HTML page.

GPIC calibrated by hand, looking at pairs per similarity bin; a self-calibration shows the
pairs its choice rests on, so a person can check it in a minute:

- the chosen thresholds, the closest unrelated pair and the margin;
- per transform, recall against the threshold (a curve per transform, and a table at the
  chosen link threshold: copies found, lowest and median copy similarity);
- contact sheets: the planted copies closest to the link threshold on either side (the
  weakest found and the strongest missed), and the unrelated pairs closest to it (the tail
  the threshold was fitted on; a pair there that *is* a copy means the sample held a
  duplicate the merge rule did not see).

Thumbnails and the plot are embedded as data URIs (the page can be mailed). Bytes are
deterministic: pairs are ordered by score then index, JPEG thumbnails and the PNG carry no
timestamps or software tags.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
from PIL import Image

from corpusforge.html import render
from tasks.graph.self_calibration import Calibration, Measured

SHEET_PAIRS = 12  # pairs per contact sheet
THUMB_PX = 160


def thumb(image: Image.Image, px: int = THUMB_PX) -> str:
    small = image.convert("RGB")
    small.thumbnail((px, px), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    small.save(buf, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def png_uri(fig: Any) -> str:
    """A matplotlib figure as a PNG data URI without a software tag (same bytes every run); closes it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None}, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _recall_png(cal: Calibration, link: float) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.linspace(0.5, 1.0, 101)
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    for name, scores in sorted(cal.copies.items()):
        s = np.asarray(scores)
        ax.plot(grid, [(s > t).mean() if s.size else 0 for t in grid], label=name, lw=1.2)
    ax.axvline(link, color="k", ls="--", lw=1, label=f"link > {link:g}")
    ax.axvline(cal.closest_unrelated, color="r", ls=":", lw=1, label=f"closest unrelated {cal.closest_unrelated:.4f}")
    ax.set_xlabel("threshold (similarity)")
    ax.set_ylabel("share of planted copies above")
    ax.legend(fontsize=7, ncol=2, loc="lower left")
    return png_uri(fig)


def _label(m: Measured, i: int, names: list[str]) -> str:
    if i < m.originals:
        return names[i]
    orig, transform, _ = m.planted[i - m.originals]
    return f"{names[orig]} · {transform}"


def _pair(m: Measured, a: int, b: int, s: float, names: list[str], link: float) -> dict[str, Any]:
    return {"a": {"thumb": thumb(m.images[a]), "label": _label(m, a, names)},
            "b": {"thumb": thumb(m.images[b]), "label": _label(m, b, names)},
            "score": s, "verdict": "links" if s > link else "does not link"}


def report_page(cal: Calibration, m: Measured, thresholds: dict[str, Any], model_id: str,
                names: list[str], verifying: bool) -> str:
    """The page (module docstring). ``names``: a label per original (its key or file name);
    ``verifying``: the stage verifies review-band pairs (said beside the recall table)."""
    link = cal.link_above
    copies = [(float(m.sims[m.originals + k, i]), m.originals + k, i) for k, (i, _, _) in enumerate(m.planted)]
    found = sorted((c for c in copies if c[0] > link), key=lambda c: (c[0], c[1]))[:SHEET_PAIRS // 2]
    missed = sorted((c for c in copies if c[0] <= link), key=lambda c: (-c[0], c[1]))[:SHEET_PAIRS // 2]
    a, b, s = m.unrelated()
    order = np.lexsort((b, a, -s))[:SHEET_PAIRS]
    da, db = np.triu_indices(m.originals, 1)
    same = m.group[da] == m.group[db]
    da, db = da[same], db[same]
    ds = m.sims[da, db]
    merged = np.lexsort((db, da, -ds))[:SHEET_PAIRS]
    sheets = [
        {"title": f"Planted copies just above the link threshold (found; the weakest {len(found)})",
         "pairs": [_pair(m, o, c, sc, names, link) for sc, c, o in found]},
        {"title": f"Planted copies at or below the link threshold (missed; the strongest {len(missed)})",
         "pairs": [_pair(m, o, c, sc, names, link) for sc, c, o in missed]},
        {"title": f"Unrelated pairs closest to the threshold (the tail it was fitted on; {len(order)} of {len(s)})",
         "pairs": [_pair(m, int(a[j]), int(b[j]), float(s[j]), names, link) for j in order]},
        {"title": f"Pictures of this corpus counted as one (duplicates it holds, left out of the tail; {len(merged)} "
                  f"of {len(ds)}): a pair here that is not a copy is a false pair the configured rule makes",
         "pairs": [_pair(m, int(da[j]), int(db[j]), float(ds[j]), names, link) for j in merged]},
    ]
    rows = []
    for name, scores in sorted(cal.copies.items()):
        arr = np.asarray(scores)
        rows.append({"name": name, "copies": len(scores), "found": int((arr > link).sum()),
                     "recall": cal.recall[name], "lowest": float(arr.min()) if arr.size else None,
                     "median": float(np.median(arr)) if arr.size else None})
    total = sum(r["copies"] for r in rows)
    return render("self_calibration.html", title=f"Self-calibration ({model_id})", model=model_id, cal=cal,
                  thresholds=thresholds, originals=m.originals, copies=total,
                  found=sum(r["found"] for r in rows), unrelated=len(s), rows=rows,
                  plot=_recall_png(cal, link), sheets=sheets, verifying=verifying)
