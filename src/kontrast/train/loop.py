"""``fit``: pretrain a method on a data source, the one training loop for every method.

``fit`` plans the run once (:mod:`kontrast.train.plan`), builds it, and steps: per step
:func:`kontrast.train.step.train_step`, around it the epoch order, the checkpoints and the guards. Everything
else a run does listens to the loop's events (:mod:`kontrast.train.events`): the metric log and progress bar
(:class:`~kontrast.train.runlog.RunLog`), the kNN monitor, the fault injection of the reliability tests. The
loop knows no method; a method knows no device.

Reliability (docs/reliability.md): a run is a pure function of its config and seed, so an
interrupted run resumes bit for bit (batch order from (seed, epoch), views from (seed, epoch,
sample, view), global generators re-seeded from (seed, step), everything else in the
checkpoint); checkpoints at epoch ends, every ``train.checkpoint_every`` steps and on
SIGTERM / SIGINT (then exit 143 / 130); a non-finite loss or gradient is caught before the
optimizer step (``train.nonfinite``: stop or skip); a collapsing embedding is warned about.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kontrast.augment import derive_key, key_tensor
from kontrast.checkpoint import latest_checkpoint, load_checkpoint, remove_partial, save_checkpoint
from kontrast.config import Config
from kontrast.errors import Interrupted, UserError
from kontrast.methods.base import Ranks
from kontrast.train import distributed, launch, sharding
from kontrast.train.data_path import TrainData, bad_image_error, check_batch, epoch_batches
from kontrast.train.events import Events, Listener
from kontrast.train.faults import Faults
from kontrast.train.guards import SignalStop, floating_state, nonfinite
from kontrast.train.monitor import KnnMonitor
from kontrast.train.plan import (
    RunPlan,
    Schedule,
    build_run,
    plan_run,
    resolve_device,
    with_run_length,
    write_run_config,
)
from kontrast.train.rundir import check_run_dir, prepare_run_dir, resolve_resume, rng_state, set_rng_state
from kontrast.train.runlog import RunLog
from kontrast.train.step import StepContext, StepResult, train_step

COUNTERS = ("skipped", "consecutive_skips", "bad_images")  # the loop's own counts, kept in every checkpoint


def fit(cfg: Config, run_dir: str | Path, *, resume: bool | str = False, overwrite: bool = False,
        progress: bool = True, listeners: list[Listener] = ()) -> dict:
    """Pretrain ``cfg.method`` on ``cfg.data``; write checkpoints and metrics under ``run_dir``; return the summary.

    ``cfg``: a resolved config (:func:`kontrast.methods.build.resolve`); its run plan
    (:func:`kontrast.train.plan.plan_run`) is made once here and written into ``run_dir/config.yaml``.
    ``listeners``: more subscribers to the loop's events (:class:`kontrast.train.events.Listener`); the fault
    injection of the reliability tests subscribes itself when ``KONTRAST_FAULTS`` asks for faults
    (:mod:`kontrast.train.faults`). ``train.num_threads`` holds for this call only, so a caller's thread count is
    left as it was. ``resume``: True continues ``run_dir`` from its newest checkpoint; ``"auto"`` continues when it
    has one and starts otherwise (:func:`kontrast.train.rundir.resolve_resume`).
    """
    threads = torch.get_num_threads()
    try:
        return _fit(cfg, Path(run_dir), resume, overwrite, progress, list(listeners))
    finally:
        torch.set_num_threads(threads)
        distributed.close()


def start_ranks(cfg: Config) -> Ranks:
    """The run's processes: one, or the process group of a torchrun launch (joined here)."""
    if not distributed.launched():
        return Ranks()
    return distributed.init(distributed.local_device(resolve_device(cfg.train.device)), cfg.train.bind_cores,
                            cfg.train.collective_timeout)


