"""What the processes of ``kontrast train --nproc N`` tell their launcher: files in the launcher's folder for the run.

The launcher (:mod:`kontrast.train.launcher`) makes a temporary folder per launch and names it in
:data:`FOLDER_ENV` for its processes. A process writes there ``rank-R``, its input error (the launcher says it once
for all ranks), and, when a signal stopped the run, ``checkpointed-rank-R``: the step whose checkpoint it saw
complete before it stopped. The launcher then says "every process checkpointed" only when all N said so. Outside
such a launch (one process, or a plain ``torchrun``) nothing is written.
"""

from __future__ import annotations

import os
from pathlib import Path

FOLDER_ENV = "KONTRAST_LAUNCH_FOLDER"  # set by --nproc's launcher for its processes
CHECKPOINTED = "checkpointed-rank-"


def tell_launcher(name: str, text: str) -> bool:
    """Write ``text`` to the file ``name`` of the launcher's folder; False (nothing written) outside a launch."""
    folder = os.environ.get(FOLDER_ENV)
    if not folder or "RANK" not in os.environ:
        return False
    Path(folder, name).write_text(text)
    return True


def report_checkpointed(rank: int, step: int) -> None:
    """This process stopped on a signal after the checkpoint of ``step`` was complete."""
    tell_launcher(f"{CHECKPOINTED}{rank}", str(step))


def checkpointed(folder: Path) -> dict[int, int]:
    """The launcher's side: rank -> the step each process reported it checkpointed on the signal."""
    return {int(path.name[len(CHECKPOINTED):]): int(path.read_text()) for path in folder.glob(CHECKPOINTED + "*")}


def checkpoint_line(folder: Path, nproc: int) -> str:
    """What the processes reported on a signal, for the launcher's one line."""
    steps = checkpointed(folder)
    missing = [rank for rank in range(nproc) if rank not in steps]
    at = sorted(set(steps.values()))
    at_steps = f"step{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}"
    if not missing:
        return f"every process checkpointed at {at_steps} and stopped; continue with --resume"
    if len(missing) == nproc:
        return "no process reported a checkpoint; --resume continues from the newest complete checkpoint, if any"
    return (f"{_ranks(missing)} did not report a checkpoint ({_ranks(sorted(steps))} checkpointed at {at_steps}); "
            f"--resume continues from the newest complete checkpoint")


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
