"""``fit``: pretrain a method on a data source, the one training loop for every method.

Per step :func:`kontrast.train.step.train_step`; around it the epoch order, the metric log,
the kNN monitor, checkpoints and the guards. The loop knows no method; a method knows no device.

Reliability (docs/reliability.md): a run is a pure function of its config and seed, so an
interrupted run resumes bit for bit (batch order from (seed, epoch), views from (seed, epoch,
sample, view), global generators re-seeded from (seed, step), everything else in the
checkpoint); checkpoints at epoch ends, every ``train.checkpoint_every`` steps and on
SIGTERM / SIGINT (then exit 143 / 130); a non-finite loss or gradient is caught before the
optimizer step (``train.nonfinite``: stop or skip); a collapsing embedding is warned about.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from kontrast.augment import derive_key, key_tensor, view_maker
from kontrast.checkpoint import latest_checkpoint, load_checkpoint, remove_partial, save_checkpoint
from kontrast.config import Config, dump
from kontrast.data import batch_indices
from kontrast.data.sources import absolute_source
from kontrast.errors import Interrupted, UserError
from kontrast.methods.base import Progress, Ranks
from kontrast.precision import choose_precision
from kontrast.train import distributed
from kontrast.train.data_path import (TrainData, bad_image_error, check_batch, choose_mode, epoch_batches,
                                     load_train_data)
from kontrast.methods.build import check_inputs, check_size, create_method, encoder_layers, run_recipe, view_specs
from kontrast.train.faults import NoFaults
from kontrast.train.guards import CollapseMonitor, NonFiniteGuard, SignalStop, floating_state, nonfinite
from kontrast.train.optim import create_optimizer, lr_schedule, peak_lr
from kontrast.train.rundir import MetricLog, NullLog, check_run_dir, prepare_run_dir, rng_state, set_rng_state
from kontrast.train.monitor import KnnMonitor
from kontrast.train.step import StepContext, train_step


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {name!r} requested but no CUDA device is available; use --set train.device=cpu")
    return torch.device(name)


@dataclass
class Schedule:
    """The run's length: ``steps_per_epoch`` full batches (the last partial one is dropped)."""

    num_samples: int
    steps_per_epoch: int
    total_steps: int

    def progress(self, step: int, epoch: int) -> Progress:
        return Progress(step=step, epoch=epoch, total_steps=self.total_steps, steps_per_epoch=self.steps_per_epoch)


def fit(cfg: Config, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False, progress: bool = True,
        faults: NoFaults | None = None) -> dict:
    """Pretrain ``cfg.method`` on ``cfg.data``; write checkpoints and metrics under ``run_dir``; return the summary.

    ``cfg``: a resolved config (:func:`kontrast.methods.build.resolve`). ``faults``: the fault-injection
    hooks of the reliability tests (:class:`kontrast.train.faults.Faults`); none by default.
    ``train.num_threads`` holds for this call only, so a caller's thread count is left as it was.
    """
    threads = torch.get_num_threads()
    try:
        return _fit(cfg, Path(run_dir), resume, overwrite, progress, faults or NoFaults())
    finally:
        torch.set_num_threads(threads)
        distributed.close()


