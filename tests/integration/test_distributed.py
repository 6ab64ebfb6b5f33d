"""Distributed training (docs/distributed.md): W processes on a global batch compute what one process computes.

Every run here is launched the way a user launches one, ``kontrast train --nproc W`` (torchrun underneath,
gloo on CPU): tiny encoders, 16-px images, three steps.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kontrast.checkpoint import latest_checkpoint
from kontrast.methods import METHODS
from support import ROOT, floors
from support.args import HANG_LIMIT
from support.cli import cli_run
from support.processes import free_port, process_env
from support.processes import kontrast_lines as _ours
from support.sizes import rank_settings

DISTRIBUTED = [name for name in METHODS.names() if METHODS.get(name).needs.processes]
# Every comparison of runs here is within a floor measured beside it (tests/support/floors.py): the same run with its
# weights nudged one ulp. The methods keep their own learning rates; what each setting below changes is said beside it,
# and docs/lab/tolerances.md has the measured differences and floors.
# Small heads where a method's are wide (time), the same on both sides of every comparison: support/sizes.py (`ranks`).
# Shuffling BN needs groups of 6 samples here: in groups of 3 (16-px images: 2 x 2 maps in the last stage, so 12
# values per channel) BN amplifies rounding.
BATCH = {"moco_v1": 24, "moco_v2": 24}
# Steps per run: 3, so that queues, EMA targets and memory banks carry one step's state into the next twice. (In
# float32, BYOL, InstDisc, DCL and DCLW took 2: a one-ulp nudge grew past a ten-thousandth of the weights by the third
# step. In float64 it grows from 1e-16 and stays far below: docs/lab/tolerances.md.)
STEPS = 3
# NCHW: channels_last (`train.channels_last=true`) lets oneDNN pick its convolution algorithm by batch size, and this
# toy scale amplifies the rounding: SimCLR v2 after 3 steps, 1 process at 1 thread against 2 threads, differs by
# 2.7e-4 in weights in channels_last and by 1e-7 in NCHW; SimCLR on 3 ranks against 1, 3.7e-5 and 1e-7. The
# distributed code does not depend on the layout.
LAYOUT = "train.channels_last=false"
# fp64 (tests/support/floors.py): in float32 one kernel set's rounding carried an activation across a kink in four
# comparisons; auto would pick bf16 on a CPU with native bf16 (AMX, AVX512-BF16), whose rounding training amplifies
# past any floor (SimCLR on 2 ranks against 1: losses 0.27 apart after 16 steps of the fault runs)
PRECISION = floors.PRECISION
DATA = {"cpc": "sequences:48", "moco_v1": "shapes:96", "moco_v2": "shapes:96"}


def _args(out: Path, name: str, *extra: str, batch: int = 12) -> list[str]:
    args = ["--method", name, "--data", DATA.get(name, "shapes:48"), "--epochs", "1", "--batch-size", str(batch),
            "--out", str(out), "--no-progress"]
    for item in ["data.size=16", f"data.limit={STEPS * batch}", "encoder.width=0.0625",
                 "train.log_every=1", "train.num_threads=1", LAYOUT, PRECISION, HANG_LIMIT, *rank_settings(name),
                 *extra]:
        args += ["--set", item]
    return args


def _train(out: Path, name: str, nproc: int, *extra: str, batch: int = 12) -> subprocess.CompletedProcess:
    """``kontrast train ... --nproc N`` as a user runs it, in this process at every N: the workers are forked from
    the launcher's fork server, a process on one thread, not from this one (docs/distributed.md, "Launch" and "A
    process that never joins")."""
    return cli_run(["train", *_args(out, name, *extra, batch=batch), "--nproc", str(nproc)])


def _why(stderr: str) -> str:
    """A failed run's stderr for an assertion: the workers' errors and tracebacks first, then the tail."""
    keep = [line for line in stderr.splitlines() if line.startswith(("error:", "stopped:", "Traceback", "  File"))
            or "Error" in line.split(":")[0]]
    return "\n".join(keep)[-3000:] + "\n--- tail ---\n" + stderr[-1000:]


def _nudged(out: Path, name: str, *extra: str, batch: int = 12) -> subprocess.CompletedProcess:
    """One process with every weight nudged one ulp before its first step: a floor's run (tests/support/floors.py)."""
    return cli_run(["train", *_args(out, name, *extra, batch=batch)], faults=floors.NUDGE)


