"""What a finished run shows on its Prefect run page: a markdown summary and a table.

The summary is the run's ``report.md`` (counts per status and reason, split sizes,
per-shard counts and caption mix, …) with where the full report lies; the table has one
row per status and reason. Outside a flow run (tests, notebooks) nothing is created.
Artifact keys are ``{flow}-summary`` and ``{flow}-outcomes`` so the UI's Artifacts page
keeps one history per flow.
"""

from __future__ import annotations

import logging
from typing import Any

from corpusforge.progress import in_flow_run

log = logging.getLogger("corpusforge")


def outcome_rows(counts: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (status, reason) with its count; statuses without reasons (kept) once."""
    rows: list[dict[str, Any]] = []
    reasons = counts.get("by_reason", {})
    for status, n in counts.get("by_status", {}).items():
        mine = {r: c for r, c in reasons.items() if r.split("/", 1)[0] == status}
        if not mine:
            rows.append({"status": status, "reason": "", "records": n})
        for reason, c in mine.items():
            rows.append({"status": status, "reason": reason.split("/", 1)[1] if "/" in reason else "",
                         "records": c})
    return rows


def publish_run_artifacts(flow: str, summary_markdown: str, counts: dict[str, Any], where: str) -> bool:
    """Create the summary and outcomes artifacts of the current flow run; False outside one."""
    if not in_flow_run():
        return False
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    try:
        create_markdown_artifact(markdown=summary_markdown + f"\n\nFull report: `{where}/report.html`; "
                                 f"receipt: `{where}/receipt.json`.\n",
                                 key=f"{flow}-summary", description=f"{flow}: outcome summary of {where}")
        create_table_artifact(table=outcome_rows(counts), key=f"{flow}-outcomes",
                              description=f"{flow}: records per status and reason")
    except Exception as exc:  # noqa: BLE001 - a run's outputs never depend on its UI extras
        log.warning("run artifacts not created: %s", exc)
        return False
    return True


def publish_plan_artifact(flow: str, plan_text: str, where: str) -> bool:
    """The plan of a ``plan_only`` run as the markdown artifact ``{flow}-plan``; False outside a run."""
    if not in_flow_run():
        return False
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(markdown=f"# Plan for {where}\n\n```text\n{plan_text}\n```\n", key=f"{flow}-plan",
                             description=f"{flow}: what a run on {where} would skip, recompute or delete")
    return True