def _setup(cfg: Config, faults: NoFaults, resume: bool = False,
           why: str = "") -> tuple[StepContext, Schedule, TrainData]:
    """Data, method, views, optimizer and lr schedule of a run (nothing on disk yet); ``why``: why this data path."""
    tc = cfg.train
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    device = distributed.local_device(resolve_device(tc.device))
    ranks = distributed.init(device, tc.bind_cores) if distributed.launched() else Ranks()
    distributed.check_world(cfg, ranks.world)
    if ranks.world > 1 and distributed.max_over_ranks(int(cfg.data.mode == "stream")) and cfg.data.mode != "stream":
        cfg = replace(cfg, data=replace(cfg.data, mode="stream"))  # one path for all: a node whose budget is short
        why += "; streamed because another process's memory budget is too small"
    if ranks.rank > 0:
        distributed.barrier()  # rank 0 decodes and caches first; the others then map its cache entry
    train = load_train_data(cfg, device, why)  # the memory or the streaming path (kontrast.train.data_path)
    data = train.data
    if ranks.rank == 0:
        print(train.line, flush=True)  # stdout: stderr stays for errors and warnings
    if ranks.rank == 0 and ranks.world > 1:
        distributed.barrier()
    n = len(data)
    steps_per_epoch = len(batch_indices(n, tc.batch_size, 0, tc.seed))
    schedule = Schedule(n, steps_per_epoch, tc.epochs * steps_per_epoch)
    torch.manual_seed(tc.seed)
    method = create_method(cfg, num_samples=n, pretrained=not resume).to(device)  # resume: the checkpoint's weights
    method.ranks = ranks
    if ranks.world > 1 and tc.sync_bn and method.sync_bn:
        distributed.global_batch_norm(method)  # BN statistics of the global batch, as on one process
    if tc.channels_last:
        method = method.to(memory_format=torch.channels_last)
    if tc.compile:  # in place (nn.Module.compile): same parameters and state_dict keys, checkpoints unchanged
        method.encoder.compile()  # (the view pipeline is compiled too: view_maker below)
    note = method.bind_data(data)  # per-sample data beside the images (CLIP's captions); None for most methods
    if note:
        print(note, file=sys.stderr)
    check_inputs(method, data)
    check_size(cfg, method)  # views too small for the encoder or the method: one line, before any step
    specs = view_specs(cfg, method)  # () for a sequence method: it gets the raw float batch
    if ranks.rank == 0 and specs and run_recipe(cfg, method) != (cfg.augment.recipe or method.recipe):
        print(f"views: {run_recipe(cfg, method)!r}, the ImageNet version of {method.recipe!r} at data.size "
              f"{cfg.data.size} (set augment.recipe={method.recipe} to keep the CIFAR-scale one)", flush=True)
    optimizer = create_optimizer(method, cfg.optim, tc.batch_size)
    peak = peak_lr(cfg.optim, tc.batch_size)
    warmup = round(cfg.optim.warmup_epochs * steps_per_epoch)
    ctx = StepContext(
        method=method, optimizer=optimizer, images=None if train.stream else data.x.to(device),  # memory: all of it
        make_views=view_maker(specs, compile=tc.compile, cropped=train.stream is not None) if specs else None,
        lrs=lr_schedule(peak, schedule.total_steps, warmup, cfg.optim.min_lr).tolist(), peak_lr=peak,
        seed=tc.seed, device=device, guard=NonFiniteGuard(method, device), precision=tc.precision,
        channels_last=tc.channels_last, nonfinite=tc.nonfinite, faults=faults, ranks=ranks)
    return ctx, schedule, train


def _restore(ctx: StepContext, cfg: Config, schedule: Schedule, run_dir: Path) -> tuple[int, dict]:
    """Load the newest complete checkpoint into ``ctx``; return its step and the loop's counters."""
    remove_partial(run_dir)  # temporary folders of a checkpoint a crash interrupted
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise UserError(f"--resume: no complete checkpoint in {run_dir}/checkpoints; start a new run instead")
    state = load_checkpoint(ckpt, ctx.method, ctx.optimizer, method_name=cfg.method.name)
    saved = state.get("steps_per_epoch", schedule.steps_per_epoch)
    if saved != schedule.steps_per_epoch:
        raise UserError(f"checkpoint {ckpt} was written with {saved} steps per epoch, this run has "
                        f"{schedule.steps_per_epoch} (different data or batch size); resume with the run's own settings")
    set_rng_state(state["rng"], ctx.device)
    counters = ("skipped", "consecutive_skips", "collapse", "bad_images")
    return state["step"], {k: state[k] for k in counters if k in state}


def absolute_paths(cfg: Config) -> Config:
    """``cfg`` with its paths on disk (data source, cache, initial weights) absolute, as config.yaml keeps them."""
    weights = cfg.encoder.weights and str(Path(cfg.encoder.weights).expanduser().absolute())
    cache = cfg.data.cache_dir and str(Path(cfg.data.cache_dir).expanduser().absolute())
    return replace(cfg, data=replace(cfg.data, source=absolute_source(cfg.data.source), cache_dir=cache),
                   encoder=replace(cfg.encoder, weights=weights))


