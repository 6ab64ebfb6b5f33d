"""Fault injection for the reliability tests: crashes, signals and NaNs at chosen steps.

A listener of the training loop's events (:mod:`kontrast.train.events`) that :func:`kontrast.train.loop.fit`
subscribes itself, from :meth:`Faults.from_env`, in every run (the command line's, ``--nproc``'s processes', a
Python caller's): :class:`NoFaults` does nothing; :class:`Faults` injects what ``KONTRAST_FAULTS`` asks for, a
comma-separated list of ``name=value``:

* ``kill_after_step=N``: ``SIGKILL`` this process right after step N (before any checkpoint
  of step N is written), like ``kill -9`` or a node dying.
* ``signal_after_step=N`` with ``signal=TERM|INT``: send that signal to this process after step N
  (``signal_group=1``: to its whole process group, as a terminal's Ctrl-C or a scheduler does, DataLoader
  workers included).
* ``signal_in_step=N`` with ``signal=TERM|INT``: send that signal in the middle of step N, as the encoder starts
  its second forward of the step (under ``train.accumulate``: between the first two micro-batches).
* ``stall_after_step=N``: stop making progress right after step N without exiting (sleep until killed), like a
  process stuck in a driver or a lock; the others wait at their next collective for ``train.collective_timeout``.
* ``kill_in_checkpoint=N``: ``SIGKILL`` while the checkpoint of step N is half written.
* ``nan_at_step=N[+M...]``: make the loss of step(s) N (1-based) NaN.
* ``nudge_weights=N``: before the first step, move every floating-point parameter of the method N units in the
  last place up or down (a fixed random sign per value; exact zeros stay): a change that must not matter, at the
  scale of rounding.
  The equality tests measure their floor with it (how far the same run drifts from so small a change).
* ``trace=PATH``: append ``{"step", "epoch", "indices"}`` per step to PATH (JSON lines).
* ``rank=R``: only the process of rank R (``$RANK`` under torchrun) has the faults; others run normally.
* ``restart=N``: only attempt N of a torchrun launch (``$TORCHELASTIC_RESTART_COUNT``; 0 the first) has the faults:
  a rank killed once, whose restart under ``--max-restarts`` then runs normally.

The tests in ``tests/integration/test_reliability*.py`` drive the CLI with these; docs/reliability.md
lists them.
"""

from __future__ import annotations

import json
import os
import signal
import time

from kontrast.train.events import Listener

ENV_VAR = "KONTRAST_FAULTS"


def parse(text: str | None = None) -> dict[str, str]:
    """``"a=1,b=2"`` (default: ``$KONTRAST_FAULTS``) -> ``{"a": "1", "b": "2"}``."""
    text = os.environ.get(ENV_VAR, "") if text is None else text
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        out[key] = value
    return out


class NoFaults(Listener):
    """The hooks of a normal run: none."""

    enabled = False


class Faults(NoFaults):
    """The faults named in ``spec`` (see the module doc), as a listener of the loop's events."""

    def __init__(self, spec: dict[str, str]):
        self.enabled = bool(spec)
        self.kill_in_checkpoint = int(spec.get("kill_in_checkpoint", -1))
        self.kill_after = int(spec.get("kill_after_step", -1))
        self.signal_after = int(spec.get("signal_after_step", -1))
        self.signal_in = int(spec.get("signal_in_step", -1))
        self.stall_after = int(spec.get("stall_after_step", -1))
        self.step, self.forwards = 0, 0  # the step under way (1-based) and its encoder forwards so far
        self.signal = signal.SIGINT if spec.get("signal", "TERM").upper() == "INT" else signal.SIGTERM
        self.signal_group = spec.get("signal_group", "0") == "1"
        self.nan_steps = {int(s) for s in spec.get("nan_at_step", "").split("+") if s}
        self.trace_path = spec.get("trace")
        self.nudge_ulps = int(spec.get("nudge_weights", 0))

    @classmethod
    def from_env(cls) -> NoFaults:
        """The faults ``KONTRAST_FAULTS`` asks for; :class:`NoFaults` when it is unset or empty."""
        spec = parse()
        if "rank" in spec and spec.pop("rank") != os.environ.get("RANK", "0"):
            return NoFaults()  # the faults are another rank's
        if "restart" in spec and spec.pop("restart") != os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"):
            return NoFaults()  # the faults are another attempt's
        return cls(spec) if spec else NoFaults()

    def run_start(self, loop) -> None:
        """``nan_at_step``: the method's loss is NaN at those steps (1-based), as a diverging run's would be.
        ``signal_in_step``: a hook on the encoder's forward that sends the signal in the middle of that step."""
        if self.signal_in > 0:
            loop.ctx.method.encoder.register_forward_pre_hook(self._mid_step)
        if self.nudge_ulps:
            nudge_weights(loop.ctx.method, self.nudge_ulps)
        if not self.nan_steps:
            return
        method = loop.ctx.method
        forward = method.training_step

        def poisoned(views, indices=None, progress=None):
            out = forward(views, indices, progress)
            if progress is not None and progress.step + 1 in self.nan_steps:
                out["loss"] = out["loss"] * float("nan")
            return out

        method.training_step = poisoned  # this run's method object only

    def _mid_step(self, module, args) -> None:
        if self.step == self.signal_in:
            self.forwards += 1
            if self.forwards == 2:
                os.kill(os.getpid(), self.signal)

    def step_start(self, loop, epoch: int, indices, batch) -> None:
        """``trace``: the step's samples on this process (its slice of the global batch on several)."""
        self.step, self.forwards = loop.step + 1, 0
        if not self.trace_path:
            return
        ranks = loop.ranks
        if ranks.world > 1 and batch is None:  # the memory path hands every rank the global batch
            indices = indices[ranks.own(len(indices) // ranks.world)]
        with open(self.trace_path, "a") as f:
            f.write(json.dumps({"step": loop.step + 1, "epoch": epoch, "indices": indices.tolist()}) + "\n")

    def step_end(self, loop, result) -> None:
        step = loop.step
        if step == self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == self.stall_after:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # torchrun's SIGTERM ends it, as it would a stuck process
            while True:
                time.sleep(60)
        if step == self.signal_after and self.signal_group:
            os.killpg(os.getpgid(0), self.signal)
        elif step == self.signal_after:
            os.kill(os.getpid(), self.signal)

    def checkpoint_writing(self, loop, step: int) -> None:
        """Called halfway through writing checkpoint ``step``."""
        if step == self.kill_in_checkpoint:
            os.kill(os.getpid(), signal.SIGKILL)


def nudge_weights(module, ulps: int, seed: int = 0) -> None:
    """Every floating-point parameter of ``module`` ``ulps`` units in the last place up or down, the sign drawn per
    value from ``seed``: the same nudge on every process and machine."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if not p.is_floating_point():
                continue
            up = torch.rand(p.shape, generator=g) < 0.5
            towards = torch.where(up, torch.inf, -torch.inf).to(p.device, p.dtype)  # [*p.shape]
            towards = torch.where(p == 0, p, towards)  # an exact zero stays: a zero-initialised block or bias is
            for _ in range(ulps):  # a branch (LARS's zero-norm trust ratio), not a value rounding can reach
                p.copy_(torch.nextafter(p, towards))
