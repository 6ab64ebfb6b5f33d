"""What the tests that start torchrun launches share: the processes' environment, kontrast's own lines in their
stderr, a free port for a rendezvous."""

from __future__ import annotations

import os
import socket

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
