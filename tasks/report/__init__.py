"""What a run reports: the receipt and report.md (``receipt``), report.html (``report_html``),
the run log (``run_log``) and the changes between two corpus versions (``changes``)."""
