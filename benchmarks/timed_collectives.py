"""The kontrast CLI with the time each process spends in torch.distributed collectives recorded.

Used by benchmarks/distributed.py in place of ``kontrast``: ``timed_collectives.py train ... --nproc 2``.
Wraps the collectives the training room calls through ``torch.distributed`` (all_gather_single and
all_reduce of the BN statistics, the metrics and the stop signal; broadcast;
barrier) when this module is imported, in the launcher and in every process of ``--nproc`` (its fork
server imports the launcher's main module again for them), and when a process closes its process group it
writes ``{"rank": R, "calls": {name: [count, seconds]}}`` to
``$KONTRAST_COLLECTIVES_OUT.R.json``. The time
includes waiting for the other ranks to arrive. The embedding gathers (PyTorch's functional
collectives, asynchronous) are not wrapped, nor are DistributedDataParallel's gradient buckets (its C++ reducer
calls the process group itself): ``benchmarks/ddp_overlap.py`` measures what those cost a step.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

WRAPPED = ("all_gather_single", "all_reduce", "broadcast", "barrier")


def _timed(name: str, calls: dict):
    original = getattr(dist, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            entry = calls.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - start

    return timed


CALLS: dict = {}  # this process's {name: [count, seconds]}


def _install() -> None:
    """The timed collectives, and the record written as the process group closes (kontrast.train.distributed.close)."""
    for name in WRAPPED:
        setattr(dist, name, _timed(name, CALLS))
    out, destroy = os.environ["KONTRAST_COLLECTIVES_OUT"], dist.destroy_process_group

    def write_then_destroy(*args, **kwargs):
        rank = os.environ.get("RANK", "0")  # read here: the processes get their rank after this module ran
        Path(f"{out}.{rank}.json").write_text(json.dumps({"rank": int(rank), "calls": CALLS}))
        return destroy(*args, **kwargs)

    dist.destroy_process_group = write_then_destroy


if "KONTRAST_COLLECTIVES_OUT" in os.environ:
    _install()


def main() -> None:
    from kontrast.cli import main as cli

    sys.argv = ["kontrast", *sys.argv[1:]]
    sys.exit(cli())


if __name__ == "__main__":
    main()
