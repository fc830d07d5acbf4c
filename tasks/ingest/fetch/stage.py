"""The fetch stage of a URL list, in three fan-outs on the engine: the host units planned (one
unit, :mod:`.hostunits`), each host unit fetched (:func:`~.unit.fetch_host_unit`), then each
input partition's fetch ledger assembled from their outcomes (:func:`~.unit.write_fetch_ledger`),
which ingest reads. The flow holds the unit count and their files' digests, nothing per URL."""

from __future__ import annotations

from typing import Any

from corpusforge.contract import FanOut, forget_step, keyed, prune, remove_tree
from corpusforge.ledger import Ledger
from corpusforge.storage import Store
from tasks.ingest.fetch.config import FetchConfig
from tasks.ingest.fetch.hostunits import PLAN_HOST_UNITS, input_cut_sha256, plan_host_units_call
from tasks.ingest.fetch.report import fetch_section
from tasks.ingest.fetch.unit import FETCH_HOST_UNIT, FETCH_LEDGER
from tasks.ingest.files import FETCH_OUTCOMES_DIR, FETCH_PLAN, FETCH_UNITS_DIR, fetch_unit_name
from tasks.ingest.licenses import LicenseConfig
from tasks.ingest.sources import Partition


def fetch_stage(store: Store, parts: list[Partition], cfg: FetchConfig, lic: LicenseConfig | None,
                fan_out: FanOut) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fetch the URL list ``parts``; the work done and the receipt's ``fetch`` section."""
    planned = fan_out(keyed(PLAN_HOST_UNITS), [plan_host_units_call(store, input_cut_sha256(store), cfg, lic)])[0]
    units = planned.info["units"]
    for folder in (FETCH_UNITS_DIR, FETCH_OUTCOMES_DIR):
        prune(store, folder, {fetch_unit_name(u) for u in range(len(units))})
    with Ledger(store, "fetch") as fetched:
        fan_out.stream(FETCH_HOST_UNIT, [dict(store=store, unit=u, sha256=sha, cfg=cfg)
                                         for u, sha in enumerate(units)], fetched.add)
    with Ledger(store, "fetch-ledger") as ledgers:
        fan_out.stream(FETCH_LEDGER, [dict(store=store, part=p, cfg=cfg, lic=lic) for p in parts], ledgers.add)
    work = {"plan": planned.action, "host_units": fetched.summary("fetch").counts(),
            "ledgers": ledgers.summary("fetch-ledger").counts()}
    return work, fetch_section(ledgers.infos())


def remove_fetch_work(store: Store) -> None:
    """The host units' files and the planning step's marker, for a build whose source is not a URL list."""
    remove_tree(store, FETCH_UNITS_DIR, FETCH_OUTCOMES_DIR)
    store.remove(FETCH_PLAN)
    forget_step(store, PLAN_HOST_UNITS.name)
