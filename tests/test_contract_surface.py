"""Every stage's surface: its units (run one), ``plan_units`` (plan), ``summarise`` (summarise).

In-process and fast: imports and small objects, no build."""

from __future__ import annotations

import importlib
import inspect
import json
import typing

import pytest

from corpusforge.contract import COMPUTED, SKIPPED, Outcome, StageSummary, UnitResult, summarise
from corpusforge.plans import ACTIONS, DELETE, StagePlan, UnitPlan
from corpusforge.version import module_closure

# The stage packages' plan modules (docs/contract.md lists them)
PLAN_MODULES = ["tasks.ingest.plan", "tasks.staging.plan", "tasks.shared.features.plan", "tasks.graph.plan",
                "tasks.stats.plan", "tasks.stats.evaluate_plan", "tasks.contamination.plan", "tasks.prompts.plan"]


def test_summarise_counts_each_action_in_the_form_receipts_keep():
    results = [UnitResult("fp", {}, "d", {}, action=a) for a in (COMPUTED, SKIPPED, SKIPPED)]
    summary = summarise("ingest", results)
    assert summary == StageSummary("ingest", computed=1, skipped=2)
    # receipts and run logs keep exactly this mapping, in this key order
    assert json.dumps(summary.counts()) == '{"computed": 1, "skipped": 2}'
    assert summarise("staging", iter([])).counts() == {COMPUTED: 0, SKIPPED: 0}
    # one output's part of units that write several (each model's features of a shard) the same way
    parts = [Outcome(action=a) for a in (COMPUTED, SKIPPED, SKIPPED)]
    assert summarise("features.m", parts) == StageSummary("features.m", 1, 2)


def test_a_stage_plan_names_its_config_positions_in_its_reasons():
    plan = StagePlan("ingest", names={"[0]": "validation"})
    plan.add("part-0", COMPUTED, "config [0].min_side")
    plan.add("part-1", DELETE, "no longer in the plan")
    assert plan.units == [UnitPlan("part-0", COMPUTED, "config validation.min_side"),
                          UnitPlan("part-1", DELETE, "no longer in the plan")]
    assert plan.counts() == {ACTIONS[COMPUTED]: 1, ACTIONS[SKIPPED]: 0, "recompute if upstream output changes": 0,
                             "delete": 1}
    assert plan.changes()


@pytest.mark.parametrize("module", PLAN_MODULES)
def test_every_stage_plans_its_units_through_one_name(module):
    plan_units = importlib.import_module(module).plan_units
    assert inspect.signature(plan_units).return_annotation == "list[StagePlan]"
    assert not any(p.startswith("flows") for p in module_closure(module)), "a stage's plan never imports a flow"


def test_planning_is_outside_the_units_code_versions():
    """A change to a stage's planning leaves its units' fingerprints as they are."""
    from flows.build_corpus import BUILD_MODULES

    planned = set(PLAN_MODULES) & set(module_closure(*BUILD_MODULES))
    assert not planned


# The modules that declare units (a flow's own units included).
UNIT_MODULES = ["corpusforge.contract", "tasks.shared.features.extract", "tasks.contamination.stage", "tasks.graph.build",
                "tasks.graph.stage", "tasks.stats.evaluate", "tasks.stats.stage", "tasks.report.receipt",
                "tasks.report.changes", "tasks.report.write", "tasks.release.publish", "tasks.ingest.exact_dedup",
                "tasks.ingest.partition", "tasks.ingest.sources", "tasks.ingest.fetch.unit", "tasks.ingest.fetch.hostunits",
                "tasks.prompts.signals",
                "tasks.captions.eval_captions", "tasks.captions.stage", "tasks.staging.stage", "flows.evaluate"]
# One-off global steps: contract.run_step (keyed) returns a UnitResult whose info is the step's
# result, typed when that result is (a TypedDict, or a plain str).
STEPS = {"graph_recall", "scan_manifest_json", "write_output_list", "diff_versions", "write_reports",
         "assign_release_files",
         "input_snapshot_hash", "write_eval_captions", "plan_host_units"}
# Units that return no UnitResult, and why: none writes a marker (a partial, metrics, a plan, a probe).
NOT_A_UNIT_RESULT = {
    # partials of a reduction, held in memory: no marker
    "batch_partials": "partial", "merge_partials": "partial",
    # an evaluation's metrics, recomputed on every run from the stored features: no marker
    "evaluate_unit": "metrics",
    # planning and whole-tree probes that mark nothing
    "cut_partitions": "plan", "assign_captions": "plan", "write_generated_listing": "plan", "list_generated": "plan",
    "keep_previous_version": "probe", "sweep_temp_files": "probe",
}


def _typed_step(fn) -> bool:
    result = typing.get_type_hints(fn)["return"]
    return result is str or typing.is_typeddict(result)


def test_every_unit_returns_a_unit_result_but_the_listed_ones():
    from corpusforge.contract import Unit, run_step

    assert str(inspect.signature(run_step).return_annotation).startswith("UnitResult")
    units = {v.fn.__name__: v.fn for m in UNIT_MODULES for v in vars(importlib.import_module(m)).values()
             if isinstance(v, Unit)}
    typed = {name for name, fn in units.items() if str(inspect.signature(fn).return_annotation).startswith(
        ("UnitResult", "CaptionResult", "list[UnitResult"))}  # a group of units: one result each
    typed |= {name for name in STEPS & set(units) if _typed_step(units[name])}
    assert set(units) - typed == set(NOT_A_UNIT_RESULT), "a unit's result changed kind: update the list"
