"""Fault injection for the reliability tests: crashes, signals and NaNs at chosen steps.

A hook object handed to :func:`kontrast.train.fit` (and by it to the checkpoint writer):
:class:`NoFaults` does nothing and is the default; :class:`Faults` injects what
``KONTRAST_FAULTS`` asks for (the CLI builds it with :meth:`Faults.from_env`), a
comma-separated list of ``name=value``:

* ``kill_after_step=N``: ``SIGKILL`` this process right after step N (before any checkpoint
  of step N is written), like ``kill -9`` or a node dying.
* ``signal_after_step=N`` with ``signal=TERM|INT``: send that signal to this process after step N
  (``signal_group=1``: to its whole process group, as a terminal's Ctrl-C or a scheduler does, DataLoader
  workers included).
* ``kill_in_checkpoint=N``: ``SIGKILL`` while the checkpoint of step N is half written.
* ``nan_at_step=N[+M...]``: make the loss of step(s) N (1-based) NaN.
* ``trace=PATH``: append ``{"step", "epoch", "indices"}`` per step to PATH (JSON lines).
* ``rank=R``: only the process of rank R (``$RANK`` under torchrun) has the faults; others run normally.

The tests in ``tests/integration/test_reliability*.py`` drive the CLI with these; docs/reliability.md
lists them.
"""

from __future__ import annotations

import json
import os
import signal

ENV_VAR = "KONTRAST_FAULTS"


def parse(text: str | None = None) -> dict[str, str]:
    """``"a=1,b=2"`` (default: ``$KONTRAST_FAULTS``) -> ``{"a": "1", "b": "2"}``."""
    text = os.environ.get(ENV_VAR, "") if text is None else text
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        out[key] = value
    return out


class NoFaults:
    """The hooks of a normal run: every one a no-op."""

    enabled = False

    def poison(self, step: int, loss):
        return loss

    def trace(self, step: int, epoch: int, indices) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def in_checkpoint(self, step: int) -> None:
        pass


class Faults(NoFaults):
    """The faults named in ``spec`` (see the module doc)."""

    def __init__(self, spec: dict[str, str]):
        self.enabled = bool(spec)
        self.kill_in_checkpoint = int(spec.get("kill_in_checkpoint", -1))
        self.kill_after = int(spec.get("kill_after_step", -1))
        self.signal_after = int(spec.get("signal_after_step", -1))
        self.signal = signal.SIGINT if spec.get("signal", "TERM").upper() == "INT" else signal.SIGTERM
        self.signal_group = spec.get("signal_group", "0") == "1"
        self.nan_steps = {int(s) for s in spec.get("nan_at_step", "").split("+") if s}
        self.trace_path = spec.get("trace")

    @classmethod
    def from_env(cls) -> NoFaults:
        """The faults ``KONTRAST_FAULTS`` asks for; :class:`NoFaults` when it is unset or empty."""
        spec = parse()
        if "rank" in spec and spec.pop("rank") != os.environ.get("RANK", "0"):
            return NoFaults()  # the faults are another rank's
        return cls(spec) if spec else NoFaults()

    def poison(self, step: int, loss):
        """``loss`` as NaN when step ``step`` (1-based) is one to poison."""
        return loss * float("nan") if step in self.nan_steps else loss

    def trace(self, step: int, epoch: int, indices) -> None:
        if self.trace_path:
            with open(self.trace_path, "a") as f:
                f.write(json.dumps({"step": step, "epoch": epoch, "indices": indices.tolist()}) + "\n")

    def after_step(self, step: int) -> None:
        if step == self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == self.signal_after and self.signal_group:
            os.killpg(os.getpgid(0), self.signal)
        elif step == self.signal_after:
            os.kill(os.getpid(), self.signal)

    def in_checkpoint(self, step: int) -> None:
        """Called halfway through writing checkpoint ``step``."""
        if step == self.kill_in_checkpoint:
            os.kill(os.getpid(), signal.SIGKILL)