def _fit(cfg: Config, run_dir: Path, resume: bool | str, overwrite: bool, progress: bool, listeners: list) -> dict:
    resume, overwrite = resolve_resume(run_dir, resume, overwrite)  # "auto": continue if there is a checkpoint
    check_run_dir(run_dir, resume=resume, overwrite=overwrite)
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    ranks = start_ranks(cfg)
    plan = plan_run(cfg, ranks)  # every decision of the run, once; config.yaml keeps them
    ctx, schedule, train = build_run(plan, ranks, resume=resume)
    plan = with_run_length(plan, schedule.total_steps)  # train.log_every, where auto
    lead = ranks.rank == 0  # on several processes rank 0 alone writes, logs and monitors
    runlog = RunLog(progress)
    monitor = KnnMonitor.create(plan, train.data) if lead else None
    events = Events([runlog, monitor, *listeners, Faults.from_env()])  # the reliability tests' faults, if asked
    loop = Loop(plan, ctx, schedule, train, run_dir, ranks, events, resume=resume)
    if resume and _resume(loop, lead):  # a finished run: said so, nothing changed
        return _saved_summary(run_dir) or {"method": plan.cfg.method.name, "steps": loop.step}
    if lead:
        print("\n".join(plan.lines()), flush=True)
        prepare_run_dir(run_dir, resume=resume, overwrite=overwrite)  # inputs are valid: now touch the disk
        write_run_config(plan, run_dir)
    loop.run()
    wall = loop.segment_wall()
    tc = plan.cfg.train
    summary = {"method": plan.cfg.method.name, "steps": loop.step, "epochs": tc.epochs,
               "wall_s": round(loop.wall_before + wall, 2), "segments": loop.segments,
               "img_per_s": round((loop.step - loop.start_step) * tc.batch_size / max(wall, 1e-9), 1),
               "final_loss": runlog.last.get("loss"), "skipped_steps": loop.counters["skipped"]}
    if train.stream is not None:
        summary["bad_images_replaced"] = loop.counters["bad_images"]
    if lead:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _resume(loop: Loop, lead: bool) -> bool:
    """Restore the newest checkpoint and say so; True when the run had already finished (rank 0 says it)."""
    ckpt = loop.restore()
    total, per_epoch, epochs = loop.schedule.total_steps, loop.schedule.steps_per_epoch, loop.plan.cfg.train.epochs
    if lead and loop.step >= total:
        print(f"{loop.run_dir} is complete: step {loop.step} of {total} (checkpoint {ckpt}); nothing changed "
              f"(--epochs above {epochs} extends it)", flush=True)
    elif lead:
        print(f"resuming from step {loop.step} of {total} (epoch {loop.step // per_epoch + 1} of {epochs}; "
              f"checkpoint {ckpt})", flush=True)
    return loop.step >= total


