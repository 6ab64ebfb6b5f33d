"""End-to-end ``kontrast train`` runs in subprocesses, each measured alone.

Each run is its own process with an explicit thread count (``OMP_NUM_THREADS`` and the
run's own setting), so runs never share an OpenMP pool; its peak resident memory is the
child's ``ru_maxrss`` from ``os.wait4``. kontrast trains one epoch of ``steps`` batches
(``data.limit = steps x batch``); images/s is its ``summary.json`` figure (wall time of the
training loop, first step and the epoch-end checkpoint included) and, from ``metrics.jsonl``,
the steady rate without the first logging window. :func:`run_measured` runs any other command
the same way (benchmarks/vs_peer.py runs the peer baseline with it).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kontrast.bench.options import NUMERICS
from kontrast.errors import UserError

SETTINGS = {  # name -> kontrast train flags (auto: none, kontrast's default on this machine)
    name: ([] if precision == "auto"
           else ["--precision", precision, "--set", f"train.channels_last={str(layout).lower()}"])
    for name, (precision, layout) in NUMERICS.items()
}
SETTINGS["bf16_cl_compile"] = [*SETTINGS["bf16_cl"], "--set", "train.compile=true"]


def run_measured(cmd: list[str], threads: int, log: Path, timeout: float) -> tuple[int, float, float]:
    """Run ``cmd``; (exit status, wall seconds, peak RSS in MiB of that process)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                raise UserError(f"benchmark run timed out after {timeout:.0f} s: {shlex.join(cmd)} (log: {log})")
            time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait on a reaped child
    return proc.returncode, time.perf_counter() - start, usage.ru_maxrss / 1024  # ru_maxrss is KiB on Linux


def ours_command(data: str, *, method: str, steps: int, batch: int, width: float, encoder: str, threads: int,
                 setting: str, out: str, epochs: int = 1, device: str = "cpu") -> list[str]:
    """``kontrast train`` for ``steps`` steps (one epoch of ``steps x batch`` images), or ``epochs`` on all data."""
    limit = steps * batch if steps else 0
    cmd = [sys.executable, "-m", "kontrast.cli", "train", "--method", method, "--data", data,
           "--epochs", str(epochs), "--batch-size", str(batch), "--out", out, "--overwrite", "--no-progress",
           "--set", f"encoder.name={encoder}", "--set", f"encoder.width={width}",
           "--set", f"train.num_threads={threads}", "--set", f"data.limit={limit}", "--set", "train.log_every=5",
           "--set", f"train.device={device}", *SETTINGS[setting]]
    return cmd


def display(cmd: list[str]) -> str:
    """The command as a user would type it (``kontrast`` for our module, absolute paths kept)."""
    if cmd[:3] == [sys.executable, "-m", "kontrast.cli"]:
        cmd = ["kontrast", *cmd[3:]]
    return shlex.join(cmd)


def run_ours(cmd: list[str], threads: int, workdir: Path, timeout: float) -> dict:
    out = Path(cmd[cmd.index("--out") + 1])
    log = workdir / f"{out.name}.log"
    code, wall, rss = run_measured(cmd, threads, log, timeout)
    if code != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise UserError(f"kontrast train failed (exit {code}): {tail[0]}; command: {display(cmd)}")
    summary = json.loads((out / "summary.json").read_text())
    rates = [json.loads(line).get("img_per_s") for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r for r in rates if r is not None]
    steady = sum(rates[1:]) / len(rates[1:]) if len(rates) > 1 else summary["img_per_s"]
    return {"img_per_s": summary["img_per_s"], "img_per_s_steady": round(steady, 1), "steps": summary["steps"],
            "train_wall_s": summary["wall_s"], "process_wall_s": round(wall, 1), "peak_rss_mib": round(rss),
            "final_loss": summary.get("final_loss")}


def scratch_dir(root: str | None) -> Path:
    """Where run folders and logs go (``root`` or a new temporary folder)."""
    if root:
        Path(root).mkdir(parents=True, exist_ok=True)
        return Path(root)
    return Path(tempfile.mkdtemp(prefix="kontrast-bench-"))
