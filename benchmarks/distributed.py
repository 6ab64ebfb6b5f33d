"""Two ranks against one process on this CPU: throughput, communication, and memory.

The distributed benchmark: SimCLR, ResNet-18 (CIFAR stem) at width 0.25, global batch 256, CIFAR-10 (all
50,000 training images, so the dataset is large enough to see in memory), fp32. Three runs:

- ``1x2``: one process, 2 threads (what a 2-core machine runs without torchrun);
- ``2x1``: ``kontrast train --nproc 2``, two ranks of one thread (torchrun's launcher, standalone, the
  processes forked from the launcher), through ``benchmarks/timed_collectives.py``: the CLI with the time
  each rank spends in collectives recorded (waiting for the other rank included; the start-up barrier
  left out);
- ``1x1-half``: one process, one thread, batch 128: what one rank computes, alone on the machine.

images/s: the median of the logged windows after the first (the first holds start-up). Communication
per step: the collectives' time over the steps run, the larger of the two ranks'. Memory: the peak
over the run of the summed PSS (proportional set size: a page shared by two processes counts half
to each) of the processes that train, and of the whole tree (with the launcher), sampled every 0.2 s;
and the PSS of the trainers' mappings of the dataset cache file (the decoded images: counted once
when shared). Each run is stopped with SIGTERM after ``--steps`` steps (it checkpoints and exits).

Linux only (reads /proc). Run on a quiet machine; the figures are printed with this command:

    .venv/bin/python benchmarks/distributed.py --data ../shared/data/cifar10-jpeg.tar.gz
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.processes import descendants  # noqa: E402

RUNS = {"1x2": (1, 2, 256), "2x1": (2, 1, 256), "1x1-half": (1, 1, 128)}  # processes, threads each, batch


def _pss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _mapped_dataset_mib(pid: int) -> float:
    """PSS of the process's mappings of dataset cache entries (``*.safetensors``): the decoded images."""
    total, in_entry = 0, False
    try:
        for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
                in_entry = fields[-1].endswith(".safetensors")
            elif in_entry and fields[0] == "Pss:":
                total += int(fields[1])
    except OSError:
        pass
    return total / 1024


def _is_trainer(pid: int, launcher: int, nproc: int) -> bool:
    """The processes that train: the launcher itself on one process; its worker children under --nproc."""
    return pid == launcher if nproc == 1 else pid != launcher


def run(name: str, data: str, steps: int, log_every: int, out: Path, overrides: list[str]) -> dict:
    nproc, threads, batch = RUNS[name]
    args = ["train", "--method", "simclr", "--data", data, "--epochs", "1", "--batch-size", str(batch), "--out",
            str(out), "--overwrite", "--no-progress", "--set", "encoder.width=0.25",
            "--set", f"train.num_threads={threads}", "--set", f"train.log_every={log_every}",
            "--set", "train.knn_every=0", "--set", "train.precision=fp32"]  # auto would pick bf16 on a CPU with AMX
    args += [arg for override in overrides for arg in ("--set", override)]
    cmd = [sys.executable, "-m", "kontrast.cli", *args]
    if nproc > 1:  # `kontrast train --nproc N`, with the collectives timed
        cmd = [sys.executable, str(ROOT / "benchmarks" / "timed_collectives.py"), *args, "--nproc", str(nproc)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT / "src"),
               KONTRAST_COLLECTIVES_OUT=f"{out}-collectives")
    polls = 0
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak_trainers = peak_tree = dataset = 0.0
    metrics = out / "metrics.jsonl"
    while proc.poll() is None:
        pids = [proc.pid, *descendants(proc.pid)]
        pss = {p: _pss_mib(p) for p in pids}
        peak_tree = max(peak_tree, sum(pss.values()))
        trainers = [p for p in pids if _is_trainer(p, proc.pid, nproc)]
        peak_trainers = max(peak_trainers, sum(pss[p] for p in trainers))
        if polls % 25 == 0:  # the full smaps is dearer to read: every 5 s
            dataset = max(dataset, sum(_mapped_dataset_mib(p) for p in trainers))
        polls += 1
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if sum('"loss"' in line for line in lines) * log_every >= steps:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.2)
    stderr = proc.communicate(timeout=300)[1]
    if proc.returncode not in (0, 143):  # 143: stopped by the SIGTERM above, after a checkpoint
        raise SystemExit(f"{name}: kontrast train exited {proc.returncode}: {stderr[-2000:]}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if '"img_per_s"' in line]
    rates = [r["img_per_s"] for r in rows[1:]]
    img_s = statistics.median(rates)
    comm = {}
    for path in out.parent.glob(f"{out.name}-collectives.*.json"):
        record = json.loads(path.read_text())
        # the start's barrier left out
        comm[record["rank"]] = sum(sec for name, (_, sec) in record["calls"].items() if name != "barrier")
    steps_run = rows[-1]["step"]
    return {"run": name, "processes": nproc, "threads": threads, "batch": batch, "windows": len(rates),
            "img_per_s": round(img_s, 1), "step_ms": round(1000 * batch / img_s, 1),
            "peak_pss_trainers_mib": round(peak_trainers), "peak_pss_tree_mib": round(peak_tree),
            "dataset_pss_mib": round(dataset, 1),
            "collectives_ms_per_step": round(1000 * max(comm.values()) / steps_run, 1) if comm else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="CIFAR-10 (the shared tar, or a folder)")
    parser.add_argument("--steps", type=int, default=40, help="steps per run before SIGTERM")
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {','.join(RUNS)}")
    parser.add_argument("--repeat", type=int, default=1, help="run the list this many times, interleaved (medians)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every run (e.g. train.sync_bn=false), as kontrast train's --set")
    args = parser.parse_args()
    print(f"cpu capability: {torch.backends.cpu.get_cpu_capability()}, cores: {os.cpu_count()}, "
          f"torch {torch.__version__}")
    sys.path.insert(0, str(ROOT / "src"))
    from kontrast.data import load_images

    load_images(args.data, "train", size=32)  # decode and cache once, so every run maps the same cache entry
    measured: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for name in args.runs.split(","):
                measured.setdefault(name, []).append(run(name, args.data, args.steps, args.log_every,
                                                         Path(tmp) / f"{name}-{i}", args.set))
                print(json.dumps(measured[name][-1]), flush=True)
    results = {name: {key: statistics.median(r[key] for r in rows) if isinstance(rows[0][key], (int, float))
                      else rows[0][key] for key in rows[0]} for name, rows in measured.items()}
    if args.repeat > 1:
        print("medians:", json.dumps(results))
        if {"1x2", "2x1"} <= measured.keys():
            ratios = [b["img_per_s"] / a["img_per_s"] for a, b in zip(measured["1x2"], measured["2x1"])]
            print("images/s ratio of each interleaved pair (2x1 / 1x2):", [round(r, 3) for r in ratios])
    if {"1x2", "2x1"} <= results.keys():
        one, two = results["1x2"], results["2x1"]
        print(f"images/s, 2 ranks x 1 thread / 1 process x 2 threads: {two['img_per_s'] / one['img_per_s']:.3f}")
        print(f"peak PSS, 2 ranks / 1 process: {two['peak_pss_trainers_mib'] / one['peak_pss_trainers_mib']:.3f} "
              f"(with the launcher: {two['peak_pss_tree_mib'] / one['peak_pss_tree_mib']:.3f})")
    if "2x1" in results:
        two = results["2x1"]
        print(f"communication per step on 2 ranks: {two['collectives_ms_per_step']} ms of a {two['step_ms']} ms step")
    print("command: .venv/bin/python benchmarks/distributed.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
