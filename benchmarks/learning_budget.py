"""How small a learning test's budget can be: the learning check of tests/learning over several seeds.

For each method, trains with its configs/short_budget.yaml entry (overridden by --epochs / --limit), as
``tests/learning/test_learning.py`` does, for each seed, and prints the figures the test checks: the loss
over the first and last logged windows, the kNN of the untrained and the trained encoder, the wall time, and
whether the test's checks pass (loss falls; kNN above twice chance and 0.01 above the untrained encoder).

    .venv/bin/python benchmarks/learning_budget.py --data ../shared/data/cifar10-jpeg.tar.gz \\
        --methods simclr,byol --seeds 0,1,2 [--epochs 4] [--limit 2000] [--precision fp32] [--out runs/lb-native.jsonl]

Run it once per kernel set (``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` before the command for the AVX2
set, as ``make test-kernels`` runs the suite), each into its own file, then print the docs' table of gains, spreads
and margins (docs/lab/learning-tests.md):

    .venv/bin/python benchmarks/learning_budget.py --report native=runs/lb-native.jsonl avx2=runs/lb-avx2.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from kontrast.config import merge, parse_override  # noqa: E402
from learning.test_learning import GAIN, VIT_BUDGET, run_learning, whole_entry  # noqa: E402

# the learning test's MoCo v3 on a small ViT (test_learning_on_a_vit), by a name of its own
EXTRA_BUDGETS = {"moco_v3_vit": ("moco_v3", VIT_BUDGET)}
BUDGETS = yaml.safe_load((ROOT / "configs/short_budget.yaml").read_text())


def _budget(entry: dict) -> str:
    """An entry with every test-only setting spelled out, as one comparable string."""
    return json.dumps(whole_entry(entry), sort_keys=True)


def current_entry(method: str) -> dict:
    """The entry the learning test runs now for ``method`` (configs/short_budget.yaml, or the ViT test's)."""
    return EXTRA_BUDGETS[method][1] if method in EXTRA_BUDGETS else BUDGETS[method]


def report(files: list[str]) -> str:
    """The table of docs/lab/learning-tests.md: per method (the runs at the budget its test runs now), the gain of
    the trained over the untrained encoder's kNN for every seed under every kernel set, their spread, the worst gain
    in units of the spread, the worst gain's margin over the test's line (GAIN), and how many standard deviations of
    the gains the line lies below their mean (what the chance of another seed or CPU failing the test turns on)."""
    runs = [{"kernels": label, **json.loads(line)} for label, path in (f.split("=", 1) for f in files)
            for line in Path(path).read_text().splitlines() if line.strip()]
    out = ["| method | budget (epochs x images) | gains (kNN trained - untrained), seed 0/1/2 per kernel set | spread "
           f"| worst gain | worst / spread | worst - line ({GAIN}) | (mean - line) / sd |",
           "|---|---|---|---|---|---|---|---|"]
    for method in dict.fromkeys(r["method"] for r in runs):
        entry = current_entry(method)  # the runs of the whole entry the test runs now, not only its epochs and size
        mine = [r for r in runs if r["method"] == method and _budget(r["entry"]) == _budget(entry)]
        test = whole_entry(entry)["test"]
        epochs = f"{test['epochs']} x {test['limit']} at {test['size']} px" + (
            f", batch {test['batch_size']}" if test["batch_size"] != 128 else "")
        if not mine:
            out.append(f"| {method} | {epochs} | not measured at this budget | | | | | |")
            continue
        by_kernels = {}
        for r in mine:
            by_kernels.setdefault(r["kernels"], {})[r["seed"]] = r["knn_trained"] - r["knn_untrained"]
        gains = [g for seeds in by_kernels.values() for g in seeds.values()]
        spread, worst = max(gains) - min(gains), min(gains)
        cells = "; ".join(f"{k} " + " / ".join(f"{seeds[s]:+.3f}" for s in sorted(seeds))
                          for k, seeds in by_kernels.items())
        ratio = f"{worst / spread:.1f}" if spread > 0 else "-"
        mean, sd = statistics.fmean(gains), statistics.stdev(gains) if len(gains) > 1 else 0.0
        z = f"{(mean - GAIN) / sd:.1f}" if sd > 0 else "-"
        out.append(f"| {method} | {epochs} | {cells} | {spread:.3f} | {worst:+.3f} | {ratio} | {worst - GAIN:+.3f} "
                   f"| {z} |")
    return "\n".join(out)


def main() -> None:
    if sys.argv[1:2] == ["--report"]:
        print(report(sys.argv[2:]))
        print("\ncommand: .venv/bin/python benchmarks/learning_budget.py --report " + " ".join(sys.argv[2:]))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="CIFAR-10 (the JPEG archive of ../shared/data)")
    p.add_argument("--methods", required=True,
                   help="comma list of method names, or moco_v3_vit (the learning test's ViT budget)")
    p.add_argument("--seeds", default="0,1,2", help="comma list (default: %(default)s)")
    p.add_argument("--epochs", type=int, help="override the entry's epochs")
    p.add_argument("--limit", type=int, help="override the entry's training images")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), help="override the entry's precision")
    p.add_argument("--size", type=int, help="override the entry's image size (px)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one setting of the entry (e.g. method.temperature=0.2); repeatable")
    p.add_argument("--out", help="append one JSON line per run to this file")
    args = p.parse_args()
    for entry in args.methods.split(","):
        name, base = EXTRA_BUDGETS.get(entry, (entry, BUDGETS.get(entry)))
        if base is None:
            p.error(f"no short budget for {entry!r}: one of {', '.join([*BUDGETS, *EXTRA_BUDGETS])}")
        for seed in map(int, args.seeds.split(",")):
            budget = json.loads(json.dumps(base))
            test = budget.setdefault("test", {})
            test.update({k: v for k, v in (("epochs", args.epochs), ("limit", args.limit),
                                           ("precision", args.precision), ("size", args.size)) if v is not None})
            for item in args.set:  # the CLI's --set parsing (YAML, "1e-4" a float)
                budget = merge(budget, parse_override(item))
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                result = run_learning(name, budget, Path(tmp), Path(args.data), seed=seed)
                result.update(method=entry, seed=seed, wall_s=round(time.perf_counter() - start, 1),
                              **({"set": args.set} if args.set else {}))
            print(json.dumps(result), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
