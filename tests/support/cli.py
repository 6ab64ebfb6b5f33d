"""The CLI in the test's own process (saves a fresh interpreter where no process-level behaviour is tested)."""

from __future__ import annotations

import contextlib
import os

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
    threads = torch.get_num_threads()
    try:
        with patched_env(KONTRAST_FAULTS=faults):
            return main(args)
    finally:
        torch.set_num_threads(threads)
