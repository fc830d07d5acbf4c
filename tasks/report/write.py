"""Writing a run's receipt and the two reports rendered from it."""

from __future__ import annotations

from typing import Any

from corpusforge.layout import RECEIPT, REPORT, REPORT_HTML
from corpusforge.storage import Store
from tasks.report.receipt import render_report
from tasks.report.report_html import render_html_report


def write_receipt(store: Store, receipt: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """receipt.json, then report.md and report.html rendered from exactly what was written
    (sorted keys), so the reports do not depend on the order in which this run filled the
    dicts. Returns the receipt as written and report.md's text (a flow makes them its run's
    artifacts)."""
    store.write_json(RECEIPT, receipt)
    written = store.read_json(RECEIPT)
    report = render_report(written)
    store.write_bytes(REPORT, report.encode())
    store.write_bytes(REPORT_HTML, render_html_report(written, store).encode())
    return written, report
