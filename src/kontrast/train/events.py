"""The training loop's events, and the listeners that act on them.

:func:`kontrast.train.loop.fit` steps and checkpoints; everything else a run does is a :class:`Listener`
subscribed to the loop's events: the metric log and the progress bar, the collapse warning, the kNN monitor,
the fault injection of the reliability tests. Each event passes the loop (:class:`kontrast.train.loop.Loop`:
its plan, step context, schedule, run directory, ranks and step count) and what happened.

Events, in order: ``run_start`` once; per step ``step_start`` (the batch, before the step), ``step_end`` (the
:class:`~kontrast.train.step.StepResult`), ``epoch_end`` after an epoch's last step; ``checkpoint_writing``
halfway through a checkpoint and ``checkpoint`` once it is complete; ``warning`` for what the run should say,
``record`` for figures measured beside the steps (the kNN monitor's); ``run_end`` last, whether the run
finished or stopped.
"""

from __future__ import annotations

from pathlib import Path


class Listener:
    """A subscriber to the loop's events; each hook does nothing unless overridden.

    ``state()`` is what the listener keeps in each checkpoint (JSON-able) and ``restore(state)`` takes it back
    on ``--resume``; keys are shared with the loop's own, so a listener names its keys distinctly.
    """

    def run_start(self, loop) -> None:
        pass

    def step_start(self, loop, epoch: int, indices, batch) -> None:
        pass

    def step_end(self, loop, result) -> None:
        pass

    def epoch_end(self, loop, epoch: int) -> None:
        pass

    def checkpoint_writing(self, loop, step: int) -> None:
        pass

    def checkpoint(self, loop, path: Path) -> None:
        pass

    def warning(self, loop, kind: str, message: str) -> None:
        pass

    def record(self, loop, values: dict, line: str) -> None:
        pass

    def run_end(self, loop) -> None:
        pass

    def state(self) -> dict:
        return {}

    def restore(self, state: dict) -> None:
        pass


class Events:
    """The listeners of one run, called in the order they were subscribed."""

    def __init__(self, listeners: list[Listener]):
        self.listeners = [listener for listener in listeners if listener is not None]

    def emit(self, event: str, *args) -> None:
        for listener in self.listeners:
            getattr(listener, event)(*args)

    def state(self) -> dict:
        return {k: v for listener in self.listeners for k, v in listener.state().items()}

    def restore(self, state: dict) -> None:
        for listener in self.listeners:
            listener.restore(state)