def test_collectives_gather_and_global_batch_norm():
    """The gather's gradient is the analytic one (summed over ranks), a non-contiguous input keeps its gradient,
    and BN over the ranks' slices equals BN over the global batch."""
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
                          str(ROOT / "tests/support/collectives.py")], capture_output=True, text=True,
                         env=process_env(), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    reports = [json.loads(line) for line in run.stdout.splitlines() if line.startswith('{"rank"')]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2]  # every rank ran every check below and printed it
    for report in reports:
        assert len(report["passed"]) == 16 and "gather gradient" in " ".join(report["passed"]), report
        assert sum("running stats" in what for what in report["passed"]) == 2, report  # BatchNorm2d and 1d


@pytest.mark.parametrize("name", DISTRIBUTED)
def test_two_processes_equal_one_on_the_global_batch(name, tmp_path):
    """3 steps on 2 ranks with global batch 12 = 3 steps on one process with batch 12 (float64; losses and weights
    within the floor of tests/support/floors.py)."""
    batch = BATCH.get(name, 12)
    runs = {"one": _train(tmp_path / "one", name, 1, batch=batch),
            "two": _train(tmp_path / "two", name, 2, batch=batch),
            "nudged": _nudged(tmp_path / "nudged", name, batch=batch)}
    for key, run in runs.items():
        assert run.returncode == 0, (key, _why(run.stderr))
    assert len(floors.losses(tmp_path / "two")) == STEPS
    # Under shuffling BN (MoCo v1/v2, InfoMin) each rank's BN running statistics follow its own groups, as each
    # GPU's do in MoCo's code; one process runs every group through the same layers. They never enter training
    # (batch statistics there); the checkpoint holds rank 0's.
    own_groups = not METHODS.get(name).needs.sync_bn
    floors.assert_runs_agree(tmp_path / "one", tmp_path / "two", tmp_path / "nudged", f"{name}: 2 ranks vs 1",
                             not own_groups)


# Gradient caching (train.accumulate, kontrast/micro_batches.py): K micro-batches on a process are K processes without
# synchronised BN. BN running statistics are left out of the weights compared: a process keeps its own (the checkpoint
# holds rank 0's), while micro-batches update the one set in turn (tests/unit/train/test_micro_batches.py checks them).
# The 4-way runs (global batch 24) with InfoMin's 4 BN groups per view (one per process or micro-batch: groups of 6).
MICRO = {"infomin": ["method.bn_groups=4"]}
# The micro-batch runs take 2 steps: the first fills the tests' queues or half of them (support/sizes.py), so the second
# step reads the state the first one left. (In float32 BN over unsynchronised micro-batches of 6 made the third step
# divergent, and five methods' second; float64 keeps every floor at rounding: docs/lab/tolerances.md.)
MICRO_STEPS = 2


def _micro(out: Path, name: str, nproc: int, *extra: str, batch: int = 12,
           nudge: bool = False) -> subprocess.CompletedProcess:
    """``name`` on ``nproc`` processes without synchronised BN; ``batch`` 24: the 4-way runs (shapes:96);
    ``nudge``: one process, weights nudged (the floor's run)."""
    if batch == 24:
        extra = (*extra, *MICRO.get(name, []), f"data.source={'sequences' if name == 'cpc' else 'shapes'}:96")
    extra = (*extra, f"data.limit={MICRO_STEPS * batch}")
    if nudge:
        return _nudged(out, name, "train.sync_bn=false", *extra, batch=batch)
    return _train(out, name, nproc, "train.sync_bn=false", *extra, batch=batch)


@pytest.mark.parametrize("name", DISTRIBUTED)
def test_micro_batches_equal_processes_without_synchronised_bn(name, tmp_path):
    """``--accumulate 2`` on one process = ``--nproc 2`` with ``train.sync_bn=false``, and ``--nproc 2 --accumulate 2``
    = ``--nproc 4``, on the same global batches (float64: losses and every weight, target and queue within the floor of
    tests/support/floors.py; each pair's floor from a one-process run of its micro-batches and its nudged twin)."""
    batch = BATCH.get(name, 12)
    runs = {"acc": _micro(tmp_path / "acc", name, 1, "train.accumulate=2", batch=batch),
            "two": _micro(tmp_path / "two", name, 2, batch=batch),
            "acc_nudged": _micro(tmp_path / "acc_nudged", name, 1, "train.accumulate=2", batch=batch, nudge=True),
            # steps of 24: 6 samples per process or micro-batch
            "two_acc": _micro(tmp_path / "two_acc", name, 2, "train.accumulate=2", batch=24),
            "four": _micro(tmp_path / "four", name, 4, batch=24),
            "acc4": _micro(tmp_path / "acc4", name, 1, "train.accumulate=4", batch=24),
            "acc4_nudged": _micro(tmp_path / "acc4_nudged", name, 1, "train.accumulate=4", batch=24, nudge=True)}
    for key, run in runs.items():
        assert run.returncode == 0, (key, _why(run.stderr))
    assert f"gradient caching: the batch of {batch} in 2 micro-batches of {batch // 2}" in runs["acc"].stdout
    floor = {k: floors.difference(tmp_path / k, tmp_path / f"{k}_nudged", bn_statistics=False) for k in ("acc", "acc4")}
    for a, b, base in (("acc", "two", "acc"), ("two_acc", "four", "acc4"), ("acc4", "four", "acc4")):
        assert len(floors.losses(tmp_path / a)) == MICRO_STEPS
        diff = floors.difference(tmp_path / a, tmp_path / b, bn_statistics=False)
        floors.assert_agree(diff, floor[base], f"{name}: {a} vs {b}")


