"""What the tests that start torchrun launches share: the processes' environment, kontrast's own lines in their
stderr, a free port for a rendezvous, and killing a launch whole."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from support import ROOT


def process_env(faults: str = "") -> dict:
    """This process's environment for a launch: kontrast from this tree, one OpenMP thread, ``KONTRAST_FAULTS`` as
    given (none by default), and no ``WORLD_SIZE`` left over (it would make a plain run join a process group)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", KONTRAST_FAULTS=faults)
    env.pop("WORLD_SIZE", None)
    return env


def kontrast_lines(stderr: str) -> list[str]:
    """kontrast's lines (torchrun's agent logs its own, prefixed with a level letter and a date)."""
    return [line for line in stderr.splitlines() if line.startswith(("error:", "stopped:", "warning:"))]


def free_port() -> int:
    """A TCP port on localhost nothing listens on now (for a c10d rendezvous endpoint)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), children first. torchrun's agent starts each worker in a session
    of its own, so killing the agent's process group leaves the worker running."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:  # the task ended meanwhile
                continue
            found += children
            todo += children
    return found


def kill_whole(pid: int) -> list[int]:
    """SIGKILL ``pid``'s process group and every process below it, as a machine that is lost takes all of them;
    the processes below, as they were."""
    below = descendants(pid)  # read first: once the agent is gone its workers are the init process's children
    os.killpg(pid, signal.SIGKILL)
    for child in below:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return below


def running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, ended and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
