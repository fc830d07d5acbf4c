"""The ``corpusforge`` command line: one subcommand per flow, plus the sample corpus."""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import NoReturn


def _build(args: argparse.Namespace) -> int:
    from flows.build_corpus import BuildConfig, run_build
    from flows.preflight import check_build, load_config
    from tasks.release.versions import ReleaseRefused
    from tasks.report.run_log import render_stage_times

    config = load_config(BuildConfig, args.config, source=args.source, out=args.out,
                         **({"previous": args.previous} if args.previous else {}))
    check_build(config)  # before any server or cluster starts; reads only
    try:
        with _output_lease(config, args.wait):
            result = run_build(config)
    except ReleaseRefused as exc:  # the build finished; its receipt says the same
        print(f"corpusforge build: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result["counts"], indent=2))
    print(f"\nCorpus written to {config.out}:\n"
          f"  published       {config.out}/current.json (readers read it first: docs/release.md)\n"
          f"  release shards  {config.out}/{result['published']['shards']}/{{train,val,test}}/\n"
          f"  manifest        {config.out}/{result['published']['manifest']}/   (pyarrow.dataset.dataset(...))\n"
          f"  receipt         {config.out}/receipt.json\n"
          f"  report          {config.out}/report.md")
    print("\n" + render_stage_times("build-corpus", result["work"].get("seconds", {})))
    return 0


def _output_lease(config, wait: bool) -> contextlib.AbstractContextManager:
    """The lease on the build's output root, taken before any server or cluster starts: another
    build holding it is one line and exit code 2, or with ``--wait`` a wait announced in one
    line. (Keys in a Prefect Secret block are read only inside the run: that run takes it.)"""
    from corpusforge.lease import holding_output
    from corpusforge.secrets import has_secret_blocks
    from corpusforge.storage import Store

    if has_secret_blocks(config.storage_options):
        return contextlib.nullcontext()

    def waiting(holder: dict) -> None:
        print(f"corpusforge build: waiting for the build holding {config.out}: host {holder.get('host')} pid "
              f"{holder.get('pid')}, started {holder.get('started')}", file=sys.stderr, flush=True)
    return holding_output(Store(config.out, config.storage_options), wait=wait, waiting=waiting)


def _plan(args: argparse.Namespace) -> int:
    """A build's plan (``--source``, ``--out``), or a flow's on a built corpus (``plan FLOW --config``)."""
    from flows.plan import render_plan
    from flows.preflight import UserError, as_user_error, check_build, load_config

    if args.flow is not None:
        if args.source or args.out or args.config:
            raise UserError(f"plan {args.flow} takes its flow's --config only (after the flow's name); "
                            "--source and --out plan a build")
        flow = flow_module(args.flow)
        config = load_config(getattr(flow, FLOW_COMMANDS[args.flow][1]), args.flow_config)
        flow.preflight(config)  # reads only
        with as_user_error():  # what the run would refuse (a shard without features, an empty split)
            data = flow.plan_run(config)
        print(json.dumps(data, indent=2, sort_keys=True) if args.flow_json or args.json else render_plan(data))
        return 0
    if not (args.source and args.out):
        raise UserError("plan needs --source and --out (a build), or a flow: plan {"
                        + ",".join(PLANNED_FLOWS) + "} --config FILE")
    from flows.build_corpus import BuildConfig, plan_run

    config = load_config(BuildConfig, args.config, source=args.source, out=args.out)
    check_build(config)
    data = plan_run(config)
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else render_plan(data))
    return 0


def _diff(args: argparse.Namespace) -> int:
    from corpusforge.storage import Store
    from flows.preflight import check_corpus
    from tasks.report.changes import diff_versions

    for root in (args.old, args.new):
        check_corpus(root, {})
    out = Store(args.out or args.new)
    summary = diff_versions(Store(args.old), Store(args.new), out, memory_limit=args.memory_limit)
    print(json.dumps({k: summary[k] for k in ("records", "changed_fields", "release_shards", "licenses")},
                     indent=2, sort_keys=True))
    print(f"\nWritten: {out.path('CHANGES.md')}, {out.path('changes.parquet')}")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    """Self-calibration on the user's own pictures (flows/calibrate.py)."""
    from flows.calibrate import RECORD, REPORT, THRESHOLDS, CalibrateConfig, run_calibrate
    from flows.preflight import UserError, as_user_error, load_config, require_exists, require_writable_root

    config = load_config(CalibrateConfig, args.config, source=args.source, out=args.out)
    require_exists(config.source, config.storage_options, "source", "give a built corpus root or a folder of images")
    require_writable_root(config.out, config.storage_options, "--out")
    if config.out.rstrip("/") == config.source.rstrip("/"):
        raise UserError("--out must differ from --source: the report goes beside the corpus, not into it")
    with as_user_error():  # a model without weights, too few pictures
        record = run_calibrate(config)
    t = record["thresholds"]
    where = f"{config.out.rstrip('/')}/"
    if not t["fitted"]:
        print(f"corpusforge calibrate: not fitted: {t['reason']}; report: {where}{REPORT}", file=sys.stderr)
        return 1
    print(f"{record['model_id']}: {record['sample']['pictures']} pictures, closest unrelated pair "
          f"{record['closest_unrelated']:.4f}; component_link_above {t['component_link_above']:.4f}, "
          f"pair_removal_above {t['pair_removal_above']:.4f} (zero false links on the sample, margin "
          f"{record['margin']}); report {where}{REPORT}, thresholds {where}{THRESHOLDS}, record {where}{RECORD}")
    return 0


