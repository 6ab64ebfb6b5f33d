"""Command line: parse -> build a config -> call train / evaluate. No logic here.

Every user mistake ends as one line ``error: ...`` on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kontrast.errors import Interrupted, UserError


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
    p.add_argument("--nproc", type=int, default=1, help="processes on this node (torchrun; docs/distributed.md); "
                   "--batch-size stays the global batch")


def _eval_args(sub) -> None:
    p = sub.add_parser("eval", help="kNN and linear-probe top-1 of a run's encoder")
    p.add_argument("--checkpoint", required=True, help="run directory or one checkpoint folder")
    p.add_argument("--data", help="labelled source to evaluate on (default: the run's training source)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-linear", action="store_true", help="kNN only")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _csv(kind):
    def parse(text: str) -> tuple:
        return tuple(kind(item) for item in text.split(",") if item)

    return parse


def _theory_args(sub) -> None:
    p = sub.add_parser("theory", help="check contrastive-learning theory on worlds where the truth is known")
    which = p.add_subparsers(dest="experiment", required=True, parser_class=_Parser)
    s = which.add_parser("spectral", help="contrastive learning vs spectral clustering of a known augmentation graph")
    s.add_argument("--out", default="runs/theory", help="folder for spectral.json and spectral.png")
    for name, kind in (("n", int), ("k", int), ("steps", int), ("batch", int), ("seeds", int), ("seed", int),
                       ("eval-every", int), ("lr", float), ("mlp-lr", float), ("tau", float), ("gamma", float),
                       ("bandwidth", float)):
        s.add_argument(f"--{name}", type=kind)
    s.add_argument("--losses", type=_csv(str), help="comma list of: spectral,infonce,laplacian,gamma,mixture")
    s.add_argument("--encoders", type=_csv(str), help="comma list of: table,mlp")
    m = which.add_parser("mi", help="InfoNCE's bound log N - L on pairs with known mutual information")
    m.add_argument("--out", default="runs/theory", help="folder for mi.json and mi.png")
    for name, kind in (("dim", int), ("rho", float), ("steps", int), ("pairs", int), ("eval-pairs", int),
                       ("seed", int)):
        m.add_argument(f"--{name}", type=kind)
    m.add_argument("--ns", type=_csv(int), help="comma list of N, e.g. 2,8,64,512")


def _diagnose_args(sub) -> None:
    p = sub.add_parser("diagnose", help="alignment, uniformity, collapse and graph spectrum of a run's encoder")
    p.add_argument("--checkpoint", required=True, help="run directory or one checkpoint folder")
    p.add_argument("--data", help="images to embed (default: the run's training source)")
    p.add_argument("--split", choices=["train", "test"], default="test")
    p.add_argument("--limit", type=int, default=512, help="images used (a fixed random subset)")
    p.add_argument("--temperature", type=float, default=0.5, help="of the batch similarity graph")
    p.add_argument("--graph-size", type=int, default=256, help="images in the similarity graph (2 views each)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", help="folder for diagnostics.json and .png (default: RUN/diagnostics)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _bench_args(sub) -> None:
    from kontrast.bench.options import add_arguments

    p = sub.add_parser("bench", help="this machine's speed: augmentation, per-step breakdown, loss, training images/s")
    add_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kontrast", description="Contrastive self-supervised learning in five components.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _train_args(sub)
    _eval_args(sub)
    sub.add_parser("methods", help="list methods")
    c = sub.add_parser("captions", help="write a JSONL of image paths + captions made from an ImageFolder's class names")
    c.add_argument("--data", required=True, help="ImageFolder directory (class sub-folders)")
    c.add_argument("--out", required=True, help="output .jsonl (image paths relative to its folder)")
    c.add_argument("--seed", type=int, default=0, help="template choice per image")
    _theory_args(sub)
    _diagnose_args(sub)
    _bench_args(sub)
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


def _launch(nproc: int, argv: list[str]) -> int:
    """``kontrast train --nproc N``: the same command on N processes of this node, started by torchrun."""
    if "WORLD_SIZE" in os.environ:
        raise UserError("--nproc inside a torchrun launch: drop --nproc (torchrun already started the processes)")
    rest, skip = [], False
    for arg in argv:  # the command without --nproc: each process runs it under torchrun
        if skip or arg == "--nproc" or arg.startswith("--nproc="):
            skip = arg == "--nproc"
            continue
        rest.append(arg)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for several processes, without its warning
    try:  # torchrun's own launcher, in this process; each worker runs the command without --nproc
        run(get_args_parser().parse_args(["--standalone", f"--nproc-per-node={nproc}", "-m", "kontrast.cli", *rest]))
    except SignalException as exc:  # SIGTERM / SIGINT to the launcher: torchrun passed it on and waited for them
        import signal

        print(f"stopped: {signal.Signals(exc.sigval).name} to the launcher; every process checkpointed after its "
              f"step and stopped; continue with --resume", file=sys.stderr)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        rank, first = exc.get_first_failure()  # the cause; the others were stopped by torchrun after it
        if first.exitcode in (2, 130, 143):  # an input error, or a signal the run handled: the process said why
            return first.exitcode
        how = first.signal_name() if first.exitcode < 0 else f"exit code {first.exitcode}"
        print(f"error: the process of rank {rank} ended the run ({how}); torchrun stopped the others", file=sys.stderr)
        return 1
    return 0


def _run(args, argv: list[str]) -> int:
    if args.command == "methods":
        from kontrast.methods import METHODS

        for name in METHODS.names():
            print(f"{name:10s} {METHODS.get(name).description}")
        return 0
    if args.command == "train" and args.nproc != 1:
        from kontrast.train.distributed import check_world

        if args.nproc < 1:
            raise UserError(f"--nproc must be at least 1, got {args.nproc}")
        check_world(_train_config(args), args.nproc)  # bad input: one line here, before any process starts
        return _launch(args.nproc, argv)
    if args.command == "train":
        from kontrast.train.faults import Faults
        from kontrast.train.loop import fit

        summary = fit(_train_config(args), args.out, resume=args.resume, overwrite=args.overwrite,
                      progress=not args.no_progress, faults=Faults.from_env())
        if os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 speaks for the run
            print(json.dumps(summary))
        return 0
    if args.command == "eval":
        from kontrast.evaluate.run import evaluate_run

        result = evaluate_run(args.checkpoint, args.data, device=args.device, linear=not args.no_linear)
        if args.json:
            print(json.dumps(result))
        else:
            print(f"{result['method']} on {result['data']}: kNN top-1 {result['knn_top1']:.4f}"
                  + (f", linear top-1 {result['linear_top1']:.4f}" if "linear_top1" in result else "")
                  + (f", zero-shot top-1 {result['zeroshot_top1']:.4f}" if "zeroshot_top1" in result else ""))
        return 0
    if args.command == "captions":
        from kontrast.data.captions import write_captions

        info = write_captions(args.data, args.out, seed=args.seed)
        splits = ", ".join(f"{k} {info[k]}" for k in ("train", "test") if k in info)
        print(f"wrote {info['out']}: {splits} pairs, {info['classes']} classes; captions are class names in "
              f"{info['templates']} templates (the text is the label)")
        return 0
    if args.command == "theory":
        from kontrast.theory import run_experiment

        run_experiment(args.experiment, vars(args))
        return 0
    if args.command == "diagnose":
        from kontrast.evaluate.diagnostics import diagnose_run

        result = diagnose_run(args.checkpoint, args.data, split=args.split, limit=args.limit,
                              temperature=args.temperature, graph_size=args.graph_size, seed=args.seed,
                              device=args.device, out=args.out, log=(lambda _: None) if args.json else print)
        if args.json:
            print(json.dumps(result))
        return 0
    if args.command == "bench":
        from kontrast.bench import main_json, run_bench
        from kontrast.bench.options import from_args

        opts = from_args(args)
        main_json(opts) if args.json else run_bench(opts)
        return 0
    if args.command == "demo":
        from kontrast.demo import run_demo

        run_demo(args.out, epochs=args.epochs, progress=not args.no_progress)
        return 0
    raise AssertionError(args.command)


def main(argv: list[str] | None = None) -> int:
    try:
        argv = sys.argv[1:] if argv is None else argv
        return _run(build_parser().parse_args(argv), argv)
    except UserError as exc:
        rank = os.environ.get("RANK", "0")  # under torchrun: say which process speaks when it is not rank 0
        print(f"error: {exc}" if rank == "0" else f"error: rank {rank}: {exc}", file=sys.stderr, flush=True)
        return 2
    except Interrupted as exc:  # SIGTERM / SIGINT during training: checkpoint written, then 143 / 130
        if os.environ.get("RANK", "0") == "0" or exc.exit_code not in (130, 143):  # a signal: rank 0 speaks for all
            print(f"stopped: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