def test_three_processes_equal_one():
    """An odd world size (3 ranks of 4 samples)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        one, three = _train(tmp / "one", "simclr", 1), _train(tmp / "three", "simclr", 3)
        nudged = _nudged(tmp / "nudged", "simclr")
        assert one.returncode == 0 and three.returncode == 0 and nudged.returncode == 0, three.stderr[-2000:]
        floors.assert_runs_agree(tmp / "one", tmp / "three", tmp / "nudged", "simclr: 3 ranks vs 1")


def test_two_nodes_joined_by_torchrun_rendezvous_equal_one_process(tmp_path):
    """The several-node launch of docs/distributed.md (torchrun on every node, c10d rendezvous), with two torchrun
    agents on this machine standing in for two nodes of one process each."""
    port = free_port()
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "kontrast-test",
            "-m", "kontrast.cli", "train", *_args(tmp_path / "two", "simclr")]
    agents = [subprocess.Popen(node, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=process_env())
              for _ in range(2)]
    errors = [agent.communicate(timeout=300)[1] for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], errors[0][-2000:] + errors[1][-2000:]
    one, nudged = _train(tmp_path / "one", "simclr", 1), _nudged(tmp_path / "nudged", "simclr")
    assert one.returncode == 0 and nudged.returncode == 0, one.stderr[-2000:]
    floors.assert_runs_agree(tmp_path / "one", tmp_path / "two", tmp_path / "nudged",
                             "simclr: 2 nodes vs 1 process")


BIND = """
import json, os, threading, torch
from kontrast.train.distributed import bind_cores
torch.set_num_threads({threads})
before = sorted(os.sched_getaffinity(0))
bound = bind_cores()
seen = []
worker = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))  # started after: inherits
worker.start(); worker.join()
print(json.dumps([before, sorted(bound) if bound is not None else None, sorted(os.sched_getaffinity(0)), seen[0]]))
"""


@pytest.mark.lifecycle
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's (os.sched_setaffinity)")
@pytest.mark.parametrize("world, rank, threads", [(2, 0, 1), (2, 1, 1), (1, 0, 1), (2, 1, 64)])
def test_bind_cores_gives_each_local_rank_its_own_cores_where_they_fit(world, rank, threads):
    env = dict(process_env(), LOCAL_WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    run = subprocess.run([sys.executable, "-c", BIND.format(threads=threads)], capture_output=True, text=True, env=env,
                         timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    before, bound, after, thread = json.loads(run.stdout)
    if world > 1 and world * threads <= len(before):
        assert bound == after == thread == before[rank * threads: (rank + 1) * threads]
    else:  # one process on the node, or the ranks' threads do not fit: left to the scheduler
        assert bound is None and after == thread == before


def test_batch_must_divide_by_the_processes(tmp_path):
    run = _train(tmp_path / "run", "simclr", 2, batch=13)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert lines == ["error: train.batch_size (13) is the global batch and must divide by the number of processes "
                     "(2); use a multiple of 2"], run.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_moco_bn_groups_must_divide_by_the_processes(tmp_path):
    run = _train(tmp_path / "run", "moco_v2", 3, "method.bn_groups=4", "method.queue_size=48")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: config key 'method.bn_groups' (4) must divide by the number of processes (3): each process forwards "
        "bn_groups / 3 BN groups"]


def test_a_method_not_verified_across_ranks_is_refused(monkeypatch):
    """A method joins the distributed set by declaring ``needs = Needs(processes=True)`` once it passes the test
    above."""
    import dataclasses

    from kontrast.decisions import decide
    from kontrast.errors import UserError
    from kontrast.methods.build import resolve

    cls = METHODS.get("simclr")
    monkeypatch.setattr(cls, "needs", dataclasses.replace(cls.needs, processes=False))
    cfg = resolve({"method": {"name": "simclr"}, "train": {"batch_size": 12}})
    decide(cfg, 1)  # one process: any method
    with pytest.raises(UserError,
                       match=r"^method 'simclr' does not run on several processes yet \(docs/distributed.md"):
        decide(cfg, 2)


def test_cpc_pools_must_not_span_processes(tmp_path):
    run = _train(tmp_path / "run", "cpc_v2", 2, "method.negative_pool=4")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: cpc_v2: config key 'method.negative_pool' (4) must divide the batch of each process (12 / 2 = 6) so "
        "that no pool of samples spans two processes; choose a method.negative_pool that divides it (e.g. 3)"]


def _faulty(out: Path, faults: str, *extra: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = dict(process_env(), KONTRAST_FAULTS=faults)
    args = ["--method", "simclr", "--data", "shapes:96", "--epochs", "2", "--batch-size", "12", "--out", str(out),
            "--no-progress", "--nproc", "2", *flags]
    for item in ["data.size=16", "encoder.width=0.0625", "train.log_every=1", "train.num_threads=1",
                 "train.checkpoint_every=1", PRECISION, HANG_LIMIT, *extra]:
        args += ["--set", item]
    return subprocess.run([sys.executable, "-m", "kontrast.cli", "train", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.lifecycle
def test_a_killed_rank_ends_the_run_and_resume_continues_bit_for_bit(tmp_path):
    """SIGKILL to rank 1 after step 3: rank 0 stops at its next collective (with one line, if torchrun's SIGTERM
    does not end it first), the launcher names rank 1 and exits 1, checkpoint 2 (the last complete one) stays, and
    --resume ends where an uninterrupted run ends."""
    import time

    t0 = time.monotonic()
    run = _faulty(tmp_path / "run", "kill_after_step=3,rank=1")
    assert time.monotonic() - t0 < 60
    assert run.returncode == 1, run.stderr[-2000:]
    # rank 0 says why it stopped when it sees the lost peer at its collective before torchrun's SIGTERM reaches it;
    # when the SIGTERM comes first it ends without a line (seen in CI): the launcher's line is there either way
    lines = _ours(run.stderr)
    assert 1 <= len(lines) <= 2, run.stderr[-2000:]
    assert lines[-1] == "error: the process of rank 1 ended the run (SIGKILL); torchrun stopped the others"
    if len(lines) == 2:
        assert lines[0].startswith("stopped: rank 0: another process of the run stopped or stalled during step 4 (")
        assert lines[0].endswith(f"last good checkpoint: {tmp_path / 'run'}/checkpoints/step-00000002; continue "
                                 f"with: kontrast train --out {tmp_path / 'run'} --resume --nproc 2")
    assert latest_checkpoint(tmp_path / "run").name == "step-00000002"
    resumed = _faulty(tmp_path / "run", "", flags=("--resume",))
    whole = _faulty(tmp_path / "whole", "")
    assert resumed.returncode == 0 and whole.returncode == 0, resumed.stderr[-2000:]
    diff = floors.difference(tmp_path / "run", tmp_path / "whole")
    assert diff.loss == diff.weights == 0.0  # bit for bit: the same processes, the same arithmetic


@pytest.mark.lifecycle
def test_a_stalled_rank_ends_the_run_after_the_collective_timeout(tmp_path):
    """Rank 1 stops making progress after step 3 without exiting: rank 0 waits ``train.collective_timeout`` (5 s
    here) at its next collective, then stops with one line naming the last good checkpoint; no hang."""
    import time

    t0 = time.monotonic()
    run = _faulty(tmp_path / "run", "stall_after_step=3,rank=1", "train.collective_timeout=5")
    assert time.monotonic() - t0 < 90
    assert run.returncode == 1, run.stderr[-2000:]
    lines = _ours(run.stderr)
    assert lines[0].startswith("stopped: rank 0: another process of the run stopped or stalled during step 4 ("), lines
    assert "last good checkpoint: " in lines[0] and lines[0].endswith("--resume --nproc 2"), lines
    assert lines[-1].startswith("error: the process of rank "), lines
    assert latest_checkpoint(tmp_path / "run").name == "step-00000002"  # step 3's needs every rank (as when killed)


@pytest.mark.lifecycle
def test_a_nan_on_one_rank_stops_or_skips_the_step_on_every_rank(tmp_path):
    run = _faulty(tmp_path / "stop", "nan_at_step=3,rank=1")
    assert run.returncode == 2, run.stderr[-2000:]
    # each rank stops itself at step 3: rank 1 on its own loss, rank 0 on the averaged gradient. Whichever exits
    # first makes torchrun stop the other, which may then end before it prints (seen in CI): one line or two
    lines = sorted(_ours(run.stderr))
    assert 1 <= len(lines) <= 2 and all("at step 3 (stopped at step 3; nothing after step 2 was saved)" in x
                                        for x in lines), run.stderr[-2000:]
    assert all(x.startswith(("error: non-finite gradient at step 3", "error: rank 1: non-finite loss at step 3"))
               for x in lines), lines
    assert latest_checkpoint(tmp_path / "stop").name == "step-00000002"
    skip = _faulty(tmp_path / "skip", "nan_at_step=3,rank=1", "train.nonfinite=skip")
    assert skip.returncode == 0, skip.stderr[-2000:]
    assert json.loads(skip.stdout.strip().splitlines()[-1])["skipped_steps"] == 1
    assert _ours(skip.stderr) == ["warning: non-finite loss or gradient at step 3; step skipped (1 in a row, 1 in all)"]


@pytest.mark.lifecycle
def test_sigterm_to_the_launcher_checkpoints_once_and_exits_143(tmp_path):
    """SIGTERM to the launcher once rank 0 logged 3 steps: every process stops after the same step and tells the
    launcher it checkpointed there, rank 0 writes that one checkpoint, and the launcher names the step and exits 143.
    The launcher is this process (``cli_run``): a fresh interpreter's imports and exit were most of this test's time,
    and on a busy machine they grew the most."""
    import signal
    import threading
    import time

    args = ["train", "--method", "simclr", "--data", "shapes:96", "--epochs", "40", "--batch-size", "12", "--out",
            str(tmp_path / "run"), "--no-progress", "--nproc", "2"]
    for item in ["data.size=16", "encoder.width=0.0625", "train.log_every=1", "train.num_threads=1", PRECISION,
                 HANG_LIMIT]:
        args += ["--set", item]
    metrics, ended = tmp_path / "run/metrics.jsonl", threading.Event()

    def sigterm_after_3_steps():  # torchrun's launcher takes the signal in this process's main thread
        deadline = time.monotonic() + 120
        while not ended.is_set() and time.monotonic() < deadline:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    sender = threading.Thread(target=sigterm_after_3_steps)
    sender.start()
    try:
        run = cli_run(args)
    finally:
        ended.set()
        sender.join()
    assert run.returncode == 143, _why(run.stderr)
    lines = _ours(run.stderr)
    assert len(lines) == 2 and lines[0].startswith("stopped: SIGTERM after step "), _why(run.stderr)
    step = int(lines[0].split("after step ")[1].split()[0])
    assert lines[1] == (f"stopped: SIGTERM to the launcher; every process checkpointed at step {step} and stopped; "
                        "continue with --resume")
    assert latest_checkpoint(tmp_path / "run").name == f"step-{step:08d}"
    assert [p.name for p in (tmp_path / "run/checkpoints").iterdir()] == [f"step-{step:08d}"]  # one, at the signal


def test_resume_at_another_world_size_continues(tmp_path):
    """A checkpoint of 2 ranks resumed on 1: the same steps and sample order, the losses and weights within the floor
    of the 2-rank run (tests/support/floors.py). One epoch of 4 steps, two of them after the resume: over the fault
    runs' 16 steps a one-ulp nudge grows to 8e-3 in weights (2e-3 over 8), divergence rather than rounding."""
    short = ("train.epochs=1", "data.limit=48")
    assert _faulty(tmp_path / "run", "kill_after_step=3,rank=1", *short).returncode == 1
    resumed = _faulty(tmp_path / "run", "", *short, flags=("--resume", "--nproc", "1"))
    whole, nudged = _faulty(tmp_path / "whole", "", *short), _faulty(tmp_path / "nudged", floors.NUDGE, *short)
    assert resumed.returncode == whole.returncode == nudged.returncode == 0, resumed.stderr[-2000:]
    assert len(floors.losses(tmp_path / "run")) == len(floors.losses(tmp_path / "whole")) == 4
    floors.assert_runs_agree(tmp_path / "whole", tmp_path / "run", tmp_path / "nudged",
                             "simclr: resumed on 1 rank vs 2 ranks")
