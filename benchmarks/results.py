"""The docs/results.md table: every method on CIFAR-10 with the same short budget, one row each.

Each method trains through the CLI (`kontrast train`, the exact command is printed in its row) with
the settings of configs/short_budget.yaml, then `kontrast eval` scores the encoder on the full
split (weighted kNN k=200 and a linear probe on 50k/10k). Beside it: kNN of the same encoder
before training (same seed, same initialisation) and of raw pixels.

    .venv/bin/python benchmarks/results.py --data ../shared/data/cifar10-jpeg.tar.gz [--methods simclr,byol]

A row with another encoder or recipe (the ViT rows): one method, ``--row`` its name in the table, ``--set``
the config keys to change on top of the method's entry, e.g.

    .venv/bin/python benchmarks/results.py --methods moco_v3 --row "moco_v3 (vit_tiny)" \
        --set encoder.name=vit_tiny --set encoder.width=1.0 --set optim.name=adamw ...

Rows are appended to benchmarks/results/table.jsonl as they finish (a rerun skips methods already
there; --fresh starts over); the markdown table is printed at the end (--report: print it only).
Wall time depends on what else runs on the machine; CPU seconds (user + system of the training
process) much less so.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from kontrast.config import merge, parse_override
from kontrast.data import load_images
from kontrast.decisions import view_specs
from kontrast.evaluate.options import EvalOptions
from kontrast.evaluate.protocol import evaluate_encoder, evaluate_raw_pixels
from kontrast.methods import METHODS
from kontrast.methods.build import create_method, resolve

ROOT = Path(__file__).resolve().parents[1]
BUDGET = yaml.safe_load((ROOT / "configs/short_budget.yaml").read_text())


# a short_budget.yaml entry's config overlay (`test:` is the test's own)
SECTIONS = ("method", "encoder", "optim", "augment")


def overrides(entry: dict) -> list[str]:
    """`--set` flags for one short_budget.yaml entry."""
    return [flag for section in SECTIONS for key, value in entry.get(section, {}).items()
            for flag in ("--set", f"{section}.{key}={value}")]


def run_config(name: str, args):
    """The config `train_command` runs, resolved in-process (for the untrained encoder it starts from)."""
    base = {"method": {"name": name}, "encoder": {"width": args.width}, "data": {"limit": args.limit}}
    raw = merge(base, {s: BUDGET[name][s] for s in SECTIONS if s in BUDGET[name]})
    for text in args.set:  # after the entry, as on the command line
        raw = merge(raw, parse_override(text))
    return resolve(raw)


def train_command(name: str, args) -> list[str]:
    return [str(ROOT / ".venv/bin/kontrast"), "train", "--method", name, "--data", args.data,
            "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--precision", args.precision,
            "--out", str(args.runs / run_name(name, args)), "--overwrite", "--no-progress",
            "--set", f"encoder.width={args.width}", "--set", f"data.limit={args.limit}",
            "--set", f"train.num_threads={args.threads}", *overrides(BUDGET[name]),
            *[flag for text in args.set for flag in ("--set", text)]]


def run_name(name: str, args) -> str:
    """The row's run folder: the method's name, or the ``--row`` label made a folder name."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in args.row).strip("_") if args.row else name


