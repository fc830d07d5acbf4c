"""report.html: self-contained (inline PNG charts, no script, nothing fetched), rendered in
headless Chromium; the test fails on a broken image, a script error, a failed request or
a missing section, and keeps a screenshot in test-artifacts/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.report_html import SECTIONS, render_html_report
from tests.operate import artifacts_dir, browser, chromium_or_skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A tiny corpus built in-process (no flow run), near-duplicates and collision models on."""
    from flows.build_corpus import BuildConfig, build
    from sample_corpus import write_sample_corpus

    root = tmp_path_factory.mktemp("report")
    write_sample_corpus(str(root / "source"), n=40, seed=0)
    build(BuildConfig.model_validate({
        "source": str(root / "source"), "out": str(root / "corpus"), "input": {"partition_size": 20},
        "staging": {"shard_size": 20}, "splits": {"shard_size": 10, "val": 0.1, "test": 0.15}}))
    return root / "corpus"


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
def test_report_renders_in_chromium(corpus):
    chromium_or_skip()
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
