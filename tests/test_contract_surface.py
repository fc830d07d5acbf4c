"""Every stage's surface: its units (run one), ``plan_units`` (plan), ``summarise`` (summarise).

In-process and fast: imports and small objects, no build."""

from __future__ import annotations

import importlib
import inspect
import json

import pytest

from corpusforge.contract import COMPUTED, SKIPPED, StageSummary, UnitResult, count_actions, summarise
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
    # a stage whose units report their own dicts counts their actions the same way
    assert count_actions("graph.queries", [COMPUTED, SKIPPED, SKIPPED]) == StageSummary("graph.queries", 1, 2)


def test_a_stage_plan_names_its_config_positions_in_its_reasons():
    plan = StagePlan("ingest", names={"[0]": "validation"})
    plan.add("part-0", COMPUTED, "config [0].min_side")
    plan.add("part-1", DELETE, "no longer in the plan")
    assert plan.units == [UnitPlan("part-0", COMPUTED, "config validation.min_side"),
                          UnitPlan("part-1", DELETE, "no longer in the plan")]
    assert plan.counts() == {ACTIONS[COMPUTED]: 1, ACTIONS[SKIPPED]: 0, "recompute if upstream output changes": 0,
                             "delete": 1}
    assert plan.known() and plan.changes()


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
