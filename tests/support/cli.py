"""The CLI in the test's own process (saves a fresh interpreter where no process-level behaviour is tested)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile

import torch

from kontrast.cli import main


@contextlib.contextmanager
def patched_env(**values: str):
    """Environment variables set for the block and restored after it."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def in_process(args: list[str], faults: str = "") -> int:
    """``kontrast ARGS`` in this process with ``KONTRAST_FAULTS`` set for the call (the fault-injection hooks,
    kontrast.train.faults) and the thread count restored after it."""
    threads, environ = torch.get_num_threads(), dict(os.environ)
    try:
        with patched_env(KONTRAST_FAULTS=faults):
            return main(args)
    finally:
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(environ)  # --nproc's launcher sets OMP_NUM_THREADS for its workers: not for later tests


def cli_run(args: list[str], faults: str = "") -> subprocess.CompletedProcess:
    """``kontrast ARGS`` in this process as :func:`in_process`, with everything this process and its workers
    (``--nproc`` forks them from it) write to file descriptors 1 and 2 captured: a ``CompletedProcess`` like
    ``subprocess.run``'s, without a fresh interpreter's start-up (about 3 s of imports)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        saved = [os.dup(1), os.dup(2)]
        streams = sys.stdout, sys.stderr
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
        try:
            code = in_process(args, faults)
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            sys.stdout, sys.stderr = streams
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(["kontrast", *args], code, out.read(), err.read())
