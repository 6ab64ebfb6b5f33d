"""Time to accuracy: kNN against training wall-clock, kontrast's recipe beside the peer's SimCLR, one sitting.

Each side trains for a wall-clock budget (default 30 minutes) on CIFAR-10 and saves its encoder at every mark
(default every 5 minutes of training) and when the budget runs out; after training, outside the budget, every
snapshot is scored by weighted kNN (k=200, tau=0.1) of the full test split against the full training split.
The sides alternate, seed by seed (ours then the peer's for seed 0, the peer's then ours for seed 1, ...), so a
drift in the machine's speed falls on both.

- **ours**: ``--recipe`` (default configs/simclr_cifar_fast.yaml) with ``--set`` on top, trained by
  ``kontrast.train.fit`` in a child process with a listener that snapshots the encoder at the marks (the clock
  is paused while it writes) and ends the run at the budget; its schedule is the recipe's ``train.epochs``.
  Scored by ``kontrast eval --no-linear --no-clustering`` (fp32 features).
- **peer**: lightly's SimCLR recipe (benchmarks/peer/lightly_timed.py, in the peer's environment from
  benchmarks/setup_peer.sh) at ``--peer-width``, ``--peer-batch``, ``--peer-precision`` and ``--peer-temperature``
  (lightly's 0.5 by default; its label names any other); its cosine schedule
  is fitted to the budget: a pilot of ``--pilot-s`` seconds measures its steady steps per second (after its first
  50 steps), and the schedule gets the steps that fill 98 % of the budget (``--peer-schedule``: another share;
  above 1 the budget cuts the schedule, as it does kontrast's recipe; its label then says so).

Both clocks count the training loop only: not the process start, the dataset's indexing or, for kontrast, the
one-time decoding of the JPEGs into its cache (the peer decodes every image at every step, inside its clock;
both whole-process times are in the rows). Rows go to ``--out`` (JSON lines: one per side and seed, with every
snapshot's time and kNN); the summary (time to the peer's final kNN, final kNN of each side) is printed, and
``--plot`` draws the curves.

    .venv/bin/python benchmarks/time_to_accuracy.py --data ../shared/data/cifar10-jpeg.tar.gz \\
        --peer-python runs/peer/venv/bin/python --peer-data runs/peer/data/cifar10 --seeds 0,1 \\
        --plot docs/figures/time_to_accuracy.png
    .venv/bin/python benchmarks/time_to_accuracy.py --report [--plot PNG]    # the summary of the rows there

On a GPU (benchmarks/gpu.sh runs this): kontrast's side alone, scored on the GPU, with the minutes it took to
reach given kNN levels (``--targets 0.85,0.9``), e.g. ``--sides ours --set train.device=cuda --eval-device cuda``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from kontrast.checkpoint import save_checkpoint
from kontrast.train.events import Listener

ROOT = Path(__file__).resolve().parents[1]
PEER_SCRIPT = ROOT / "benchmarks/peer/lightly_timed.py"


class BudgetSpent(Exception):
    """Raised by :class:`Marks` at the budget: the run ends there (its last snapshot is written)."""


class Marks(Listener):
    """A listener of kontrast's training loop: the encoder's weights as a checkpoint under ``out`` at every mark
    of training time and at the budget, the clock paused while it writes; then :class:`BudgetSpent`."""

    def __init__(self, out: Path, budget_s: float, mark_s: float):
        self.out, self.budget_s, self.mark_s = out, budget_s, mark_s

    def run_start(self, loop) -> None:
        self.start, self.paused, self.next, self.last = time.perf_counter(), 0.0, self.mark_s, -1

    def elapsed(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def snapshot(self, loop, reason: str) -> None:
        t0, train_s = time.perf_counter(), self.elapsed()
        state = {"step": loop.step, "train_s": round(train_s, 1), "reason": reason,
                 "num_samples": loop.schedule.num_samples, "steps_per_epoch": loop.schedule.steps_per_epoch}
        save_checkpoint(self.out, loop.ctx.method, loop.ctx.optimizer, state, keep=10**6)
        print(json.dumps({"side": "ours", **state, "epoch": round(loop.step / loop.schedule.steps_per_epoch, 3)}),
              flush=True)
        self.last = loop.step
        self.paused += time.perf_counter() - t0

    def step_end(self, loop, result) -> None:
        if self.elapsed() >= self.budget_s:
            self.snapshot(loop, "end: budget")
            raise BudgetSpent
        if self.elapsed() >= self.next:
            self.snapshot(loop, "mark")
            self.next = (math.floor(self.elapsed() / self.mark_s) + 1) * self.mark_s

    def run_end(self, loop) -> None:
        if loop.step == loop.schedule.total_steps and self.last != loop.step:  # the schedule ended in the budget
            self.snapshot(loop, "end: steps")


def train_ours(a) -> None:
    """The child process of one kontrast run (``_ours``): fit the recipe with the marks listener."""
    import shutil

    from kontrast.config.load import assemble
    from kontrast.methods.build import resolve
    from kontrast.train.loop import fit

    sets = [f"data.source={a.data}", f"train.seed={a.seed}", *a.set]
    cfg = resolve(assemble(config_file=a.recipe, sets=sets, where=a.out))
    run, marks = Path(a.out), Path(a.out) / "marks"
    try:
        fit(cfg, run, overwrite=True, progress=False, listeners=[Marks(marks, a.budget_s, a.mark_s)])
    except BudgetSpent:
        pass
    shutil.copy(run / "config.yaml", marks / "config.yaml")  # each snapshot reads as a checkpoint of a run


def run_child(cmd: list[str], log: Path) -> tuple[list[dict], float]:
    """Run ``cmd``; its JSON lines from stdout and its whole-process seconds (stderr to ``log``)."""
    t0 = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {shlex.join(cmd)}; see {log}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")], time.perf_counter() - t0


def ours(a, seed: int) -> dict:
    """One kontrast run: train within the budget, then kNN of every snapshot."""
    out = a.work / f"ours-{a.label}-s{seed}"
    sets = [*a.set, *([f"data.validation={a.validation}"] if a.validation else [])]
    cmd = [sys.executable, __file__, "_ours", "--recipe", str(a.recipe), "--data", a.data, "--out", str(out),
           "--seed", str(seed), "--budget-s", str(a.budget_s), "--mark-s", str(a.mark_s),
           *[flag for text in sets for flag in ("--set", text)]]
    lines, process_s = run_child(cmd, a.work / f"ours-{a.label}-s{seed}.log")
    snaps, points = [line for line in lines if line.get("side") == "ours"], []
    for snap in snaps:
        ckpt = out / "marks/checkpoints" / f"step-{snap['step']:08d}"
        evaluated, _ = run_child([str(ROOT / ".venv/bin/kontrast"), "eval", "--checkpoint", str(ckpt), "--no-linear",
                                  "--no-clustering", "--json", "--device", a.eval_device, "--split", split(a)],
                                 a.work / "eval.log")
        points.append({**snap, "knn_top1": evaluated[-1]["knn_top1"]})
    return {"side": "ours", "label": a.label, "seed": seed, "split": split(a), "points": points,
            "process_s": round(process_s, 1), "command": repo_relative(cmd)}


def repo_relative(cmd: list[str]) -> str:
    """``cmd`` as a row records it: paths inside the repository relative to its root (where the command runs)."""
    root = f"{ROOT}/"
    return shlex.join(arg.replace(root, "") for arg in cmd)


def split(a) -> str:
    """What the kNN figures score: the validation split (``--validation N``: training images never trained on, for
    choosing settings) or the test split (for the final figure, once per configuration)."""
    return "validation" if a.validation else "test"


def peer(a, seed: int) -> dict:
    """One peer run: a pilot for its seconds per step, the run with its schedule fitted to the budget, kNN."""
    if a.validation:
        sys.exit("--validation scores kontrast's runs only (the peer script has no held-out split yet): "
                 "pass --sides ours")
    longer = f" x{a.peer_schedule:g}" if a.peer_schedule != 0.98 else ""  # rows before these options: 0.98, 0.5
    label = f"lightly w{a.peer_width} b{a.peer_batch} {a.peer_precision}" + (
        f" tau{a.peer_temperature:g}" if a.peer_temperature != 0.5 else "") + longer
    out = a.work / f"peer-t{a.peer_temperature:g}{longer.strip()}-s{seed}"
    base = [a.peer_python, str(PEER_SCRIPT), "train", "--data", a.peer_data, "--seed", str(seed), "--width",
            str(a.peer_width), "--batch", str(a.peer_batch), "--temperature", str(a.peer_temperature), "--workers", "0",
            *(["--bf16", "--channels-last"] if a.peer_precision == "bf16_cl" else [])]
    log = a.work / f"{out.name}-pilot.log"
    pilot, _ = run_child([*base, "--out", str(out / "pilot"), "--steps", "100000", "--budget-s", str(a.pilot_s),
                          "--mark-s", "1e9"], log)
    steps = int(a.peer_schedule * a.budget_s * steady_rate(log.read_text(), pilot[-1]))
    cmd = [*base, "--out", str(out), "--steps", str(steps), "--budget-s", str(a.budget_s), "--mark-s", str(a.mark_s)]
    for stale in out.glob("mark-*.pt"):  # an earlier sitting's snapshots: the evaluation scores every one in out
        stale.unlink()
    snaps, process_s = run_child(cmd, a.work / f"{out.name}.log")
    scores, _ = run_child([a.peer_python, str(PEER_SCRIPT), "evaluate", "--data", a.peer_data, "--out", str(out),
                           "--width", str(a.peer_width)], a.work / f"{out.name}-eval.log")
    by_time = {round(s["train_s"], 1): s["knn_top1"] for s in scores}
    points = [{**snap, "knn_top1": by_time[round(snap["train_s"], 1)]} for snap in snaps]
    return {"side": "peer", "label": label, "seed": seed,
            "points": points, "process_s": round(process_s, 1), "schedule_steps": steps, "command": repo_relative(cmd)}


def steady_rate(progress: str, last: dict) -> float:
    """The peer's steps per second once its loader runs: from its first progress line ("step N/... train_s T", every
    50 steps) to its last; the whole pilot's rate where there are fewer than two (it counts the loader's start-up,
    which under-measures the pace and ends the schedule early: docs/lab/time-to-accuracy.md, "The first sittings")."""
    marks = [(int(line.split()[1].split("/")[0]), float(line.split("train_s")[1])) for line in progress.splitlines()
             if line.startswith("step ") and "train_s" in line]
    if len(marks) < 2:
        return last["step"] / last["train_s"]
    (s0, t0), (s1, t1) = marks[0], marks[-1]
    return (s1 - s0) / (t1 - t0)


MARK_SLACK_S = 1.0  # a mark's snapshot is taken at the first step end past it: it still counts as the mark's


def first_time_at(points: list[dict], target: float) -> float | None:
    """Training seconds of the first snapshot whose kNN reaches ``target`` (None: none does)."""
    return next((p["train_s"] for p in points if p["knn_top1"] >= target), None)


def within_budget(points: list[dict], budget_s: float) -> list[dict]:
    """The snapshots taken within the budget (the budget's own snapshot included)."""
    return [p for p in points if p["train_s"] <= budget_s + MARK_SLACK_S]


def at_budget(points: list[dict], budget_s: float) -> float:
    """The kNN of the last snapshot within the budget."""
    return within_budget(points, budget_s)[-1]["knn_top1"]


def summary(rows: list[dict], budget_s: float) -> list[str]:
    """Per seed: each side's kNN at the budget, the time ours took to reach the peer's, the targets. The peer is
    its best row of the seed (the highest kNN at the budget, among its settings), named in the line."""
    lines = []
    for seed in sorted({r["seed"] for r in rows}):
        peer_rows = [r for r in rows if r["seed"] == seed and r["side"] == "peer"]
        for row in [r for r in rows if r["seed"] == seed and r["side"] == "ours" and r.get("split") != "validation"]:
            if not peer_rows:  # (the peer's figures are on the test split: a validation row is not compared)
                continue
            best = max(peer_rows, key=lambda r: at_budget(r["points"], budget_s))
            theirs, mine = at_budget(best["points"], budget_s), at_budget(row["points"], budget_s)
            reach = first_time_at(row["points"], theirs)
            when = f"in {reach / 60:.1f} min" if reach is not None else "never"
            margin_met = "met" if mine - theirs >= 0.05 else "not met"
            half_met = "met" if reach is not None and reach <= budget_s / 2 + MARK_SLACK_S else "not met"
            lines.append(f"seed {seed} {row['label']}: peer ({best['label']}) kNN {theirs:.4f} at "
                         f"{budget_s / 60:.0f} min; ours {mine:.4f} ({mine - theirs:+.4f}; target +0.05 {margin_met});"
                         f" ours reached the peer's {when} (target <= {budget_s / 120:g} min: {half_met})")
    return lines


def reached(rows: list[dict], targets: list[float], budget_s: float) -> list[str]:
    """Per kontrast row: its kNN at the budget and the minutes its snapshots took to reach each of ``targets``
    (no peer needed: on a GPU, minutes to 85 % and 90 % against the published runs)."""
    lines = []
    for row in sorted((r for r in rows if r["side"] == "ours"), key=lambda r: (r["seed"], r["label"])):
        within = within_budget(row["points"], budget_s)
        if not within:
            lines.append(f"seed {row['seed']} {row['label']}: no snapshot within the budget")
            continue
        times = [first_time_at(within, target) for target in targets]
        said = [f"{target:g} in {t / 60:.1f} min" if t is not None else f"{target:g} not within the budget"
                for target, t in zip(targets, times)]
        on = " (validation)" if row.get("split") == "validation" else ""
        lines.append(f"seed {row['seed']} {row['label']}: kNN{on} {within[-1]['knn_top1']:.4f} at "
                     f"{within[-1]['train_s'] / 60:.1f} min (step {within[-1].get('step', '?')}); {', '.join(said)}")
    return lines


def plot(rows: list[dict], path: Path, budget_s: float, references: list[dict] = ()) -> None:
    """kNN against minutes for ``rows``; each of ``references`` (rows of another budget, e.g. a teacher's) as a
    dotted line at its final kNN."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {}
    for row in rows:
        key = (row["side"], row["label"])
        colours.setdefault(key, f"C{len(colours)}")
        xs, ys = [p["train_s"] / 60 for p in row["points"]], [p["knn_top1"] for p in row["points"]]
        ax.plot(xs, ys, marker="o", color=colours[key], linestyle="-" if row["seed"] == 0 else "--",
                label=f"{'kontrast' if row['side'] == 'ours' else 'peer'}: {row['label']}, seed {row['seed']}")
    for ref in references:
        final = ref["points"][-1]
        ax.axhline(final["knn_top1"], color="0.4", linestyle=":", label=f"{ref['label']}, seed {ref['seed']}: "
                   f"{final['knn_top1']:.4f} after {final['train_s'] / 60:.1f} min")
    ax.set_xlabel("training wall-clock (minutes, 2-core CPU)")
    ax.set_ylabel("kNN top-1, CIFAR-10 test (k=200)")
    ax.set_xlim(0, budget_s / 60 * 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def levels(text: str) -> list[float]:
    """``--targets``: kNN levels, each in [0, 1]."""
    values = [float(t) for t in text.split(",")]
    if not all(0 <= v <= 1 for v in values):
        raise ValueError(text)
    return values


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="CIFAR-10 as kontrast reads it (the tar)")
    p.add_argument("--recipe", type=Path, default=ROOT / "configs/simclr_cifar_fast.yaml")
    p.add_argument("--set", action="append", default=[], help="config key=value on top of the recipe (repeatable)")
    p.add_argument("--label", default="fast", help="this recipe's name in the rows and the plot (ablations: another)")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--sides", default="ours,peer", choices=["ours", "peer", "ours,peer"],
                   help="which sides to run (default both; per seed, even seeds run ours first, odd ones the peer)")
    p.add_argument("--budget-min", type=float, default=30.0)
    p.add_argument("--validation", type=int, default=0, metavar="N",
                   help="hold out N training images (data.validation, the same in every run) and score kNN on them, "
                   "not on the test split: for choosing a recipe's settings (0: the test split)")
    p.add_argument("--mark-min", type=float, default=5.0)
    p.add_argument("--peer-python", help="the peer environment's python (benchmarks/setup_peer.sh)")
    p.add_argument("--peer-data", help="CIFAR-10 as an ImageFolder (benchmarks/setup_peer.sh extracts it)")
    p.add_argument("--peer-width", type=float, default=0.25)
    p.add_argument("--peer-batch", type=int, default=256)
    p.add_argument("--peer-precision", choices=["bf16_cl", "fp32"], default="bf16_cl")
    p.add_argument("--peer-temperature", type=float, default=0.5, help="the peer's NT-Xent temperature")
    p.add_argument("--peer-schedule", type=float, default=0.98,
                   help="the peer's cosine schedule in budgets at its pilot's pace (above 1: the budget cuts it)")
    p.add_argument("--pilot-s", type=float, default=150.0, help="the peer's pilot, to fit its schedule to the budget")
    p.add_argument("--work", type=Path, default=ROOT / "runs/time_to_accuracy")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/time_to_accuracy.jsonl")
    p.add_argument("--plot", type=Path)
    p.add_argument("--plot-labels", help="comma-separated labels to draw (default: every row's)")
    p.add_argument("--reference-labels", help="comma-separated labels of rows at any budget (a distillation "
                   "teacher) drawn as a dotted line at their final kNN")
    p.add_argument("--eval-device", default="cpu", help="where kontrast's snapshots are scored (cpu, cuda, ...)")
    p.add_argument("--targets", type=levels, help="comma-separated kNN levels (e.g. 0.85,0.9): print the minutes each "
                   "kontrast row took to reach them")
    p.add_argument("--report", action="store_true", help="only the summary (and --plot) of the rows in --out")
    a = p.parse_args(argv)
    if a.peer_schedule <= 0:
        p.error(f"--peer-schedule must be above 0 (a share of the budget, e.g. 0.98 or 1.3), not {a.peer_schedule:g}")
    a.budget_s, a.mark_s = a.budget_min * 60, a.mark_min * 60
    return a


def main(argv=None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "_ours":  # the child process of one kontrast run
        c = argparse.ArgumentParser()
        for flag in ("--recipe", "--data", "--out"):
            c.add_argument(flag, required=True)
        c.add_argument("--seed", type=int, default=0)
        c.add_argument("--budget-s", type=float, required=True)
        c.add_argument("--mark-s", type=float, required=True)
        c.add_argument("--set", action="append", default=[])
        return train_ours(c.parse_args(sys.argv[2:]))
    a = parse_args(argv)
    if not a.report:
        a.work.mkdir(parents=True, exist_ok=True)
        sides = a.sides.split(",")
        for seed in (int(s) for s in a.seeds.split(",")):
            for side in (sides if seed % 2 == 0 else sides[::-1]):  # interleaved: who goes first alternates
                row = ours(a, seed) if side == "ours" else peer(a, seed)
                row.update(budget_s=a.budget_s, when=datetime.now(UTC).isoformat(timespec="minutes"),
                           load_after=round(os.getloadavg()[0], 2))
                with open(a.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps({k: row[k] for k in ("side", "label", "seed", "process_s")}
                                 | {"knn": [(p["train_s"], p["knn_top1"]) for p in row["points"]]}), flush=True)
    every = [json.loads(line) for line in a.out.read_text().splitlines()] if a.out.exists() else []
    latest = {(r["side"], r["label"], r["seed"]): r for r in every if r["budget_s"] == a.budget_s}
    rows = list(latest.values())  # a rerun replaces its earlier row here; the file keeps both
    print("\n".join(summary(rows, a.budget_s)))
    if a.targets:
        print("\n".join(reached(rows, a.targets, a.budget_s)))
    if a.plot:
        labels = sorted({r["label"] for r in rows})
        chosen = a.plot_labels.split(",") if a.plot_labels else labels
        if unknown := [label for label in chosen if label not in labels]:
            print(f"error: no row is labelled {', '.join(map(repr, unknown))}; the labels are {', '.join(labels)}",
                  file=sys.stderr)
            sys.exit(2)
        references = [r for r in every if r["label"] in (a.reference_labels or "").split(",")]
        plot([r for r in rows if r["label"] in chosen], a.plot, a.budget_s, references)
        print(f"plot: {a.plot}")


if __name__ == "__main__":
    main()
