"""Writing a run's receipt and the two reports rendered from it."""

from __future__ import annotations

import json
from typing import Any

from corpusforge.contract import FanOut, Unit, in_process, keyed, read_pinned, step_call
from corpusforge.hashing import canonical_json
from tasks.report.files import RECEIPT, REPORT, REPORT_HTML
from corpusforge.storage import Store
from tasks.report.receipt import render_report
from tasks.report.report_html import render_html_report


def write_reports(store: Store, receipt_sha256: str) -> str:
    """report.md and report.html rendered from ``receipt.json`` as written (refused unless its
    SHA-256 is ``receipt_sha256``); returns report.md's text. A unit: the HTML report reads
    every graph edge file, so it runs on the cluster."""
    written = json.loads(read_pinned(store, RECEIPT, receipt_sha256, "the reports"))
    report = render_report(written)
    store.write_bytes(REPORT, report.encode())
    store.write_bytes(REPORT_HTML, render_html_report(written, store).encode())
    return report


WRITE_REPORTS = Unit(write_reports, "write-reports")


def write_receipt(store: Store, receipt: dict[str, Any], *, fan_out: FanOut = in_process
                  ) -> tuple[dict[str, Any], str]:
    """receipt.json, then report.md and report.html rendered from exactly what was written
    (sorted keys), so the reports do not depend on the order in which this run filled the
    dicts. Returns the receipt as written and report.md's text (a flow makes them its run's
    artifacts)."""
    sha = store.write_json(RECEIPT, receipt)
    written = json.loads(canonical_json(receipt))
    # keyed by the receipt (which names every output's digest, the edge files the HTML reads too)
    return written, fan_out(keyed(WRITE_REPORTS), [step_call(store, WRITE_REPORTS, None, sha,
                                                             dict(store=store, receipt_sha256=sha),
                                                             (REPORT, REPORT_HTML))])[0].info
