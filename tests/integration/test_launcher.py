"""``kontrast train --nproc N``'s launcher (docs/distributed.md, "Launch"): the fork server its processes are forked
from, what the processes tell it, and what it says."""

import multiprocessing.forkserver
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kontrast.train import launch
from support import ROOT
from support.cli import cli_run
from support.processes import kontrast_lines as _ours

LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is the Linux launch")


def _tiny(out: Path, nproc: int = 2, batch: int = 12) -> list[str]:
    args = ["train", "--method", "simclr", "--data", "shapes:48", "--epochs", "1", "--batch-size", str(batch), "--out",
            str(out), "--no-progress", "--nproc", str(nproc)]
    for item in ["data.size=16", "encoder.width=0.0625", "train.num_threads=1", "train.precision=fp32",
                 "train.collective_timeout=120"]:
        args += ["--set", item]
    return args


def _with_site(site: str, tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess:
    """``python -m kontrast.cli ARGS`` with ``site`` as the ``sitecustomize`` of every interpreter it starts."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(site)
    path = os.pathsep.join([str(tmp_path / "site"), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.run([sys.executable, "-m", "kontrast.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600)


THREADS_AT_FORK = """
import os, sys

def say_threads():
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    print(f"fork by {os.getpid()} ({os.getppid()}):", ",".join(sorted(names)), file=sys.stderr, flush=True)

os.register_at_fork(before=say_threads)
"""


@LINUX
def test_the_fork_server_forks_every_process_from_its_one_thread(tmp_path):
    """``--nproc 4``: the 4 processes are forked by one process, the fork server, a child of the launcher, with one
    thread at each fork; the launcher, whose torchrun threads run beside its main one, forks none."""
    run = _with_site(THREADS_AT_FORK, tmp_path, _tiny(tmp_path / "run", nproc=4, batch=24))
    assert run.returncode == 0, run.stderr[-2000:]
    forks = [line.split()[2:] for line in run.stderr.splitlines() if line.startswith("fork by ")]  # pid (ppid): names
    assert len(forks) == 4, run.stderr[-2000:]
    assert len({pid for pid, _, _ in forks}) == 1, forks  # one process forks them all ...
    assert all(parent != f"({os.getpid()}):" for _, parent, _ in forks), forks  # ... not the launcher (our child)
    assert all(len(names.split(",")) == 1 for _, _, names in forks), forks  # ... on its one thread


CRASH_ON_RANK_1 = """
import sys

if "multiprocessing.forkserver" in " ".join(sys.orig_argv):  # the fork server: the processes it forks have the patch
    import os
    import kontrast.train.loop as loop

    step = loop.Loop._one_step

    def crash_on_rank_1(self, *args):
        if os.environ.get("RANK") == "1" and self.step == 1:
            raise RuntimeError("a deliberate crash on rank 1")
        return step(self, *args)

    loop.Loop._one_step = crash_on_rank_1
"""


@LINUX
def test_a_crash_on_one_rank_is_named_in_the_launchers_line(tmp_path):
    """An exception in rank 1's step (a bug, not a user error): the launcher's last line names the rank and the
    exception; rank 0 stops at its next collective."""
    run = _with_site(CRASH_ON_RANK_1, tmp_path, _tiny(tmp_path / "run"))
    assert run.returncode == 1, run.stderr[-2000:]
    assert _ours(run.stderr)[-1] == ("error: the process of rank 1 ended the run (exit code 1: RuntimeError: a "
                                     "deliberate crash on rank 1); torchrun stopped the others"), run.stderr[-2000:]


@LINUX
def test_each_launch_gives_its_processes_the_launchers_environment_and_streams(tmp_path):
    """The fork server this process's first launch started serves the later ones: their processes still see the
    environment of their own launch (``KONTRAST_FAULTS`` here) and write to its output, not the first one's."""
    runs = []
    for name, faults in [("a", ""), ("b", "nan_at_step=2,rank=1"), ("c", "")]:
        runs.append(cli_run(_tiny(tmp_path / name), faults=faults))
        runs[-1].server = multiprocessing.forkserver._forkserver._forkserver_pid  # CPython's own attribute
    assert [run.returncode for run in runs] == [0, 2, 0], runs[1].stderr[-2000:]
    assert len({run.server for run in runs}) == 1
    assert all("data: 48 training images" in run.stdout for run in runs)  # rank 0's line, in its launch's output
    assert _ours(runs[0].stderr) == _ours(runs[2].stderr) == []
    assert any(line.startswith("error: rank 1: non-finite loss at step 2") for line in _ours(runs[1].stderr))


@pytest.mark.parametrize("nproc, reports, line", [
    (2, {0: 4, 1: 4}, "every process checkpointed at step 4 and stopped; continue with --resume"),
    (2, {0: 4}, "rank 1 did not report a checkpoint (rank 0 checkpointed at step 4); --resume continues from the "
                "newest complete checkpoint"),
    (4, {0: 7, 2: 7}, "ranks 1, 3 did not report a checkpoint (ranks 0, 2 checkpointed at step 7); --resume "
                      "continues from the newest complete checkpoint"),
    (2, {}, "no process reported a checkpoint; --resume continues from the newest complete checkpoint, if any")],
    ids=["all", "one-missing", "two-missing", "none"])
def test_the_launchers_line_on_a_signal_says_which_processes_checkpointed(tmp_path, nproc, reports, line):
    for rank, step in reports.items():
        (tmp_path / f"checkpointed-rank-{rank}").write_text(str(step))
    (tmp_path / "rank-1").write_text("an input error")  # another kind of file in the folder
    assert launch.checkpoint_line(tmp_path, nproc) == line


def test_a_process_reports_to_the_launcher_only_under_a_launch(tmp_path, monkeypatch):
    monkeypatch.delenv(launch.FOLDER_ENV, raising=False)
    monkeypatch.setenv("RANK", "1")
    launch.report_checkpointed(1, 5)  # a plain torchrun: no folder, nothing written
    monkeypatch.setenv(launch.FOLDER_ENV, str(tmp_path))
    launch.report_checkpointed(1, 5)
    assert launch.checkpointed(tmp_path) == {1: 5}