def _sample(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("skimage") is None:
        print("corpusforge sample needs scikit-image: pip install 'corpusforge[sample]'", file=sys.stderr)
        return 2
    if args.urls:
        from sample_corpus.urls import write_url_sample

        summary = write_url_sample(args.out, n=args.n, seed=args.seed)
        print(json.dumps(summary, indent=2, sort_keys=True))
        print(f"\nURL-list sample written to {args.out}. Serve it, then build it:\n"
              f"  python -m sample_corpus.http_hosts --config {args.out}/hosts.json --ready {args.out}/ready.json &\n"
              f"  corpusforge build --source {args.out}/urls.parquet --out {args.out}/corpus "
              f"--config {args.out}/build.yaml")
        return 0
    from sample_corpus import write_sample_corpus

    summary = write_sample_corpus(args.out, n=args.n, seed=args.seed)
    print(json.dumps(summary, indent=2, sort_keys=True))
    print(f"\nSample corpus written to {args.out} (metadata.parquet, images/, ground_truth.json)")
    return 0


# The flows on a built corpus that `corpusforge plan FLOW --config FILE` plans (each module's plan_run).
PLANNED_FLOWS = ("extract-features", "reference-stats", "near-dedup", "contamination", "qualify-prompts", "evaluate")

# The registry of the flows that run on an existing corpus: subcommand -> (module, config
# class, runner, help). Each module owns its config, its `preflight(config)` (read-only
# checks before anything starts) and its `plan_run(config)` (the plan, writing nothing);
# only this CLI lists them, so no flow imports another.
FLOW_COMMANDS = {
    "extract-features": ("flows.extract_features", "ExtractFeaturesConfig", "run_extract_features",
                         "extract features of a built corpus's staging shards (resumable)"),
    "near-dedup": ("flows.near_dedup", "NearDedupFlowParams", "run_near_dedup",
                   "near-duplicate pass over a built corpus, written as a new corpus version"),
    "reference-stats": ("flows.reference_stats", "ReferenceStatsFlowParams", "run_reference_stats",
                        "reference statistics (FD-DINOv2 mean/covariance) of a built corpus's splits"),
    "evaluate": ("flows.evaluate", "EvaluateConfig", "run_evaluate",
                 "metrics of generated images against reference statistics"),
    "contamination": ("flows.contamination", "ContaminationConfig", "run_contamination",
                      "contamination rates of an evaluation set against a built corpus, and a new benchmark edition"),
    "qualify-prompts": ("flows.prompt_qualification", "PromptQualificationConfig", "run_qualify_prompts",
                        "qualify a generation benchmark's prompts (density, output variance, cohort divergence), "
                        "quarantine ledger and rotation plan"),
}


def flow_module(command: str) -> ModuleType:
    """The module of the flow run by ``command`` (a key of :data:`FLOW_COMMANDS`)."""
    return importlib.import_module(FLOW_COMMANDS[command][0])


def _flow_command(module: str, config_class: str, runner: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        from flows.preflight import load_config

        mod = importlib.import_module(module)
        config = load_config(getattr(mod, config_class), args.config)
        mod.preflight(config)  # before any server or cluster starts; reads only
        result = getattr(mod, runner)(config)
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
        return 0
    return handler


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line too (exit code 2), pointing at --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    parser = _Parser(prog="corpusforge", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {}

    build = sub.add_parser("build", help="build a corpus (ingest → dedup → shards → manifest → receipt)",
                           description="Build a corpus from SRC into OUT on the Dask cluster of the config.")
    build.add_argument("--source", required=True, help="metadata table, folder of tars or images; local or s3://")
    build.add_argument("--out", required=True, help="output root; local or s3://")
    build.add_argument("--config", help="YAML file overriding the defaults (unknown keys are rejected)")
    build.add_argument("--previous", help="output root of an earlier version: CHANGES.md and changes.parquet "
                                          "describe what changed since it (default: the version OUT held)")
    build.add_argument("--wait", action="store_true", help="when another build holds OUT, wait until it ends "
                                                          "(default: exit with code 2, naming it)")
    handlers["build"] = _build

    plan = sub.add_parser(
        "plan", usage="%(prog)s --source SRC --out OUT [--config FILE] [--json]\n"
                      "       %(prog)s {" + ",".join(PLANNED_FLOWS) + "} --config FILE [--json]",
        help="what a build (or a flow on a built corpus) would skip, recompute or delete, and why, with its cost; "
             "writes nothing",
        description="Compare what a build with these arguments would compute with the markers under OUT and "
                    "print, per stage, the units it would skip, recompute or delete, each with its reason (a "
                    "changed input digest, config field or code version), and the seconds they took last time. "
                    "Writes nothing. Units reading the output of units that recompute are 'recompute if "
                    "upstream output changes': whether that output changes is known only after the run "
                    "(terraform's 'known after apply'). The stages after features are judged per stage. "
                    "`plan FLOW --config FILE` plans a flow on a built corpus instead: "
                    + ", ".join(PLANNED_FLOWS) + ".")
    plan.add_argument("--source", help="as for build (required to plan a build)")
    plan.add_argument("--out", help="as for build: the output root to compare with (required to plan a build)")
    plan.add_argument("--config", help="as for build")
    plan.add_argument("--json", action="store_true", help="the plan as JSON: every unit, its action and reason")
    flows = plan.add_subparsers(dest="flow", parser_class=_Parser, metavar="FLOW")
    for name in PLANNED_FLOWS:
        module, config_class, _, text = FLOW_COMMANDS[name]
        one = flows.add_parser(name, help=f"plan {name}: what it would skip or recompute, and why; writes nothing",
                               description=f"What `corpusforge {name}` with this config would skip or recompute, "
                                           f"and why, with its cost; writes nothing ({text}).")
        one.add_argument("--config", dest="flow_config", metavar="FILE", required=True,
                         help=f"YAML file for {config_class}, as for `corpusforge {name}`")
        one.add_argument("--json", dest="flow_json", action="store_true",
                         help="the plan as JSON: every unit, its action and reason")
    handlers["plan"] = _plan

    diff = sub.add_parser("diff", help="what changed between two corpus versions (CHANGES.md, changes.parquet)",
                          description="Compare two corpus versions (output roots): records added, removed and "
                                      "changed (fate, reason, split, shard, caption, image bytes), release shards "
                                      "rewritten, licence counts and statistics provenance. Runs out of core "
                                      "(DuckDB). Writes CHANGES.md and changes.parquet into NEW, or into --out.")
    diff.add_argument("old", help="output root of the earlier version")
    diff.add_argument("new", help="output root of the later version")
    diff.add_argument("--out", help="folder to write CHANGES.md and changes.parquet into (default: NEW)")
    diff.add_argument("--memory-limit", default="2GB", help="DuckDB's memory limit; past it, it spills to disk")
    handlers["diff"] = _diff

    calibrate = sub.add_parser(
        "calibrate", help="fit near-duplicate thresholds to your own pictures, with an HTML report",
        description="Plant standard copies (JPEG, resize, crops, rotation, border, watermark, greyscale, "
                    "screenshot, ...) on a seeded sample of SRC's pictures, embed them with the configured model "
                    "and choose the thresholds at zero false links among the sample's unrelated pairs plus a "
                    "margin. Writes OUT/calibration.json, OUT/near_dedup.yaml (paste into a build config) and "
                    "OUT/index.html (recall per transform, contact sheets). A build does the same with "
                    "near_dedup.calibrate: auto (docs/near-duplicates.md).")
    calibrate.add_argument("--source", required=True, help="a built corpus root or a folder of images; local or s3://")
    calibrate.add_argument("--out", required=True, help="folder for the record and the report; local or s3://")
    calibrate.add_argument("--config", help="YAML with near_dedup (model_id, seed) and features (the model's spec) "
                                            "sections, as in a build config; default wfd")
    handlers["calibrate"] = _calibrate

    sample = sub.add_parser("sample", help="write the deterministic sample corpus",
                            description="Write a synthetic source corpus with planted duplicates and bad records.")
    sample.add_argument("--out", required=True, help="folder to write")
    sample.add_argument("--n", type=int, default=2000, help="number of metadata rows (default 2000)")
    sample.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    sample.add_argument("--urls", action="store_true",
                        help="write a URL list served by loopback hosts instead (docs/fetch.md)")
    handlers["sample"] = _sample

    for name, (module, config_class, runner, text) in FLOW_COMMANDS.items():
        cmd = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}. "
                             f"Config: {module.replace('.', '/')}.py:{config_class} as YAML.")
        cmd.add_argument("--config", required=True, help=f"YAML file for {config_class} (unknown keys are rejected)")
        handlers[name] = _flow_command(module, config_class, runner)

    doctor = sub.add_parser("doctor", help="what this machine has: Python, torch and CUDA, FAISS, weights, "
                                           "Prefect API, Dask scheduler",
                            description="Print what this machine offers corpusforge, and whether the Prefect API "
                                        "and the Dask scheduler in use answer. Changes nothing.")
    doctor.add_argument("--config", help="a flow's YAML config: check its weights and its dask.address")
    doctor.add_argument("--scheduler", help="a Dask scheduler address to check (tcp://host:8786)")
    handlers["doctor"] = _doctor
    return parser, handlers


def _doctor(args: argparse.Namespace) -> int:
    from flows.doctor import doctor

    for name, value in doctor(args.config, args.scheduler):
        print(f"{name:<18} {value}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    parser, handlers = _parser()
    args = parser.parse_args(argv)
    log_file = os.path.join(tempfile.gettempdir(), f"corpusforge-{args.command}-"
                            f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.log")
    from corpusforge.cluster import command_logging

    settings = command_logging(log_file)  # before anything imports Prefect
    from corpusforge.lease import OutputBusy
    from flows.preflight import UserError

    keep_log = False  # the run's log stays only when a failure points to it
    try:
        return handlers[args.command](args)
    except (UserError, OutputBusy) as exc:
        print(f"corpusforge {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        keep_log = True
        line = _storage_fault(exc, "--out" if args.command == "build" else "output location")
        if line is None:
            raise
        with open(log_file, "a") as log:  # the detail: the whole chain, in the log only
            traceback.print_exception(exc, file=log)
        print(f"corpusforge {args.command}: error: {line}; details in {log_file}", file=sys.stderr)
        return 1
    finally:
        if settings is not None:  # the setting was ours: an in-process caller's later runs set their own
            os.unlink(settings)
            os.environ.pop("PREFECT_LOGGING_SETTINGS_PATH", None)
        if not keep_log:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(log_file)


# Errors of an object store that cannot be reached (botocore's, which name the request's
# URL), by class name: what a storage outage raises, however deep in a run.
_UNREACHABLE = {"EndpointConnectionError": "cannot connect", "ConnectTimeoutError": "connection timed out",
                "ReadTimeoutError": "read timed out", "ConnectionClosedError": "connection closed"}


def _storage_fault(exc: BaseException | None, where: str) -> str | None:
    """One line for a storage fault behind ``exc`` (as raised by a task or wrapped by Prefect
    or Dask) naming its cause and path, or None: a full disk (ENOSPC, EDQUOT) or an object
    store that cannot be reached."""
    from corpusforge.storage import FULL_DISK_ERRNOS

    full: list[OSError] = []
    unreachable: list[BaseException] = []
    seen: list[BaseException] = []
    while exc is not None and all(exc is not s for s in seen):
        seen.append(exc)
        if isinstance(exc, OSError) and exc.errno in FULL_DISK_ERRNOS:
            full.append(exc)
        elif type(exc).__name__ in _UNREACHABLE and getattr(exc, "kwargs", {}).get("endpoint_url"):
            unreachable.append(exc)
        exc = exc.__cause__ or exc.__context__
    if full:
        disk = ([f for f in full if f.filename] or full)[0]  # the storage layer's, which names the path
        what = "no space left on device" if disk.errno == errno.ENOSPC else "disk quota exceeded"
        return f"{what} writing {disk.filename or 'a file'}: free space there or choose another {where}"
    if unreachable:
        cause = _UNREACHABLE[type(unreachable[0]).__name__]
        endpoint, uri = _object_of(unreachable[0].kwargs["endpoint_url"])
        return f"storage unreachable ({cause} to {endpoint}) at {uri}: rerun once it answers (finished units are kept)"
    return None


def _object_of(url: str) -> tuple[str, str]:
    """(endpoint, ``s3://bucket/key``) of a request URL: path-style (``endpoint/bucket/key``,
    or a listing's ``endpoint/bucket?prefix=…``) or virtual-hosted (``bucket.s3….amazonaws.com/key``)."""
    from urllib.parse import parse_qs, unquote, urlsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    path = unquote(parts.path.lstrip("/"))
    if ".s3." in host or host.endswith(".amazonaws.com") and not host.startswith("s3."):
        path = f"{host.split('.', 1)[0]}/{path}"
    prefix = parse_qs(parts.query).get("prefix")
    if prefix:
        path = f"{path.rstrip('/')}/{prefix[0]}"
    return f"{parts.scheme}://{parts.netloc}", f"s3://{path}"


if __name__ == "__main__":
    sys.exit(main())
