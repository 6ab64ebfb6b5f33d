"""A node lost and found, and a job that restarts itself (docs/distributed.md, "Faults").

Two torchrun agents on this machine stand in for two nodes of one process each (c10d rendezvous on localhost), as
in the several-node launch the docs give; ``--resume auto`` is the one command every attempt of a job runs (a
requeued SLURM job, torchrun's ``--max-restarts``). The toy run of test_distributed.py's fault tests: SimCLR,
16 steps of 12 images on 2 processes, a checkpoint after every step, fp32. A resumed run does the same
arithmetic on the same two processes as the uninterrupted one, so the two must agree bit for bit.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kontrast.checkpoint import latest_checkpoint
from support import floors
from support.args import HANG_LIMIT
from support.processes import free_port, kill_whole, kontrast_lines, process_env, running

pytestmark = pytest.mark.lifecycle
WAIT = "train.collective_timeout=10"  # how long the survivor waits at a collective for a lost peer


def _args(out: Path, *extra: str) -> list[str]:
    args = ["--method", "simclr", "--data", "shapes:96", "--epochs", "2", "--batch-size", "12", "--out", str(out),
            "--no-progress"]
    for item in ["data.size=16", "encoder.width=0.0625", "train.log_every=1", "train.num_threads=1",
                 "train.checkpoint_every=1", "train.precision=fp32", *extra]:
        args += ["--set", item]
    return args


def _nodes(out: Path, *flags: str, faults: tuple[str, str] = ("", ""), extra: tuple[str, ...] = (HANG_LIMIT,)):
    """Two torchrun agents of one process each, joined by a c10d rendezvous; each in its own session (its worker
    starts one more: :func:`support.processes.kill_whole` kills a node whole)."""
    port = free_port()
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", f"kontrast-{port}",
            "-m", "kontrast.cli", "train", *_args(out, *extra), *flags]
    return [subprocess.Popen(node, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=process_env(f),
                             start_new_session=True) for f in faults]


def _finish(agents, timeout: float = 300) -> list[str]:
    """Each agent's stderr once it ends; asserts both ended well."""
    errors = [agent.communicate(timeout=timeout)[1] for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], errors[0][-2000:] + errors[1][-2000:]
    return errors


def test_a_lost_node_ends_the_other_and_both_resume_bit_for_bit(tmp_path):
    """The second node stops after step 3 (its process stalls, as a node does before it drops) and is then
    killed whole with SIGKILL; the first node's process sees its peer gone at its next collective and ends, within
    the collective timeout, with one line naming the last good checkpoint (step 2: step 3's needs both ranks).
    The same two-node command with ``--resume auto`` then ends bit for bit where an uninterrupted two-node run ends."""
    run = tmp_path / "run"
    first, second = _nodes(run, faults=("", "stall_after_step=3"), extra=(WAIT,))
    deadline = time.monotonic() + 240
    while latest_checkpoint(run) is None or latest_checkpoint(run).name != "step-00000002":
        assert time.monotonic() < deadline and first.poll() is None, "the run never reached its step-2 checkpoint"
        time.sleep(0.2)
    time.sleep(1.0)  # the second node's process reaches its stall (after step 3) within this, the first waits
    lost = kill_whole(second.pid)  # the node lost: its agent and its process at once (the process has a session of
    killed = time.monotonic()  # its own: killing the agent's group alone left it stalled for good, an orphan)
    second.wait(timeout=30)
    while any(map(running, lost)):  # SIGKILL is delivered, not awaited
        assert time.monotonic() < killed + 10, [pid for pid in lost if running(pid)]
        time.sleep(0.1)
    assert lost
    stderr = first.communicate(timeout=120)[1]
    took = time.monotonic() - killed
    assert first.returncode != 0, stderr[-2000:]
    assert took < 10 + 30, f"the surviving node took {took:.0f} s to end (collective timeout 10 s)"
    lines = [line for line in kontrast_lines(stderr) if line.startswith("stopped:")]
    assert len(lines) == 1, stderr[-3000:]
    # step 4 when the second node had reached its stall when killed; step 3 on a machine so loaded that it had not
    assert re.search(r"another process of the run stopped or stalled during step [34] ", lines[0]), lines
    assert f"last good checkpoint: {run}/checkpoints/step-00000002" in lines[0], lines
    assert lines[0].endswith(f"continue with: the same command on every node, with --resume (--out {run})"), lines
    assert latest_checkpoint(run).name == "step-00000002"

    _finish(_nodes(run, "--resume", "auto"))  # the node found: both agents again, the one command of every attempt
    whole = tmp_path / "whole"
    _finish(_nodes(whole))
    diff = floors.difference(run, whole)
    assert diff.loss == diff.weights == 0.0  # bit for bit: the same two processes, the same arithmetic


def _standalone(out: Path, faults: str = "") -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 --max-restarts 1 ... --resume auto``: the job restarts itself."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts",
           "1", "-m", "kontrast.cli", "train", *_args(out, HANG_LIMIT), "--resume", "auto"]
    return subprocess.run(cmd, capture_output=True, text=True, env=process_env(faults), timeout=600)


def test_a_rank_killed_once_restarts_and_resume_auto_continues_bit_for_bit(tmp_path):
    """Rank 1 is SIGKILLed after step 3 in the first attempt only; torchrun (``--max-restarts 1``) restarts both
    processes with the same command, they form their group again (their own store prefix: train/distributed.py),
    ``--resume auto`` finds the step-2 checkpoint and continues, and the job ends well, bit for bit where an
    uninterrupted one (the same command, which starts the run) ends."""
    run = _standalone(tmp_path / "run", "kill_after_step=3,rank=1,restart=0")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "resuming from step 2 of 16" in run.stdout, run.stdout[-3000:]
    whole = _standalone(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert "resuming" not in whole.stdout  # no checkpoint: auto started the run
    diff = floors.difference(tmp_path / "run", tmp_path / "whole")
    assert diff.loss == diff.weights == 0.0
