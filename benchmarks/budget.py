"""Which method for a budget: each method's CIFAR-10 recipe trained for the same minutes of wall-clock, one machine.

The rules, the same for every method (each row records its command, schedule, paces and machine):

- **Recipe**: ``configs/<method>_cifar.yaml`` with its hyperparameters as they are (this round tunes none), the
  encoder a ResNet-18 with the CIFAR stem at ``--width`` (0.25: the fast SimCLR recipe's width, the most kNN per
  minute at 30 minutes, docs/lab/time-to-accuracy.md).
- **Progressive resolution** where the method's views take it: views at 16 px growing to 32 by three quarters of
  the steps (``augment.min_size=16``, the fast recipe's ramp). A method whose views it cannot take (the plan says
  so in one line: multi-crop's local crops below what the encoder takes) trains at 32 px throughout.
- **The schedule cut by the budget**: two pilots of ``--pilot-s`` seconds, views at 16 px and at 32 px, measure
  the seconds a step takes at each side (between the pilot's first and last snapshot, so start-up is not in it);
  a step at side s is taken to cost a + b s^2 between them. ``train.epochs`` is 1.3 x the epochs the budget holds
  over the ramp (the fast recipe's rule: the cosine schedule runs past the budget, which cuts it at about 80 % of
  its steps), and the recipe's warm-up shrinks by the factor its epochs did.
- **Validation for every choice**: ``--validation`` training images (5,000) are held out of every run
  (``data.validation``, the same images in every run), and each snapshot is scored by kNN on them
  (benchmarks/time_to_accuracy.py, which trains each run: the clock counts the training loop alone).
- **The test split once**: the last snapshot within the budget, scored on CIFAR-10's test split with kNN (k=200)
  and a linear probe (``kontrast eval``), with nothing chosen on it.

    .venv/bin/python benchmarks/budget.py --data ../shared/data/cifar10-jpeg.tar.gz --methods simclr,byol --seeds 0
    .venv/bin/python benchmarks/budget.py --report [--plot docs/figures/budget.png]

Rows, one set per kind of CPU (``cpu_kind``: ``avx2``, ``avx512-bf16``, ``amx``, ...; a step's pace and so each
method's schedule differ several-fold between kinds, so a table mixes none): the pilots' paces in
``WORK/paces.jsonl`` (default ``runs/budget/KIND``; a method's pilots are reused), each run's validation curve in
``--out`` (default ``benchmarks/results/budget_KIND.jsonl``: time_to_accuracy.py's rows, label = method), its test
scores in ``--test-out`` (``budget_test_KIND.jsonl``). A rerun skips a method and seed already in ``--test-out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch
import yaml

from kontrast.augment.spec import side_schedule
from kontrast.precision import cpu_flags, native_bf16

ROOT = Path(__file__).resolve().parents[1]
TTA = ROOT / "benchmarks/time_to_accuracy.py"
METHODS = ("simclr", "moco_v2", "byol", "swav", "dino", "barlow_twins", "vicreg", "dcl", "mmcr", "lejepa", "supcon",
           "supervised")
LOW, HIGH, RAMP = 16, 32, (0.0, 0.75)  # the fast recipe's progressive resolution (configs/simclr_cifar_fast.yaml)
OVERRUN = 1.3  # the schedule's length over what the budget holds (the fast recipe's rule)


def recipe(method: str) -> Path:
    return ROOT / f"configs/{method}_cifar.yaml"


def common_sets(a, method: str) -> list[str]:
    """What every run of ``method`` sets on top of its recipe: the encoder, the data, a schedule only the runs fix."""
    return [f"encoder.width={a.width}", "encoder.name=resnet18", "encoder.stem=cifar", "data.size=32",
            "train.knn_every=0", *a.set]


def ramp_refusal(a, method: str) -> str:
    """'' if ``method``'s views take the ramp; else the plan's one line saying why not."""
    from kontrast.config.load import assemble
    from kontrast.errors import UserError
    from kontrast.methods.build import resolve
    from kontrast.train.plan import plan_run

    sets = [f"data.source={a.data}", *common_sets(a, method), f"augment.min_size={LOW}"]
    try:
        plan_run(resolve(assemble(config_file=recipe(method), sets=sets, where=a.work)))
    except UserError as err:
        return str(err)
    return ""


def pilot(a, method: str, side: int) -> dict:
    """Seconds per step with the views at ``side`` px, from ``--pilot-s`` of training (time_to_accuracy.py's child,
    snapshots at a third and at the end of it; the pace between the first and the last)."""
    out = a.work / f"pilot-{method}-{side}"
    sets = common_sets(a, method)
    if side < HIGH:  # every step at the ramp's first side: the early steps of a run
        sets += [f"augment.min_size={side}", "augment.size_ramp=[1.0,1.0]"]
    cmd = [sys.executable, str(TTA), "_ours", "--recipe", str(recipe(method)), "--data", a.data, "--out", str(out),
           "--seed", "0", "--budget-s", str(a.pilot_s), "--mark-s", str(a.pilot_s / 3),
           *[flag for text in sets for flag in ("--set", text)]]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"pilot failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    snaps = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    first, last = snaps[0], snaps[-1]
    return {"side": side, "s_per_step": (last["train_s"] - first["train_s"]) / (last["step"] - first["step"]),
            "steps_per_epoch": last["steps_per_epoch"], "steps": last["step"]}


def paces(a, method: str) -> dict:
    """``method``'s pilots (read from WORK/paces.jsonl when measured before with these settings)."""
    log = a.work / "paces.jsonl"
    key = {"method": method, "width": a.width, "set": a.set, "pilot_s": a.pilot_s}
    if log.exists():
        for line in log.read_text().splitlines():
            row = json.loads(line)
            if {k: row.get(k) for k in key} == key:
                return row
    refusal = ramp_refusal(a, method)
    sides = [HIGH] if refusal else [LOW, HIGH]
    row = {**key, "ramp": not refusal, "ramp_refusal": refusal,
           "pilots": [pilot(a, method, side) for side in sides], **machine(),
           "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M+00:00")}
    with open(log, "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def step_seconds(row: dict):
    """Seconds a step takes at side s: a + b s^2 through the two pilots (the one pilot's figure without a ramp)."""
    p = {q["side"]: q["s_per_step"] for q in row["pilots"]}
    if len(p) == 1:
        return lambda side: p[HIGH]
    b = (p[HIGH] - p[LOW]) / (HIGH ** 2 - LOW ** 2)
    return lambda side: p[LOW] + b * (side ** 2 - LOW ** 2)


def schedule(row: dict, budget_s: float, recipe_epochs: float, recipe_warmup: float) -> dict:
    """``train.epochs`` (and the warm-up) for the budget: OVERRUN x the epochs that fit it, the ramp laid over them."""
    per_epoch, cost = row["pilots"][-1]["steps_per_epoch"], step_seconds(row)
    # the largest number of steps whose ramp (stretched over them) fits the budget: no step is cheaper than one at LOW
    low, high = 1, int(budget_s / cost(LOW)) + 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if run_seconds(mid, row["ramp"], cost) <= budget_s else (low, mid)
    epochs = math.ceil(OVERRUN * low / per_epoch)
    return {"epochs": epochs, "warmup_epochs": round(recipe_warmup * epochs / recipe_epochs, 3),
            "fits_epochs": round(low / per_epoch, 2)}


def run_seconds(steps: int, ramp: bool, cost) -> float:
    sides = side_schedule(steps, LOW, HIGH, RAMP) if ramp else [HIGH] * steps
    return sum(cost(side) for side in sides)


def cpu_kind() -> str:
    """The kind of CPU this machine computes as, for file names: ``amx``, ``avx512-bf16`` (native bf16 without AMX),
    else PyTorch's kernel set (``avx512``, ``avx2``, ``default``). Paces and scores differ several-fold between kinds
    (bf16 is native on the first two, 11-28x slower than fp32 on AVX2), so each kind keeps its own rows."""
    native, _ = native_bf16("cpu")
    if native:
        return "amx" if "amx_bf16" in cpu_flags() else "avx512-bf16"
    return torch.backends.cpu.get_cpu_capability().lower()


def machine() -> dict:
    """What every row records of the machine: the CPU's model name and what ``native_bf16`` says of it."""
    return {"cpu": cpu_name(), "kernels": native_bf16("cpu")[1]}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run_method(a, method: str, seed: int) -> None:
    """One method's budget run (validation curve) and its test scores."""
    row = paces(a, method)
    raw = yaml.safe_load(recipe(method).read_text())
    plan = schedule(row, a.budget_min * 60, raw["train"]["epochs"], raw.get("optim", {}).get("warmup_epochs", 0.0))
    sets = [*common_sets(a, method), f"train.epochs={plan['epochs']}", f"optim.warmup_epochs={plan['warmup_epochs']}",
            *([f"augment.min_size={LOW}"] if row["ramp"] else [])]
    cmd = [sys.executable, str(TTA), "--data", a.data, "--recipe", str(recipe(method)), "--sides", "ours",
           "--label", method, "--seeds", str(seed), "--budget-min", str(a.budget_min), "--mark-min", str(a.mark_min),
           "--validation", str(a.validation), "--work", str(a.work), "--out", str(a.out),
           *[flag for text in sets for flag in ("--set", text)]]
    print(f"{method} seed {seed}: {plan['epochs']} epochs ({plan['fits_epochs']} fit the budget), warm-up "
          f"{plan['warmup_epochs']}, {'16 -> 32 px' if row['ramp'] else '32 px'}", flush=True)
    subprocess.run(cmd, check=True)
    final = last_snapshot(a.work / f"ours-{method}-s{seed}")
    scored = subprocess.run([str(ROOT / ".venv/bin/kontrast"), "eval", "--checkpoint", str(final), "--no-clustering",
                             "--json", "--split", "test"], stdout=subprocess.PIPE, text=True, check=True)
    test = [json.loads(line) for line in scored.stdout.splitlines() if line.startswith("{")][-1]
    with open(a.test_out, "a") as f:
        f.write(json.dumps({"method": method, "seed": seed, "budget_min": a.budget_min, "width": a.width,
                            "schedule": plan, "ramp": row["ramp"], "ramp_refusal": row["ramp_refusal"],
                            "checkpoint": str(final.relative_to(ROOT)) if final.is_relative_to(ROOT) else str(final),
                            "knn_top1": test["knn_top1"], "linear_top1": test.get("linear_top1"),
                            **machine(), "threads": os.cpu_count(),
                            "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M+00:00"),
                            "command": " ".join(sys.argv)}) + "\n")
    print(f"{method} seed {seed}: test kNN {test['knn_top1']:.4f}, linear {test.get('linear_top1')}", flush=True)