def _saved_summary(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None


@dataclass
class Loop:
    """A run being trained: what the listeners of its events see, and the steps, checkpoints and stops."""

    plan: RunPlan
    ctx: StepContext
    schedule: Schedule
    train: TrainData
    run_dir: Path
    ranks: Ranks
    events: Events
    resume: bool = False
    step: int = 0  # steps done
    start_step: int = 0  # the step this process started from (the checkpoint's on --resume)
    epoch: int = 0
    counters: dict = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    wall_before: float = 0.0  # seconds of training in the segments before this one (the checkpoint's)
    segments: int = 1  # this process's segment of the run: 1, then one more per --resume
    started: float = field(default_factory=time.perf_counter)  # when this segment's steps began

    def segment_wall(self) -> float:
        return time.perf_counter() - self.started

    @property
    def sharded(self) -> bool:
        """Are the method's parameters sharded over the ranks (``train.shard`` on several processes)?"""
        return self.plan.cfg.train.shard and self.ranks.world > 1

    @property
    def lead(self) -> bool:
        return self.ranks.rank == 0

    def resume_command(self) -> str:
        """How to continue: one node's command, or on several nodes (fewer processes here than in the run) the
        launch of every node again."""
        if int(os.environ.get("LOCAL_WORLD_SIZE", self.ranks.world)) < self.ranks.world:
            return f"the same command on every node, with --resume (--out {self.run_dir})"
        nproc = f" --nproc {self.ranks.world}" if self.ranks.world > 1 else ""
        return f"kontrast train --out {self.run_dir} --resume{nproc}"

    def warn(self, kind: str, message: str) -> None:
        self.events.emit("warning", self, kind, message)

    def log_due(self, result: StepResult) -> bool:
        """Whether this step's metrics are logged: every ``train.log_every`` steps and the last, unless skipped."""
        log_every = self.plan.cfg.train.log_every
        return (self.step % log_every == 0 or self.step == self.schedule.total_steps) and not result.skipped

    def restore(self) -> Path:
        """Load the newest complete checkpoint: weights, optimizer, generators, the loop's and listeners' state."""
        remove_partial(self.run_dir)  # temporary folders of a checkpoint a crash interrupted
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            raise UserError(f"--resume: no complete checkpoint in {self.run_dir}/checkpoints; start a new run instead")
        state = load_checkpoint(ckpt, self.ctx.method, self.ctx.optimizer, method_name=self.plan.cfg.method.name,
                                place=sharding.place_like if self.sharded else None)
        per_epoch = self.schedule.steps_per_epoch
        if state.get("steps_per_epoch", per_epoch) != per_epoch:
            raise UserError(f"checkpoint {ckpt} was written with {state['steps_per_epoch']} steps per epoch, this run "
                            f"has {per_epoch} (different data or batch size); resume with the run's own settings")
        set_rng_state(state["rng"], self.ctx.device)
        self.step = self.start_step = state["step"]
        self.wall_before, self.segments = float(state.get("wall_s", 0.0)), int(state.get("segments", 1)) + 1
        self.counters.update({k: state[k] for k in COUNTERS if k in state})
        self.events.restore(state)
        return ckpt

    def save(self) -> Path:
        """Checkpoint the state after step ``self.step`` (rank 0 writes; the others wait for it)."""
        ctx, step, run_dir = self.ctx, self.step, self.run_dir
        ctx.guard.raise_if_bad(step, run_dir)
        whole = {}  # a sharded run's state, gathered whole by every rank for rank 0 to write
        if self.sharded:
            whole = {"model_state": sharding.full_tensors(ctx.method.state_dict()),
                     "optimizer_state": sharding.full_optimizer_state(ctx.optimizer)}
        if bool(nonfinite(floating_state(whole.get("model_state") or ctx.method.state_dict()))):
            raise UserError(f"weights became non-finite by step {step}; not checkpointed; "
                            f"last good checkpoint: {latest_checkpoint(run_dir) or 'none'}")
        s = self.schedule
        state = {"step": step, "epoch": step // s.steps_per_epoch, "total_steps": s.total_steps,
                 "steps_per_epoch": s.steps_per_epoch, "num_samples": s.num_samples,
                 "method": self.plan.cfg.method.name, "wall_s": round(self.wall_before + self.segment_wall(), 2),
                 "segments": self.segments, **self.counters, **self.events.state()}
        path = (save_checkpoint(run_dir, ctx.method, ctx.optimizer, state, rng=rng_state(ctx.device),
                                halfway=lambda: self.events.emit("checkpoint_writing", self, step), **whole)
                if self.lead else None)
        if self.ranks.world > 1:
            distributed.barrier()  # the others go on once rank 0's checkpoint is complete
        path = path or latest_checkpoint(run_dir)
        self.events.emit("checkpoint", self, path)
        return path

    def run(self) -> None:
        """Every step from ``start_step`` to the run's end; a signal or a lost process ends it with a checkpoint."""
        ranks, tc = self.ranks, self.plan.cfg.train
        self.ctx.method.train()
        batches = epoch_batches(self.train, self.plan.cfg, self.plan.views, self.start_step, ranks.rank, ranks.world,
                                self.ctx.device)
        self.started = time.perf_counter()
        try:
            with SignalStop() as stop:
                self.events.emit("run_start", self)
                keyed = {}  # the current epoch's augmentation key
                for epoch, i, idx, batch in batches:
                    if epoch not in keyed:
                        keyed = {epoch: key_tensor(derive_key("augment", tc.seed, epoch), self.ctx.device)}
                    self.epoch = epoch
                    self._one_step(idx, batch, keyed[epoch])
                    self._after_step(stop, epoch, i)
                self.ctx.guard.raise_if_bad(self.step, self.run_dir)
        except RuntimeError as exc:
            if ranks.world == 1 or not distributed.peer_lost(exc):
                raise
            raise Interrupted(f"rank {ranks.rank}: another process of the run stopped or stalled during step "
                              f"{self.step + 1} "
                              f"({distributed.first_line(exc)}); last good checkpoint: "
                              f"{latest_checkpoint(self.run_dir) or 'none'}; continue with: {self.resume_command()}", 1,
                              peer_lost=True) from None
        finally:
            batches.close()  # the streaming path's workers stop here, not when the generator is collected
            self.events.emit("run_end", self)

    def _one_step(self, idx: torch.Tensor, batch, epoch_key: torch.Tensor) -> None:
        """Step ``self.step + 1`` on ``idx`` (and the streaming path's ``batch``), with its bad-image and skip rules."""
        bad = check_batch(batch, self.step + 1, self.counters, self.warn)
        if self.ranks.world > 1 and self.train.stream is not None:  # one rank's bad file stops all before this step
            bad = distributed.first_over_ranks(bad)
        if bad:  # strict: the state before this batch is good; keep it
            done = latest_checkpoint(self.run_dir)
            if self.step > self.start_step and (done is None or done.name != f"step-{self.step:08d}"):
                done = self.save()
            raise bad_image_error(bad, self.step + 1, done)
        self.events.emit("step_start", self, self.epoch, idx, batch)
        result = train_step(self.ctx, idx, epoch_key, self.schedule.progress(self.step, self.epoch), batch=batch)
        self.step += 1
        if result.skipped:
            self._count_skip()
        else:
            self.counters["consecutive_skips"] = 0
        if self.log_due(result):
            self.ctx.guard.raise_if_bad(self.step, self.run_dir)
        self.events.emit("step_end", self, result)

    def _after_step(self, stop: SignalStop, epoch: int, i: int) -> None:
        """The epoch's end, a checkpoint when one is due, and a stop that a signal asked for."""
        tc = self.plan.cfg.train
        received = stop.agreed(distributed.max_over_ranks if self.ranks.world > 1 else None)  # every rank alike
        epoch_end = i == self.schedule.steps_per_epoch - 1
        if epoch_end:
            self.events.emit("epoch_end", self, epoch)
        ckpt = None
        if epoch_end or (tc.checkpoint_every and self.step % tc.checkpoint_every == 0) or received:
            ckpt = self.save()
        if received:
            launch.report_checkpointed(self.ranks.rank, self.step)  # under --nproc: the launcher counts these
            name = signal.Signals(received).name
            raise Interrupted(f"{name} after step {self.step} of {self.schedule.total_steps}; checkpoint {ckpt}; "
                              f"continue with: {self.resume_command()}", 128 + received)

    def _count_skip(self) -> None:
        """A skipped step (``train.nonfinite=skip``): warn, and stop after ``train.max_skips`` in a row."""
        c, step, max_skips = self.counters, self.step, self.plan.cfg.train.max_skips
        c["skipped"] += 1
        c["consecutive_skips"] += 1
        self.warn("nonfinite", f"non-finite loss or gradient at step {step}; step skipped "
                  f"({c['consecutive_skips']} in a row, {c['skipped']} in all)")
        if c["consecutive_skips"] >= max_skips:
            raise UserError(
                f"{c['consecutive_skips']} consecutive steps (up to step {step}) had a "
                f"non-finite loss or gradient (train.max_skips={max_skips}); last good "
                f"checkpoint: {latest_checkpoint(self.run_dir) or 'none'}; lower optim.lr or use fp32")
