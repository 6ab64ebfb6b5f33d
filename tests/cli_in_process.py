"""The CLI in the test's own process, shared by the tests that train through it."""

from __future__ import annotations

import torch

from kontrast.cli import main


def in_process(args: list[str], monkeypatch, faults: str = "") -> int:
    """The CLI in this process (saves a fresh interpreter where no process-level behaviour is tested), with
    ``KONTRAST_FAULTS`` set for the call and the thread count restored after it."""
    threads = torch.get_num_threads()
    monkeypatch.setenv("KONTRAST_FAULTS", faults)
    try:
        return main(args)
    finally:
        torch.set_num_threads(threads)
        monkeypatch.delenv("KONTRAST_FAULTS")
