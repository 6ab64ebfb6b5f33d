"""Command line: parse -> build a config -> call train / evaluate. No logic here.

Every user mistake ends as one line ``error: ...`` on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kontrast.errors import UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage too by default)
        raise UserError(f"{message} (see `{self.prog} --help`)")


def _train_args(sub) -> None:
    p = sub.add_parser("train", help="pretrain an encoder")
    p.add_argument("--method", help="method name (see `kontrast methods`); default simclr")
    p.add_argument("--data", help="shapes | ImageFolder dir | .tar/.tar.gz | CIFAR folder (default: shapes)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--out", required=True, help="run directory (checkpoints, metrics, config)")
    p.add_argument("--config", help="YAML recipe (see configs/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. optim.lr=0.1")
    p.add_argument("--precision", choices=["fp32", "bf16"])
    p.add_argument("--skip-bad-images", action="store_true", help="skip unreadable images instead of refusing")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    p.add_argument("--no-progress", action="store_true")


def _eval_args(sub) -> None:
    p = sub.add_parser("eval", help="kNN and linear-probe top-1 of a run's encoder")
    p.add_argument("--checkpoint", required=True, help="run directory or one checkpoint folder")
    p.add_argument("--data", help="labelled source to evaluate on (default: the run's training source)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-linear", action="store_true", help="kNN only")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kontrast", description="Contrastive self-supervised learning in five components.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _train_args(sub)
    _eval_args(sub)
    sub.add_parser("methods", help="list methods")
    d = sub.add_parser("demo", help="pretrain on the built-in shapes data and compare with baselines")
    d.add_argument("--out", default="runs/demo")
    d.add_argument("--epochs", type=int)
    d.add_argument("--no-progress", action="store_true")
    return parser


def _train_config(args):
    from kontrast.config import load_yaml, merge, parse_override
    from kontrast.methods.build import resolve

    raw: dict = {}
    run_config = Path(args.out) / "config.yaml"
    if args.resume and run_config.is_file():
        raw = load_yaml(run_config)
    if args.config:
        raw = merge(raw, load_yaml(args.config))
    if args.method:
        saved = (raw.get("method") or {}).get("name")
        if args.resume and saved and saved != args.method:
            raise UserError(f"{args.out} was trained with --method {saved}, not {args.method}; drop --method to resume")
        if saved != args.method:
            raw["method"] = {"name": args.method}  # another method's args do not carry over
    flags = {"data": {"source": args.data, "skip_bad_images": args.skip_bad_images or None},
             "train": {"epochs": args.epochs, "batch_size": args.batch_size, "precision": args.precision}}
    for section, values in flags.items():
        raw = merge(raw, {section: {k: v for k, v in values.items() if v is not None}})
    for item in args.set:
        raw = merge(raw, parse_override(item))
    return resolve(raw)


def _run(args) -> int:
    if args.command == "methods":
        from kontrast.methods import METHODS

        for name in METHODS.names():
            print(f"{name:10s} {METHODS.get(name).description}")
        return 0
    if args.command == "train":
        from kontrast.train.loop import fit

        summary = fit(_train_config(args), args.out, resume=args.resume, overwrite=args.overwrite,
                      progress=not args.no_progress)
        print(json.dumps(summary))
        return 0
    if args.command == "eval":
        from kontrast.evaluate.run import evaluate_run

        result = evaluate_run(args.checkpoint, args.data, device=args.device, linear=not args.no_linear)
        if args.json:
            print(json.dumps(result))
        else:
            print(f"{result['method']} on {result['data']}: kNN top-1 {result['knn_top1']:.4f}"
                  + (f", linear top-1 {result['linear_top1']:.4f}" if "linear_top1" in result else ""))
        return 0
    if args.command == "demo":
        from kontrast.demo import run_demo

        run_demo(args.out, epochs=args.epochs, progress=not args.no_progress)
        return 0
    raise AssertionError(args.command)


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(build_parser().parse_args(argv))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
