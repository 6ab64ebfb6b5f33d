"""A short learning-rate sweep at the results table's budget: kNN top-1 for each (method, lr, seed).

Each run is the docs/results.md row's command (configs/short_budget.yaml entry, 8,000 CIFAR-10 images, 3 epochs,
batch 128, width 1/8) with ``optim.lr`` and ``train.seed`` set, scored by ``kontrast eval --no-linear
--no-clustering`` (weighted kNN on the full split). Runs go two at a time by default, one thread each (the table's
setting); a rerun skips the (method, lr, seed) already in --out.

    .venv/bin/python benchmarks/lr_sweep.py --methods dcl,dclw --lrs 0.03,0.06,0.12 --seeds 0,1 \
        --data ../shared/data/cifar10-jpeg.tar.gz
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from results import ROOT, run_timed, train_command


def one_run(method: str, lr: float, seed: int, args) -> dict:
    run_args = argparse.Namespace(**{**vars(args), "row": f"sweep_{method}_lr{lr:g}_seed{seed}",
                                     "set": [f"optim.lr={lr}", f"train.seed={seed}"], "threads": 1})
    cmd = train_command(method, run_args)
    _, wall, _ = run_timed(cmd)  # (CPU seconds of children are not per run when runs overlap)
    run_dir = cmd[cmd.index("--out") + 1]
    scores, _, _ = run_timed([str(ROOT / ".venv/bin/kontrast"), "eval", "--checkpoint", run_dir, "--json",
                              "--no-linear", "--no-clustering"])
    return {"method": method, "lr": lr, "seed": seed, "knn_top1": json.loads(scores)["knn_top1"],
            "train_wall_s": round(wall, 1),
            "command": shlex.join(["kontrast", *cmd[1:]]).replace(str(args.runs), "runs/sweep")
            .replace(str(ROOT.parent / "shared"), "../shared")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", required=True)
    p.add_argument("--lrs", required=True, help="comma list of optim.lr values (per optim.lr_batch images)")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--data", default=str(ROOT.parent / "shared/data/cifar10-jpeg.tar.gz"))
    p.add_argument("--limit", type=int, default=8000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--width", type=float, default=0.125)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--parallel", type=int, default=2, help="runs at once (one thread each)")
    p.add_argument("--runs", type=Path, default=ROOT / "runs/sweep")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/lr_sweep.jsonl")
    args = p.parse_args()
    done = {(r["method"], r["lr"], r["seed"]) for r in map(json.loads, args.out.read_text().splitlines())} \
        if args.out.exists() else set()
    todo = [(m, float(lr), int(s)) for m in args.methods.split(",") for lr in args.lrs.split(",")
            for s in args.seeds.split(",") if (m, float(lr), int(s)) not in done]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    with ThreadPoolExecutor(args.parallel) as pool:
        for row in pool.map(lambda t: one_run(*t, args), todo):
            row["commit"] = commit
            print(json.dumps(row), flush=True)
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
    rows = [json.loads(line) for line in args.out.read_text().splitlines()]
    print(f"\n{'method':8s} {'lr':>6s}  kNN top-1 per seed  mean", file=sys.stdout)
    for m in args.methods.split(","):
        for lr in sorted({r["lr"] for r in rows if r["method"] == m}):
            knn = [r["knn_top1"] for r in rows if r["method"] == m and r["lr"] == lr]
            print(f"{m:8s} {lr:6g}  {' '.join(f'{k:.4f}' for k in knn):18s}  {statistics.mean(knn):.4f}")


if __name__ == "__main__":
    main()
