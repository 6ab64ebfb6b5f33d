"""Exact resume, end to end through the CLI: SIGTERM / SIGINT at an epoch boundary, ``kill -9``
mid-epoch, a crash while a checkpoint is half written. Each interrupted run, resumed in new
processes, must end bit for bit where the uninterrupted run ends (weights, optimizer, loss per
step), and see every sample exactly once per epoch.

Faults are injected with ``KONTRAST_FAULTS`` (kontrast/train/faults.py): the process signals or
SIGKILLs itself after a chosen step, which is what an outside ``kill`` does, at a known step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from support.args import train_command
from support.cli import in_process

N, BATCH, EPOCHS = 48, 16, 2  # 3 steps per epoch, 6 in all
STEPS_PER_EPOCH = N // BATCH
SETTINGS = {
    "simclr": [],
    "moco_v2": ["--set", "method.queue_size=64"],
    "byol": [],
    "simclr+accumulate": ["--accumulate", "4"],  # gradient caching: 4 micro-batches of 4
}


def train_args(method: str, out: Path) -> list[str]:
    return train_command(out, *SETTINGS[method], method=method.split("+")[0], data=f"shapes:{N}", epochs=EPOCHS,
                         batch=BATCH,
                         settings=["train.log_every=1", "train.checkpoint_every=2"])


def run_cli(args: list[str], faults: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "KONTRAST_FAULTS": faults, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "kontrast.cli", *args], capture_output=True, text=True, env=env)


def loss_trace(run: Path) -> list[dict]:
    """Every logged step's metrics, without the wall-clock throughput."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k != "img_per_s"} for line in lines]


def index_trace(path: Path) -> dict[int, dict]:
    """step -> {epoch, indices}; a step written twice (killed, then redone) keeps the later record,
    which must equal the earlier one anyway (checked)."""
    out: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        step = record.pop("step")
        if step in out:
            assert out[step] == record, f"step {step} saw different data when redone"
        out[step] = record
    return out


def final_state(run: Path) -> dict[str, torch.Tensor]:
    ckpt = run / "checkpoints" / f"step-{EPOCHS * STEPS_PER_EPOCH:08d}"
    model = load_file(str(ckpt / "model.safetensors"))
    opt = load_file(str(ckpt / "optimizer.safetensors"))
    return {**{f"model.{k}": v for k, v in model.items()}, **{f"opt.{k}": v for k, v in opt.items()}}


def assert_same_run(run: Path, ref: Path, trace: Path, ref_trace: Path) -> None:
    a, b = final_state(run), final_state(ref)
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{len(differ)} tensors differ from the uninterrupted run, e.g. {differ[:3]}"
    assert loss_trace(run) == loss_trace(ref)  # every step's loss, embedding_std, lr: bit for bit
    steps, ref_steps = index_trace(trace), index_trace(ref_trace)
    assert steps == ref_steps and sorted(steps) == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))
    for epoch in range(EPOCHS):
        seen = [i for r in steps.values() if r["epoch"] == epoch for i in r["indices"]]
        assert sorted(seen) == list(range(N)), f"epoch {epoch}: a sample was skipped or repeated"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs, one per method, built on first use."""
    root = tmp_path_factory.mktemp("reference")
    cache: dict[str, tuple[Path, Path]] = {}

    def get(method: str, monkeypatch) -> tuple[Path, Path]:
        if method not in cache:
            out, trace = root / method, root / f"{method}.trace"
            assert in_process(train_args(method, out), f"trace={trace}") == 0
            cache[method] = out, trace
        return cache[method]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("method, sig", [("simclr", "TERM"), ("moco_v2", "TERM"), ("byol", "INT")])
def test_interrupted_runs_resume_bit_for_bit(method, sig, reference, tmp_path, monkeypatch):
    """SIGTERM (SIGINT for BYOL) at the epoch boundary -> exit 143 (130) with a checkpoint; resume in a
    new process, ``kill -9`` mid-epoch 2 -> resume from the step checkpoint -> the uninterrupted run."""
    ref, ref_trace = reference(method, monkeypatch)
    out, trace = tmp_path / "run", tmp_path / "trace"
    args = train_args(method, out)

    proc = run_cli(args, f"signal_after_step={STEPS_PER_EPOCH},signal={sig},trace={trace}")
    code = {"TERM": 143, "INT": 130}[sig]
    assert proc.returncode == code, proc.stderr
    assert f"SIG{sig} after step {STEPS_PER_EPOCH}" in proc.stderr and "--resume" in proc.stderr
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step-00000002", "step-00000003"]

    proc = run_cli([*args, "--resume"], f"kill_after_step=5,trace={trace}")  # killed after step 5, mid-epoch
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step-00000003", "step-00000004"]
    assert max(json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()) == 5

    proc = run_cli([*args, "--resume"], f"trace={trace}")  # from step 4: step 5 is redone
    assert proc.returncode == 0, proc.stderr
    assert_same_run(out, ref, trace, ref_trace)


@pytest.mark.slow
def test_a_signal_between_micro_batches_ends_the_step_and_resumes_bit_for_bit(reference, tmp_path, monkeypatch):
    """Under ``--accumulate 4`` SIGTERM between the first two micro-batches of step 4: the step ends, its checkpoint is
    written, exit 143; the resumed run ends where the uninterrupted one ends, bit for bit."""
    ref, ref_trace = reference("simclr+accumulate", monkeypatch)
    out, trace = tmp_path / "run", tmp_path / "trace"
    args = train_args("simclr+accumulate", out)
    proc = run_cli(args, f"signal_in_step=4,trace={trace}")
    assert proc.returncode == 143, proc.stderr
    assert "SIGTERM after step 4" in proc.stderr and "--resume" in proc.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir())[-1] == "step-00000004"
    proc = run_cli([*args, "--resume"], f"trace={trace}")
    assert proc.returncode == 0, proc.stderr
    assert_same_run(out, ref, trace, ref_trace)


@pytest.mark.slow
def test_crash_while_writing_a_checkpoint(reference, tmp_path, monkeypatch):
    """SIGKILL with the step-4 checkpoint half written: only a temporary folder is left, --resume takes
    step 3 (the newest complete one), removes the debris, and still ends where the clean run ends."""
    ref, ref_trace = reference("simclr", monkeypatch)
    out, trace = tmp_path / "run", tmp_path / "trace"
    args = train_args("simclr", out)
    proc = run_cli(args, f"kill_in_checkpoint=4,trace={trace}")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    entries = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert entries[0].startswith(".tmp-step-00000004") and entries[1:] == ["step-00000002", "step-00000003"]
    (partial,) = [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    assert [p.name for p in partial.iterdir()] == ["model.safetensors"]  # half a checkpoint

    proc = run_cli([*args, "--resume"], f"trace={trace}")
    assert proc.returncode == 0, proc.stderr
    assert not any(p.name.startswith(".tmp") for p in (out / "checkpoints").iterdir())
    assert_same_run(out, ref, trace, ref_trace)


def test_same_seed_same_weights_and_another_seed_differs(reference, tmp_path, monkeypatch):
    """Determinism on CPU: a second run with the seed is bitwise equal; another seed is not."""
    ref, ref_trace = reference("simclr", monkeypatch)
    again = tmp_path / "again"
    assert in_process(train_args("simclr", again)) == 0
    a, b = final_state(again), final_state(ref)
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = tmp_path / "other"
    assert in_process([*train_args("simclr", other), "--set", "train.seed=1"]) == 0
    c = final_state(other)
    assert any(not torch.equal(c[k], a[k]) for k in a if k.startswith("model."))
