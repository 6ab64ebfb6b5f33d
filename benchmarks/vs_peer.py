"""kontrast against the peer baseline (lightly's SimCLR recipe), judged against its speed targets.

Runs `kontrast bench`'s augment, step and loss sections (ours alone: the library measures them), then
end-to-end SimCLR training with the peer and ours back to back in each setting (their ratio), and with
--accuracy the weighted kNN top-1 of both after --accuracy-epochs epochs. Every figure is printed with
the command that reproduces it; then each target as met / NOT met / (absent) not measured.
From the repository root:

    .venv/bin/python benchmarks/vs_peer.py --threads 2 --peer-python PEER_VENV/bin/python --peer-data CIFAR10_DIR
    .venv/bin/python benchmarks/vs_peer.py ... --json > benchmarks/results/bench.json   # progress on stderr

Takes every `kontrast bench` option, plus (each also from an environment variable):
  --data         BENCH_DATA; default ../shared/data/cifar10-jpeg.tar.gz beside the repo when present, else shapes
  --peer-python  PEER_PYTHON: python of the peer's own venv (benchmarks/setup_peer.sh); no peer without it
  --peer-data    PEER_CIFAR10: the extracted CIFAR-10 folder (train/, test/) the peer reads
  --peer-script  PEER_SCRIPT; default ../shared/bench/lightly_simclr.py beside the repo
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from kontrast.bench import runs
from kontrast.bench.options import BenchOptions, add_arguments, check, command, from_args, threads
from kontrast.bench.report import run_bench, train_run
from kontrast.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"  # the data and the peer script beside the repository
PROG = (".venv/bin/python", "benchmarks/vs_peer.py")
TARGETS = {"train_vs_peer_fp32": 3.0, "train_vs_peer_best": 1.7, "augment_vs_torchvision": 8.0,
           "outside_encoder": {"simclr": 0.10, "moco_v2": 0.15, "byol": 0.15}}
FULL_WIDTH_VS_PEER_BEST = 1.1  # at full width the encoder dominates, so the target vs the peer's best is lower
PEER_FLAGS = {"auto": [], "fp32": [], "fp32_cl": ["--channels-last"], "bf16_cl": ["--bf16", "--channels-last"],
              "bf16_cl_compile": ["--bf16", "--channels-last"]}  # the peer has no compile option: its bf16_cl run


@dataclass
class Peer:
    python: str | None = None
    data: str | None = None
    script: str = ""
    accuracy: bool = False
    accuracy_epochs: int = 5

    def ready(self) -> str | None:
        """None when the peer can run, else why not (printed; the peer columns are then skipped)."""
        if not self.python:
            return "no --peer-python given (benchmarks/setup_peer.sh sets the peer up)"
        if not Path(self.python).exists():
            return f"--peer-python {self.python} does not exist"
        if not self.data or not (Path(self.data) / "train").is_dir():
            return f"--peer-data must be the extracted CIFAR-10 folder holding train/ and test/, got {self.data!r}"
        if not Path(self.script).is_file():
            return f"peer script {self.script} not found (--peer-script)"
        return None

    def args(self) -> list[str]:
        return ["--peer-python", str(self.python), "--peer-data", str(self.data), "--peer-script", self.script]


def relative(path: Path) -> str:
    """``path`` as typed from the current folder (``../shared/...`` from the repository root)."""
    return os.path.relpath(path)


def peer_command(peer: Peer, opts: BenchOptions, setting: str, *, steps: int, epochs: int = 0) -> list[str]:
    run = ["--epochs", str(epochs)] if epochs else ["--steps", str(steps)]
    return [str(peer.python), peer.script, "--data", str(peer.data), *run, "--batch", str(opts.batch),
            "--width", str(opts.width), "--workers", "0", "--threads", str(threads(opts)), *PEER_FLAGS[setting]]


def run_peer(cmd: list[str], opts: BenchOptions, work: Path, name: str) -> dict:
    log = work / f"{name}.log"
    code, wall, rss = runs.run_measured(cmd, threads(opts), log, opts.timeout)
    lines = log.read_text().strip().splitlines()
    if code != 0 or not lines or not lines[-1].startswith("{"):
        raise UserError(f"peer baseline failed (exit {code}): {(lines or ['(no output)'])[-1]}; "
                        f"command: {runs.display(cmd)}")
    res = json.loads(lines[-1])
    return {"img_per_s": round(res["img_per_s_wall"], 1), "img_per_s_compute": round(res["img_per_s_compute"], 1),
            "steps": res["steps"], "process_wall_s": round(wall, 1), "peak_rss_mib": round(rss),
            **({"knn_top1": res["knn_top1"]} if "knn_top1" in res else {}), "command": runs.display(cmd)}


def run_eval(run_dir: str, opts: BenchOptions, work: Path) -> dict:
    cmd = [sys.executable, "-m", "kontrast.cli", "eval", "--checkpoint", run_dir, "--no-linear", "--json"]
    log = work / f"{Path(run_dir).name}-eval.log"
    code, _, _ = runs.run_measured(cmd, threads(opts), log, opts.timeout)
    lines = log.read_text().strip().splitlines()
    if code != 0 or not lines:
        raise UserError(f"kontrast eval failed (exit {code}): {(lines or ['(no output)'])[-1]}")
    return json.loads(lines[-1])


def train_vs_peer(opts: BenchOptions, peer: Peer) -> dict:
    work, why_not = runs.scratch_dir(opts.workdir), peer.ready()
    opts.log(f"== end-to-end SimCLR training, {opts.encoder} width {opts.width:g}, batch {opts.batch}, {opts.steps} "
             f"steps, {threads(opts)} thread(s) per process, peer and ours back to back")
    if why_not:
        opts.log(f"  peer skipped: {why_not}")
    result: dict = {"threads": threads(opts), "steps": opts.steps, "batch": opts.batch, "width": opts.width,
                    "encoder": opts.encoder, "peer_skipped": why_not, "settings": {}}
    peer_runs: dict[str, dict] = {}  # peer command -> its result (bf16_cl_compile reuses bf16_cl's)
    for setting in opts.settings:
        entry: dict = {}
        if not why_not:
            cmd = peer_command(peer, opts, setting, steps=opts.steps)
            if runs.display(cmd) not in peer_runs:
                peer_runs[runs.display(cmd)] = run_peer(cmd, opts, work, f"peer-{setting}")
            entry["peer"] = peer_runs[runs.display(cmd)]
        entry["ours"] = o = train_run(opts, setting, work)
        line = f"{setting:8s} ours {o['img_per_s']:7.1f} img/s (steady {o['img_per_s_steady']:.1f}), " \
               f"peak RSS {o['peak_rss_mib']} MiB"
        if "peer" in entry:
            p = entry["peer"]
            entry["ratio"] = round(o["img_per_s"] / p["img_per_s"], 2)
            line += (f" | peer {p['img_per_s']:7.1f} img/s, peak RSS {p['peak_rss_mib']} MiB"
                     f" | ours/peer {entry['ratio']:.2f}x")
        result["settings"][setting] = entry
        opts.log(line)
        opts.log(f"  ours: {o['command']}")
        if "peer" in entry:
            opts.log(f"  peer: {entry['peer']['command']}")
    _summarise(result, opts)
    opts.log(f"  reproduce: {command(opts, 'train', PROG, steps=opts.steps, settings=','.join(opts.settings))}"
             + ("" if why_not else " " + shlex.join(peer.args())))
    return result


def _summarise(result: dict, opts: BenchOptions) -> None:
    """Ours at its best against the peer's default (fp32) and its best, and the compiled run's steady rate."""
    got = {s: e for s, e in result["settings"].items() if s != "bf16_cl_compile" and "peer" in e}
    compiled = result["settings"].get("bf16_cl_compile")
    if compiled and "peer" in compiled:  # compiling takes minutes once per process: compare steady rates
        ours = compiled["ours"]["img_per_s_steady"]
        result["compiled_steady_vs_peer_fp32"] = (round(ours / got["fp32"]["peer"]["img_per_s"], 2)
                                                  if "fp32" in got else None)
        result["compiled_steady_vs_peer_best"] = round(ours / max(e["peer"]["img_per_s"] for e in
                                                                  result["settings"].values()), 2)
        opts.log(f"with train.compile, steady rate (first logging window, which holds the compile, left out) "
                 f"{ours:.1f} img/s: {result['compiled_steady_vs_peer_best']:.2f}x the peer's best"
                 + (f", {result['compiled_steady_vs_peer_fp32']:.2f}x its fp32" if "fp32" in got else ""))
    if {"fp32", "bf16_cl"} <= set(got):
        best = max(got[s]["ours"]["img_per_s"] for s in got)
        result["ours_best_vs_peer_fp32"] = round(best / got["fp32"]["peer"]["img_per_s"], 2)
        result["ours_best_vs_peer_best"] = round(best / max(got[s]["peer"]["img_per_s"] for s in got), 2)
        opts.log(f"ours at its best vs the peer's default (fp32): {result['ours_best_vs_peer_fp32']:.2f}x "
                 f"(target {TARGETS['train_vs_peer_fp32']}x); "
                 f"vs the peer's best: {result['ours_best_vs_peer_best']:.2f}x "
                 f"(target {train_target('train_vs_peer_best', opts.width)}x)")


def accuracy_vs_peer(opts: BenchOptions, peer: Peer) -> dict:
    work, why_not = runs.scratch_dir(opts.workdir), peer.ready()
    opts.log(f"== accuracy: weighted kNN top-1 (k=200, tau=0.1) after {peer.accuracy_epochs} epochs, SimCLR, "
             f"{opts.encoder} width {opts.width:g}, batch {opts.batch}")
    if why_not:
        opts.log(f"  peer skipped: {why_not}")
    result: dict = {"epochs": peer.accuracy_epochs, "peer_skipped": why_not, "settings": {}}
    for setting in opts.settings:
        entry: dict = {}
        if not why_not:
            cmd = peer_command(peer, opts, setting, steps=0, epochs=peer.accuracy_epochs)
            entry["peer"] = run_peer(cmd, opts, work, f"peer-acc-{setting}")
        out = str(work / f"ours-acc-{setting}")
        cmd = runs.ours_command(opts.data, method="simclr", steps=0, batch=opts.batch, width=opts.width,
                                encoder=opts.encoder, threads=threads(opts), setting=setting, out=out,
                                epochs=peer.accuracy_epochs, device=opts.device)
        ours = runs.run_ours(cmd, threads(opts), work, opts.timeout)
        ours["knn_top1"] = run_eval(out, opts, work)["knn_top1"]
        entry["ours"] = {**ours, "command": runs.display(cmd) + f" && kontrast eval --checkpoint {out} --no-linear"}
        result["settings"][setting] = entry
        opts.log(f"{setting:8s} ours kNN {ours['knn_top1']:.4f}"
                 + (f" | peer kNN {entry['peer']['knn_top1']:.4f}" if "peer" in entry else ""))
        opts.log(f"  ours: {entry['ours']['command']}"
                 + (f"\n  peer: {entry['peer']['command']}" if "peer" in entry else ""))
    return result


def train_target(name: str, width: float) -> float:
    return FULL_WIDTH_VS_PEER_BEST if name == "train_vs_peer_best" and width >= 1 else TARGETS[name]


def judge(result: dict, width: float) -> dict:
    """The speed targets, as met / NOT met, from the figures measured in this sitting (absent: not measured)."""
    out: dict = {}
    if "augment" in result:
        for key, col in (("augment_vs_torchvision", "ratio"), ("augment_vs_torchvision_compiled", "compiled_ratio")):
            if all(col in r for r in result["augment"]["recipes"]):
                worst = min(result["augment"]["recipes"], key=lambda r: r[col])
                ok = worst[col] >= TARGETS["augment_vs_torchvision"]
                out[key] = (f"{'met' if ok else 'NOT met'}: lowest {worst[col]}x ({worst['recipe']}), "
                            f"target {TARGETS['augment_vs_torchvision']}x")
    if "step" in result:
        by_name = {r["method"]: r for r in result["step"]["methods"] if "outside_encoder" in r}
        for name, limit in TARGETS["outside_encoder"].items():
            if name in by_name:
                share = by_name[name]["outside_encoder"]
                out[f"outside_encoder_{name}"] = (f"{'met' if share <= limit else 'NOT met'}: {100 * share:.1f}% "
                                                  f"(target <= {100 * limit:.0f}%)")
    acc = result.get("accuracy", {}).get("settings", {})
    if "bf16_cl" in acc and ("fp32" in acc or "peer" in acc["bf16_cl"]):
        fast = acc["bf16_cl"]["ours"]["knn_top1"]
        refs = {f"peer {s}": e["peer"]["knn_top1"] for s, e in acc.items() if "peer" in e}
        refs.update({"ours fp32": acc["fp32"]["ours"]["knn_top1"]} if "fp32" in acc else {})
        out["accuracy_at_fast_defaults"] = (f"{'met' if all(fast >= r for r in refs.values()) else 'NOT met'}: "
                                            f"bf16_cl kNN {fast:.4f} vs "
                                            + ", ".join(f"{k} {v:.4f}" for k, v in refs.items()))
    train = result.get("train", {})
    if "ours_best_vs_peer_fp32" in train:
        for key, target in (("ours_best_vs_peer_fp32", "train_vs_peer_fp32"),
                            ("ours_best_vs_peer_best", "train_vs_peer_best")):
            want = train_target(target, width)
            out[key] = f"{'met' if train[key] >= want else 'NOT met'}: {train[key]}x (target {want}x)"
    return out


def compare(opts: BenchOptions, peer: Peer) -> dict:
    """Ours alone (augment, step, loss), then the peer side by side (train, accuracy), then the targets."""
    check(opts)
    if peer.accuracy and peer.accuracy_epochs < 1:
        raise UserError("--accuracy-epochs must be >= 1")
    if opts.data == "shapes":
        opts.log("note: measuring on the built-in shapes data (--data or BENCH_DATA for CIFAR-10)")
    t0 = time.perf_counter()
    result = run_bench(replace(opts, sections=tuple(s for s in opts.sections if s != "train")))
    if "train" in opts.sections:
        result["train"] = train_vs_peer(opts, peer)
    if peer.accuracy:
        result["accuracy"] = accuracy_vs_peer(opts, peer)
    result["targets"] = judge(result, opts.width)
    for name, verdict in result["targets"].items():
        opts.log(f"target {name}: {verdict}")
    result["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    return result


def build_parser() -> argparse.ArgumentParser:
    data = SHARED / "data/cifar10-jpeg.tar.gz"
    parser = argparse.ArgumentParser(prog=shlex.join(PROG), description=__doc__.splitlines()[0])
    add_arguments(parser, data_default=os.environ.get("BENCH_DATA") or (relative(data) if data.is_file() else "shapes"))
    parser.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON"),
                        help="python of the peer's venv (env PEER_PYTHON); no peer without it")
    parser.add_argument("--peer-data", default=os.environ.get("PEER_CIFAR10"),
                        help="the extracted CIFAR-10 folder (train/, test/) the peer reads (env PEER_CIFAR10)")
    parser.add_argument("--peer-script",
                        default=os.environ.get("PEER_SCRIPT") or relative(SHARED / "bench/lightly_simclr.py"),
                        help="the peer baseline (env PEER_SCRIPT; default: %(default)s)")
    parser.add_argument("--accuracy", action="store_true", help="also kNN top-1 after --accuracy-epochs, ours and peer")
    parser.add_argument("--accuracy-epochs", type=int, default=5)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    opts = from_args(args)
    peer = Peer(args.peer_python, args.peer_data, args.peer_script, args.accuracy, args.accuracy_epochs)
    if args.json:
        opts.log = lambda *a: print(*a, file=sys.stderr, flush=True)
    try:
        result = compare(opts, peer)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