def run_timed(cmd: list[str]) -> tuple[str, float, float]:
    """stdout, wall seconds and CPU seconds (user + system) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {shlex.join(cmd)}\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done.stdout, wall, cpu


def untrained_knn(name: str, args, splits, cache: dict) -> float:
    """kNN top-1 of the encoder the run starts from (fit seeds torch with train.seed before building it)."""
    cfg = run_config(name, args)
    torch.manual_seed(cfg.train.seed)
    method = create_method(cfg, num_samples=args.limit)
    key = tuple(round(float(p.detach().double().sum()), 6) for p in method.encoder.parameters())
    if key not in cache:
        spec = view_specs(cfg)[0]
        options = EvalOptions(precision=args.precision, linear=False, clustering=False)  # kNN alone
        cache[key] = evaluate_encoder(method.encoder, *splits, cfg.eval, options, mean=spec.mean,
                                      std=spec.std)["knn_top1"]
    return cache[key]


def markdown(rows: list[dict], raw_pixels: dict) -> str:
    out = ["| method | kNN untrained | **kNN top-1** | linear top-1 | train wall (s) | train CPU (s) | images/s |",
           "|---|---|---|---|---|---|---|",
           f"| raw pixels | – | {raw_pixels['knn_top1']:.4f} | {raw_pixels['linear_top1']:.4f} | – | – | – |"]
    for r in rows:
        out.append(f"| `{r['method']}` | {r['knn_untrained']:.4f} | **{r['knn_top1']:.4f}** | {r['linear_top1']:.4f} "
                   f"| {r['train_wall_s']:.0f} | {r['train_cpu_s']:.0f} | {r['img_per_s']:.0f} |")
    out.append("")
    out += [f"    {r['command']}" for r in rows]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared/data/cifar10-jpeg.tar.gz"))
    parser.add_argument("--methods", default=",".join(n for n in METHODS.names() if n in BUDGET))
    parser.add_argument("--limit", type=int, default=8000, help="random training images (data.limit)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--width", type=float, default=0.125)
    parser.add_argument("--precision", default="bf16", help="the training precision (the table's rows: bf16)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--row", help="the table's name for this row (one method; with --set: another encoder)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config key over the method's short-budget entry, for every run (repeatable)")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs/results")
    parser.add_argument("--table", type=Path, default=ROOT / "benchmarks/results/table.jsonl")
    parser.add_argument("--fresh", action="store_true", help="forget rows already in --table")
    parser.add_argument("--report", action="store_true", help="only print the table of the rows already measured")
    args = parser.parse_args()
    if args.row and "," in args.methods:
        parser.error("--row names one row: give one method in --methods")
    torch.set_num_threads(args.threads)
    args.table.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        args.table.unlink(missing_ok=True)
    done = {json.loads(line)["method"]: json.loads(line) for line in args.table.read_text().splitlines()} \
        if args.table.exists() else {}
    splits = load_images(args.data, "train"), load_images(args.data, "test")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    cache: dict = {}
    rows = [args.row] if args.row else args.methods.split(",")
    for name in args.methods.split(","):
        label = args.row or name
        if label in done or args.report or label == RAW:
            continue
        cmd = train_command(name, args)
        print(f"{name}: {shlex.join(cmd)}", flush=True)
        summary, wall, cpu = run_timed(cmd)
        summary = json.loads(summary.strip().splitlines()[-1])
        scores, _, _ = run_timed([str(ROOT / ".venv/bin/kontrast"), "eval",
                                  "--checkpoint", str(args.runs / run_name(name, args)), "--json", "--no-clustering"])
        scores = json.loads(scores)
        row = {"method": label, "knn_untrained": untrained_knn(name, args, splits, cache),
               "knn_top1": scores["knn_top1"], "linear_top1": scores["linear_top1"],
               **{k: scores[k] for k in ("zeroshot_top1",) if k in scores},  # CLIP: class-name prompts
               "train_wall_s": wall, "train_cpu_s": cpu, "img_per_s": summary["img_per_s"], "commit": commit,
               "command": shlex.join(["kontrast", *cmd[1:]]).replace(str(args.runs), "runs/results")
               .replace(str(ROOT.parent / "shared"), "../shared")}  # the row names no path of this machine
        print(json.dumps(row), flush=True)
        with args.table.open("a") as f:
            f.write(json.dumps(row) + "\n")
        done[label] = row
    raw_pixels = done.get(RAW) or raw_pixels_row(splits, args.table)
    print(markdown([done[n] for n in rows if n in done], raw_pixels))


RAW = "raw pixels"


def raw_pixels_row(splits, table: Path) -> dict:
    """The no-learning row, measured once and kept in the table (its linear probe on 3072-d pixels, with the
    weight decay chosen on a held-out tenth of the training labels, takes minutes)."""
    row = {"method": RAW, **evaluate_raw_pixels(*splits, resolve({}).eval)}
    with table.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


if __name__ == "__main__":
    main()
