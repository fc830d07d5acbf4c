"""The ``corpusforge`` command line: one subcommand per flow, plus the sample corpus."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Sequence


def _build(args: argparse.Namespace) -> int:
    from flows.build_corpus import BuildConfig, run_build

    if args.config:
        config = BuildConfig.from_yaml(args.config, source=args.source, out=args.out)
    else:
        config = BuildConfig(source=args.source, out=args.out)
    result = run_build(config)
    print(json.dumps(result["counts"], indent=2))
    print(f"\nCorpus written to {config.out}:\n"
          f"  release shards  {config.out}/shards/{{train,val,test}}/\n"
          f"  manifest        {config.out}/manifest/   (pyarrow.dataset.dataset(...))\n"
          f"  receipt         {config.out}/receipt.json\n"
          f"  report          {config.out}/report.md")
    return 0


def _sample(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("skimage") is None:
        print("corpusforge sample needs scikit-image: pip install 'corpusforge[sample]'", file=sys.stderr)
        return 2
    from sample_corpus import write_sample_corpus

    summary = write_sample_corpus(args.out, n=args.n, seed=args.seed)
    print(json.dumps(summary, indent=2, sort_keys=True))
    print(f"\nSample corpus written to {args.out} (metadata.parquet, images/, ground_truth.json)")
    return 0


# Flows that run on an existing corpus: subcommand -> (module, config class, runner, help).
FLOW_COMMANDS = {
    "extract-features": ("flows.extract_features", "ExtractFeaturesConfig", "run_extract_features",
                         "extract features of a built corpus's staging shards (resumable)"),
    "near-dedup": ("flows.near_dedup", "NearDedupFlowConfig", "run_near_dedup",
                   "near-duplicate pass over a built corpus, written as a new corpus version"),
    "reference-stats": ("flows.reference_stats", "ReferenceStatsConfig", "run_reference_stats",
                        "reference statistics (FD-DINOv2 mean/covariance) of a built corpus's splits"),
    "evaluate": ("flows.evaluate", "EvaluateConfig", "run_evaluate",
                 "metrics of generated images against reference statistics"),
    "contamination": ("flows.contamination", "ContaminationConfig", "run_contamination",
                      "contamination rates of an evaluation set against a built corpus, and a new benchmark edition"),
}


def _flow_command(module: str, config_class: str, runner: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        mod = importlib.import_module(module)
        config = getattr(mod, config_class).from_yaml(args.config)
        result = getattr(mod, runner)(config)
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
        return 0
    return handler


def _parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    parser = argparse.ArgumentParser(prog="corpusforge", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {}

    build = sub.add_parser("build", help="build a corpus (ingest → dedup → shards → manifest → receipt)",
                           description="Build a corpus from SRC into OUT on the Dask cluster of the config.")
    build.add_argument("--source", required=True, help="metadata table, folder of tars or images; local or s3://")
    build.add_argument("--out", required=True, help="output root; local or s3://")
    build.add_argument("--config", help="YAML file overriding the defaults (unknown keys are rejected)")
    handlers["build"] = _build

    sample = sub.add_parser("sample", help="write the deterministic sample corpus",
                            description="Write a synthetic source corpus with planted duplicates and bad records.")
    sample.add_argument("--out", required=True, help="folder to write")
    sample.add_argument("--n", type=int, default=2000, help="number of metadata rows (default 2000)")
    sample.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    handlers["sample"] = _sample

    for name, (module, config_class, runner, text) in FLOW_COMMANDS.items():
        cmd = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}. "
                             f"Config: {module.replace('.', '/')}.py:{config_class} as YAML.")
        cmd.add_argument("--config", required=True, help=f"YAML file for {config_class} (unknown keys are rejected)")
        handlers[name] = _flow_command(module, config_class, runner)
    return parser, handlers


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    parser, handlers = _parser()
    args = parser.parse_args(argv)
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
