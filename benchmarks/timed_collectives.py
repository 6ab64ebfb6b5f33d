"""The kontrast CLI with the time each process spends in torch.distributed collectives recorded.

Used by benchmarks/distributed.py as the module torchrun starts on each rank. Wraps the collectives the
training room calls through ``torch.distributed`` (all_gather_single and all_reduce of the BN
statistics, the gradient average, the metrics and the stop signal; broadcast; barrier) and, at exit,
writes ``{"rank": R, "calls": {name: [count, seconds]}}`` to ``$KONTRAST_COLLECTIVES_OUT.R.json``. The time
includes waiting for the other ranks to arrive. The embedding gathers (PyTorch's functional
collectives, asynchronous) are not wrapped.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

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


def main() -> None:
    calls: dict = {}
    for name in WRAPPED:
        setattr(dist, name, _timed(name, calls))
    rank, out = os.environ.get("RANK", "0"), os.environ["KONTRAST_COLLECTIVES_OUT"]
    atexit.register(lambda: open(f"{out}.{rank}.json", "w").write(json.dumps({"rank": int(rank), "calls": calls})))
    from kontrast.cli import main as cli

    sys.argv = ["kontrast", *sys.argv[1:]]
    sys.exit(cli())


if __name__ == "__main__":
    main()
