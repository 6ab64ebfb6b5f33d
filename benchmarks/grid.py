"""The speed grid: kontrast's default against the peer's default and best, SimCLR, widths x batches, one sitting.

For every cell (ResNet-18 CIFAR stem at --widths, global batch --batches), back to back: the peer
(../shared/bench/lightly_simclr.py) in each of --peer-settings and kontrast in each of --our-settings
(`auto` is kontrast's default: what `train.precision=auto` and `train.channels_last=auto` choose on this
machine). Each run is its own process (benchmarks/vs_peer.py's runners), 2 threads by default; images/s is
wall time over the run's steps (first step included on both sides). The peer's best is its fastest setting
in the cell. The target: ours at its default >= 1.0x the peer's best, and >= 1.2x where the peer
spends more than 20 % of its wall time outside its model step (1 - wall rate / compute rate: data loading and
augmentation; the head, loss and optimizer are inside, so this is a lower bound on its share outside the
encoder). Cells are appended to --results as they finish (a rerun skips cells already there); the markdown
table is printed at the end (--report: print it only). From the repository root:

    .venv/bin/python benchmarks/grid.py --peer-python PEER_VENV/bin/python --peer-data CIFAR10_DIR \
        --results benchmarks/results/grid.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import torch

from kontrast.bench import runs
from kontrast.bench.options import TRAIN_SETTINGS, BenchOptions
from kontrast.bench.report import train_run
from kontrast.precision import choose_precision, native_bf16

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_peer import SHARED, Peer, peer_command, relative, run_peer  # noqa: E402

PROG = (".venv/bin/python", "benchmarks/grid.py")


def target(peer_outside: float) -> float:
    return 1.2 if peer_outside > 0.2 else 1.0


def run_cell(opts: BenchOptions, peer: Peer, peer_settings, our_settings, work: Path) -> dict:
    cell: dict = {"width": opts.width, "batch": opts.batch, "steps": opts.steps, "peer": {}, "ours": {}}
    for setting in peer_settings:
        cell["peer"][setting] = run_peer(peer_command(peer, opts, setting, steps=opts.steps), opts, work,
                                         f"peer-{setting}")
        opts.log(f"  peer {setting:8s} {cell['peer'][setting]['img_per_s']:7.1f} img/s")
    for setting in our_settings:
        o = train_run(opts, setting, work)
        cell["ours"][setting] = {k: o[k] for k in ("img_per_s", "img_per_s_steady", "peak_rss_mib", "command")}
        opts.log(f"  ours {setting:8s} {o['img_per_s']:7.1f} img/s")
    best = max(cell["peer"], key=lambda s: cell["peer"][s]["img_per_s"])
    p = cell["peer"][best]
    cell["peer_best"] = best
    cell["peer_outside"] = round(1 - p["img_per_s"] / p["img_per_s_compute"], 3)
    if "auto" in cell["ours"]:
        cell["ours_vs_peer_best"] = round(cell["ours"]["auto"]["img_per_s"] / p["img_per_s"], 2)
        cell["target"] = target(cell["peer_outside"])
        cell["met"] = cell["ours_vs_peer_best"] >= cell["target"]
    return cell


def table(cells: list[dict]) -> str:
    rows = ["| width | batch | steps | peer fp32 (its default) | peer fp32 + channels_last | peer bf16 + channels_last "
            "| peer outside its model step | ours default | ours / peer best | target | |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in sorted(cells, key=lambda c: (c["width"], c["batch"])):
        def peer(s):
            if s not in c["peer"]:
                return "–"
            rate = f"{c['peer'][s]['img_per_s']:.1f}"
            return f"**{rate}**" if s == c["peer_best"] else rate
        ours = c["ours"].get("auto", {}).get("img_per_s")
        rows.append(f"| {c['width']:g} | {c['batch']} | {c['steps']} | {peer('fp32')} | {peer('fp32_cl')} | "
                    f"{peer('bf16_cl')} | {100 * c['peer_outside']:.0f} % | {ours if ours else '–'} | "
                    f"{c.get('ours_vs_peer_best', '–')}x | {c.get('target', '–')}x | "
                    f"{'met' if c.get('met') else 'NOT met'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=shlex.join(PROG), description=__doc__.splitlines()[0])
    data = SHARED / "data/cifar10-jpeg.tar.gz"
    p.add_argument("--data", default=os.environ.get("BENCH_DATA") or relative(data), help="kontrast's training source")
    p.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON"), help="python of the peer's venv")
    p.add_argument("--peer-data", default=os.environ.get("PEER_CIFAR10"), help="the extracted CIFAR-10 folder")
    p.add_argument("--peer-script",
                   default=os.environ.get("PEER_SCRIPT") or relative(SHARED / "bench/lightly_simclr.py"))
    p.add_argument("--widths", default="0.25,0.5,1")
    p.add_argument("--batches", default="128,256,512")
    p.add_argument("--steps", type=int, default=12, help="steps per run below width 1")
    p.add_argument("--steps-full-width", type=int, default=8, help="steps per run at width 1")
    p.add_argument("--peer-settings", default="fp32,fp32_cl", help=f"comma list of {', '.join(TRAIN_SETTINGS[:4])}")
    p.add_argument("--peer-bf16-widths", default="0.5", help="widths at which the peer also runs bf16_cl")
    p.add_argument("--our-settings", default="auto")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--results", default="benchmarks/results/grid.jsonl")
    p.add_argument("--workdir", help="run folders and logs (default: a new temporary folder)")
    p.add_argument("--report", action="store_true", help="print the table of --results only")
    a = p.parse_args(argv)
    results = Path(a.results)
    cells = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    machine = native_bf16("cpu")[1]
    chosen = choose_precision("auto", "auto", "cpu")[2]
    if not a.report:
        peer = Peer(a.peer_python, a.peer_data, a.peer_script)
        if (why := peer.ready()) is not None:
            print(f"error: {why}", file=sys.stderr)
            return 2
        work = runs.scratch_dir(a.workdir)
        results.parent.mkdir(parents=True, exist_ok=True)
        done = {(c["width"], c["batch"]) for c in cells}
        print(f"torch {torch.__version__}; {os.cpu_count()} CPUs, {a.threads} threads; kontrast's auto: {chosen}",
              flush=True)
        for width in (float(w) for w in a.widths.split(",")):
            for batch in (int(b) for b in a.batches.split(",")):
                if (width, batch) in done:
                    continue
                steps = a.steps_full_width if width >= 1 else a.steps
                opts = replace(BenchOptions(data=a.data, batch=batch, width=width, threads=a.threads, steps=steps,
                                            workdir=str(work)), log=lambda *x: print(*x, flush=True))
                print(f"== width {width:g}, batch {batch}, {steps} steps", flush=True)
                bf16 = ["bf16_cl"] if f"{width:g}" in a.peer_bf16_widths.split(",") else []
                cell = run_cell(opts, peer, a.peer_settings.split(",") + bf16, a.our_settings.split(","), work)
                cell["machine"], cell["load"] = machine, list(os.getloadavg())
                cells.append(cell)
                with results.open("a") as f:
                    f.write(json.dumps(cell) + "\n")
    print(f"\nkontrast's default on this machine: {chosen}")
    print(table(cells))
    print(f"\nreproduce: {shlex.join([*PROG, *(argv if argv is not None else sys.argv[1:])])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
