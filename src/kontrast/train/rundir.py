"""The run directory: what a run leaves on disk besides its checkpoints' contents.

``RUN/config.yaml`` (the resolved config), ``metrics.jsonl`` (one JSON line per logged step)
mirrored to ``tb/`` (TensorBoard), ``checkpoints/step-N/`` (written by :mod:`kontrast.checkpoint`,
with the generator states below) and ``summary.json``. An existing run is never replaced
without ``overwrite``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from kontrast.checkpoint import latest_checkpoint
from kontrast.errors import UserError

RUN_MARKERS = ("config.yaml", "checkpoints", "metrics.jsonl")


def holds_run(run_dir: Path) -> bool:
    return any((run_dir / m).exists() for m in RUN_MARKERS)


def check_run_dir(run_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber an existing run unless asked (checked before any work)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"output path {run_dir} is a file; choose a directory for --out")
    if holds_run(run_dir) and not (resume or overwrite):
        raise UserError(f"{run_dir} already holds a run; pass --resume to continue it or --overwrite to replace it")
    if resume and latest_checkpoint(run_dir) is None:  # before any data is read
        raise UserError(f"--resume: no complete checkpoint in {run_dir}/checkpoints; start a new run instead "
                        f"(without --resume)")


def resolve_resume(run_dir: Path, resume: bool | str, overwrite: bool) -> tuple[bool, bool]:
    """(resume, overwrite) for a run asked to ``resume`` (True, False or ``"auto"``). ``"auto"``: continue when
    ``run_dir`` has a complete checkpoint, start otherwise, replacing an attempt that ended before its first
    checkpoint (it holds no weights), so that one command serves every attempt of a job: a requeued SLURM job,
    torchrun's ``--max-restarts``. Every process of a launch decides alone, before the process group forms, from the
    same files (none is written before every rank has joined), so all decide alike."""
    if resume != "auto":
        return bool(resume), overwrite
    if overwrite:
        raise UserError("--resume auto and --overwrite contradict each other; keep --resume auto to continue the run "
                        "in --out when it has a checkpoint, or --overwrite to replace it")
    if latest_checkpoint(run_dir) is not None:
        return True, False
    return False, holds_run(run_dir)


def prepare_run_dir(run_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Create the run directory; ``overwrite`` clears an earlier run's files first."""
    if overwrite and not resume:
        for marker in (*RUN_MARKERS, "tb", "summary.json"):
            target = run_dir / marker
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)


class NullLog:
    """The metric log of a rank other than 0: writes nothing (rank 0 logs the ranks' means)."""

    def write(self, step: int, values: dict) -> None:
        pass

    def close(self) -> None:
        pass


class MetricLog:
    """One JSON line per logged step, mirrored to TensorBoard.

    ``resume_step``: when continuing a run, lines after that step (written by the interrupted
    process after its last checkpoint) are dropped, so the file holds each step once.
    """

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        path = run_dir / "metrics.jsonl"
        if resume_step is not None and path.exists():
            truncate_metrics(path, resume_step)
        self.file = open(path, "a")
        purge = None if resume_step is None else resume_step + 1  # hide TensorBoard events after the checkpoint
        self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=purge)

    def write(self, step: int, values: dict) -> None:
        self.file.write(json.dumps({"step": step, **values}) + "\n")
        self.file.flush()
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "epoch":
                self.tb.add_scalar(key, value, step)

    def close(self) -> None:
        self.file.close()
        self.tb.close()


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the lines of steps <= ``step`` (and drop a line a crash cut short); atomic rewrite."""
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("step", 0) <= step:
            kept.append(line + "\n")
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
