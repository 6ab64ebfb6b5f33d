"""What a run says while it trains: the metric log (``metrics.jsonl`` and TensorBoard), the progress bar, the
warnings, and the collapse warning read from the logged metrics. A listener of the loop's events
(:mod:`kontrast.train.events`); on several processes every rank runs it (the logged loss is the global batch's,
a collective) and rank 0 alone writes."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

from kontrast.train import distributed
from kontrast.train.events import Listener
from kontrast.train.guards import CollapseMonitor
from kontrast.train.rundir import MetricLog, NullLog


class RunLog(Listener):
    """Metric lines every ``train.log_every`` steps (and at the last), the bar, warnings and the collapse watch."""

    def __init__(self, progress: bool = True):
        self.show_bar = progress
        self.log, self.bar, self.collapse = NullLog(), None, None
        self.saved_collapse: dict | None = None
        self.last: dict = {}  # the last logged metrics (the summary's final loss)
        self.t_window, self.n_window = time.perf_counter(), 0

    def run_start(self, loop) -> None:
        tc, lead = loop.plan.cfg.train, loop.ranks.rank == 0
        if lead:
            self.log = MetricLog(loop.run_dir, resume_step=loop.start_step if loop.resume else None)
        self.bar = tqdm(total=loop.schedule.total_steps, initial=loop.start_step, disable=not (self.show_bar and lead),
                        unit="step", dynamic_ncols=True)
        self.collapse = CollapseMonitor(tc.collapse_std, tc.collapse_window, self.saved_collapse, tc.collapse_share)
        self.t_window = time.perf_counter()

    def step_end(self, loop, result) -> None:
        step, tc = loop.step, loop.plan.cfg.train
        self.n_window += tc.batch_size
        self.bar.update(1)
        if not loop.log_due(result):
            return
        now = time.perf_counter()
        last = result.metrics()
        if loop.ranks.world > 1:
            last = distributed.mean_metrics(last, loop.ranks.world)  # the loss of the global batch
        last.update(epoch=loop.epoch, lr=loop.ctx.lrs[step - 1], img_per_s=self.n_window / (now - self.t_window))
        self.log.write(step, last)
        self.bar.set_postfix(loss=f"{last['loss']:.4f}", img_s=f"{last['img_per_s']:.0f}")
        self.t_window, self.n_window, self.last = now, 0, last
        message = self.collapse.update(step, last.get("embedding_std"), last.get("teacher_top_share"))
        if message:
            loop.warn("collapse", message)

    def record(self, loop, values: dict, line: str) -> None:
        """Figures measured beside the steps (the kNN monitor's): a metric line, and ``line`` above the bar."""
        self.log.write(loop.step, values)
        self.bar.write(line)

    def warning(self, loop, kind: str, message: str) -> None:
        self.log.write(loop.step, {"warning": kind, "message": message})
        if loop.ranks.rank == 0:
            self.bar.write(f"warning: {message}", file=sys.stderr)

    def run_end(self, loop) -> None:
        if self.bar is not None:
            self.bar.close()
        self.log.close()

    def state(self) -> dict:
        return {"collapse": self.collapse.state() if self.collapse else self.saved_collapse}

    def restore(self, state: dict) -> None:
        self.saved_collapse = state.get("collapse")