def last_snapshot(run: Path) -> Path:
    """The run's last snapshot within the budget (its marks' checkpoints, the latest step)."""
    return sorted((run / "marks/checkpoints").glob("step-*"))[-1]


def report(a) -> None:
    """The table, ranked by the last validation kNN: per method its schedule, validation kNN at each mark, test kNN
    and linear (seed by seed)."""
    curves = [json.loads(line) for line in a.out.read_text().splitlines()] if a.out.exists() else []
    tests = [json.loads(line) for line in a.test_out.read_text().splitlines()] if a.test_out.exists() else []
    if not tests:
        print(f"no rows in {a.test_out} (this machine's kind of CPU: {cpu_kind()}); --out and --test-out name "
              f"another kind's files", file=sys.stderr)
    points = {(c["label"], c["seed"]): c["points"] for c in curves}  # the validation snapshots of each run
    rows = [(points.get((t["method"], t["seed"]), []), t) for t in tests]
    print("| method | schedule | validation kNN at each mark (minutes) | test kNN | test linear | seed |")
    print("|---|---|---|---|---|---|")
    for marks_t, t in sorted(rows, key=lambda r: -r[0][-1]["knn_top1"] if r[0] else 0):  # ranked on validation
        marks = ", ".join(f"{p['knn_top1']:.3f} ({p['train_s'] / 60:.1f})" for p in marks_t)
        ramp = "16 -> 32 px" if t["ramp"] else "32 px"
        linear = f"{t['linear_top1']:.4f}" if t.get("linear_top1") is not None else "-"
        print(f"| {t['method']} | {t['schedule']['epochs']} epochs ({t['schedule']['fits_epochs']} fit), {ramp} | "
              f"{marks} | {t['knn_top1']:.4f} | {linear} | {t['seed']} |")
    if a.plot:
        subprocess.run([sys.executable, str(TTA), "--report", "--out", str(a.out), "--budget-min", str(a.budget_min),
                        "--plot", str(a.plot)], check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared/data/cifar10-jpeg.tar.gz"))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--seeds", default="0")
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--budget-min", type=float, default=10.0)
    p.add_argument("--mark-min", type=float, default=5.0)
    p.add_argument("--pilot-s", type=float, default=45.0)
    p.add_argument("--validation", type=int, default=5000)
    p.add_argument("--set", action="append", default=[], help="config key=value for every run (repeatable)")
    kind = cpu_kind()  # one CPU kind's rows per file: runs of two kinds are not compared
    p.add_argument("--work", type=Path, default=ROOT / f"runs/budget/{kind}")
    p.add_argument("--out", type=Path, default=ROOT / f"benchmarks/results/budget_{kind}.jsonl")
    p.add_argument("--test-out", type=Path, default=ROOT / f"benchmarks/results/budget_test_{kind}.jsonl")
    p.add_argument("--plot", type=Path)
    p.add_argument("--report", action="store_true")
    a = p.parse_args()
    if a.report:
        return report(a)
    a.work.mkdir(parents=True, exist_ok=True)
    done = {(t["method"], t["seed"]) for t in map(json.loads, a.test_out.read_text().splitlines())} \
        if a.test_out.exists() else set()
    for seed in map(int, a.seeds.split(",")):
        for method in a.methods.split(","):
            if (method, seed) not in done:
                run_method(a, method, seed)
    report(a)


if __name__ == "__main__":
    main()