def chosen_numerics(cfg: Config) -> tuple[Config, str]:
    """``cfg`` with ``auto`` precision and channels_last decided for its device, and the line saying why."""
    precision, layout, why = choose_precision(cfg.train.precision, cfg.train.channels_last,
                                              resolve_device(cfg.train.device), encoder_layers(cfg))
    return replace(cfg, train=replace(cfg.train, precision=precision, channels_last=layout)), why


def _fit(cfg: Config, run_dir: Path, resume: bool, overwrite: bool, progress: bool, faults: NoFaults) -> dict:
    check_run_dir(run_dir, resume=resume, overwrite=overwrite)
    cfg, numerics = chosen_numerics(absolute_paths(cfg))  # config.yaml keeps what was chosen
    cfg, data_why = choose_mode(cfg, resolve_device(cfg.train.device))  # ... and the data path
    tc = cfg.train
    ctx, schedule, train = _setup(cfg, faults, resume, data_why)
    if train.stream is not None:  # (several processes may have agreed on streaming in _setup)
        cfg = replace(cfg, data=replace(cfg.data, mode="stream"))
    data = train.data
    start_step, counters = 0, {"skipped": 0, "consecutive_skips": 0, "collapse": None, "bad_images": 0}
    if resume:
        start_step, saved = _restore(ctx, cfg, schedule, run_dir)
        counters.update(saved)
    ranks = ctx.ranks
    lead = ranks.rank == 0  # on several processes rank 0 alone writes, logs and monitors
    if lead:
        print(numerics, flush=True)
    if lead:
        prepare_run_dir(run_dir, resume=resume, overwrite=overwrite)  # inputs are valid: now touch the disk
        dump(cfg, run_dir / "config.yaml")
    monitor = KnnMonitor.create(cfg, data, ctx) if lead else None
    log = MetricLog(run_dir, resume_step=start_step if resume else None) if lead else NullLog()
    bar = tqdm(total=schedule.total_steps, initial=start_step, disable=not (progress and lead), unit="step",
               dynamic_ncols=True)
    collapse = CollapseMonitor(tc.collapse_std, tc.collapse_window, counters["collapse"], tc.collapse_share)
    step, t_window, n_window, t_start, last = start_step, time.perf_counter(), 0, time.perf_counter(), {}

    def warn(kind: str, message: str) -> None:
        log.write(step, {"warning": kind, "message": message})
        if lead:
            bar.write(f"warning: {message}", file=sys.stderr)

    def save() -> Path:
        ctx.guard.raise_if_bad(step, run_dir)
        if bool(nonfinite(floating_state(ctx.method))):
            raise UserError(f"weights became non-finite by step {step}; not checkpointed; "
                            f"last good checkpoint: {latest_checkpoint(run_dir) or 'none'}")
        state = {"step": step, "epoch": step // schedule.steps_per_epoch, "total_steps": schedule.total_steps,
                 "steps_per_epoch": schedule.steps_per_epoch, "num_samples": schedule.num_samples,
                 "method": cfg.method.name, "skipped": counters["skipped"],
                 "consecutive_skips": counters["consecutive_skips"], "collapse": collapse.state(),
                 "bad_images": counters["bad_images"]}
        path = save_checkpoint(run_dir, ctx.method, ctx.optimizer, state, rng=rng_state(ctx.device), faults=faults) \
            if lead else None
        if ranks.world > 1:
            distributed.barrier()  # the others go on once rank 0's checkpoint is complete
        return path or latest_checkpoint(run_dir)

    nproc = f" --nproc {ranks.world}" if ranks.world > 1 else ""
    ctx.method.train()
    keyed = {}  # the current epoch's augmentation key
    batches = epoch_batches(train, cfg, view_specs(cfg, ctx.method), start_step, ranks.rank, ranks.world, ctx.device)
    try:
        with SignalStop() as stop:
            if monitor and start_step == 0:
                monitor(0, step, log, bar)  # the untrained encoder: the baseline every later figure is read against
            for epoch, i, idx, batch in batches:
                if epoch not in keyed:
                    keyed = {epoch: key_tensor(derive_key("augment", tc.seed, epoch), ctx.device)}
                bad = check_batch(batch, step + 1, counters, warn)
                if ranks.world > 1 and train.stream is not None:  # one rank's bad file stops all before this step
                    bad = distributed.first_over_ranks(bad)
                if bad:  # strict: the state before this batch is good; keep it
                    done = latest_checkpoint(run_dir)
                    if step > start_step and (done is None or done.name != f"step-{step:08d}"):
                        done = save()
                    raise bad_image_error(bad, step + 1, done)
                result = train_step(ctx, idx, keyed[epoch], schedule.progress(step, epoch), batch=batch)
                step += 1
                n_window += tc.batch_size
                bar.update(1)
                if result.skipped:
                    _count_skip(counters, step, tc.max_skips, run_dir, warn)
                else:
                    counters["consecutive_skips"] = 0
                if (step % tc.log_every == 0 or step == schedule.total_steps) and not result.skipped:
                    ctx.guard.raise_if_bad(step, run_dir)
                    now = time.perf_counter()
                    last = result.metrics()
                    if ranks.world > 1:
                        last = distributed.mean_metrics(last, ranks.world)  # the loss of the global batch
                    last.update(epoch=epoch, lr=ctx.lrs[step - 1], img_per_s=n_window / (now - t_window))
                    log.write(step, last)
                    bar.set_postfix(loss=f"{last['loss']:.4f}", img_s=f"{last['img_per_s']:.0f}")
                    t_window, n_window = now, 0
                    message = collapse.update(step, last.get("embedding_std"), last.get("teacher_top_share"))
                    if message:
                        warn("collapse", message)
                faults.after_step(step)  # test hook: a kill or signal arriving during this step
                epoch_end = i == schedule.steps_per_epoch - 1
                if ranks.world > 1:  # a signal stops every rank after the same step
                    stop.received = distributed.max_over_ranks(stop.received or 0) or None
                if epoch_end and monitor and ((epoch + 1) % tc.knn_every == 0 or epoch + 1 == tc.epochs):
                    monitor(epoch + 1, step, log, bar)
                if epoch_end or (tc.checkpoint_every and step % tc.checkpoint_every == 0) or stop.received:
                    ckpt = save()
                if stop.received:
                    name = signal.Signals(stop.received).name
                    raise Interrupted(f"{name} after step {step} of {schedule.total_steps}; checkpoint {ckpt}; "
                                      f"continue with: kontrast train --out {run_dir} --resume{nproc}",
                                      128 + stop.received)
            ctx.guard.raise_if_bad(step, run_dir)
    except RuntimeError as exc:
        if ranks.world == 1 or not distributed.peer_lost(exc):
            raise
        raise Interrupted(f"rank {ranks.rank}: another process of the run stopped during step {step + 1} "
                          f"({distributed.first_line(exc)}); last good checkpoint: {latest_checkpoint(run_dir) or 'none'}; "
                          f"continue with: kontrast train --out {run_dir} --resume{nproc}", 1,
                          peer_lost=True) from None
    finally:
        batches.close()  # the streaming path's workers stop here, not when the generator is collected
        bar.close()
        log.close()
    wall = time.perf_counter() - t_start
    summary = {"method": cfg.method.name, "steps": step, "epochs": tc.epochs, "wall_s": round(wall, 2),
               "img_per_s": round((step - start_step) * tc.batch_size / max(wall, 1e-9), 1),
               "final_loss": last.get("loss"), "skipped_steps": counters["skipped"]}
    if train.stream is not None:
        summary["bad_images_replaced"] = counters["bad_images"]
    if lead:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _count_skip(counters: dict, step: int, max_skips: int, run_dir: Path, warn) -> None:
    """A skipped step (``train.nonfinite=skip``): warn, and stop after ``max_skips`` in a row."""
    counters["skipped"] += 1
    counters["consecutive_skips"] += 1
    warn("nonfinite", f"non-finite loss or gradient at step {step}; step skipped "
         f"({counters['consecutive_skips']} in a row, {counters['skipped']} in all)")
    if counters["consecutive_skips"] >= max_skips:
        raise UserError(
            f"{counters['consecutive_skips']} consecutive steps (up to step {step}) had a "
            f"non-finite loss or gradient (train.max_skips={max_skips}); last good "
            f"checkpoint: {latest_checkpoint(run_dir) or 'none'}; lower optim.lr or use fp32")
