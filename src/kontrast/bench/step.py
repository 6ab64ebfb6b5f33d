"""Per-step time breakdown of a method, and the share of the step outside its encoder.

One step as ``kontrast.train.loop.fit`` runs it (the same ``train_step``), timed phase by phase (with a device
synchronisation between phases on a GPU): data + augmentation (index the uint8 dataset,
``make_views``), forward + loss (``training_step``), backward, the non-finite guard,
optimizer, ``after_step`` (queues, EMA, banks). Then the encoder alone: every call the step
made to ``method.encoder`` is replayed on the same inputs (forward + backward of a plain sum),
and every call to a momentum copy of it (MoCo's key encoder, BYOL's target) or to a frozen teacher (distill) is replayed
forward only. ``outside`` = 1 - (encoder fwd+bwd + target fwd) / step: the time a perfect
implementation of everything but the encoder could still save.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager, nullcontext

import torch
import torch.nn as nn

from kontrast.augment import derive_key, key_tensor
from kontrast.config import Config
from kontrast.methods.base import Progress
from kontrast.precision import autocast
from kontrast.train.data_path import TrainData
from kontrast.train.optim import lr_schedule, weight_decay_schedule
from kontrast.train.plan import build_run, plan_run
from kontrast.train.step import PHASES, train_step

STEPS = 1000  # the run length whose lr schedule the timed steps follow


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _tensors(out) -> list[torch.Tensor]:
    """Every tensor in an encoder output (a tensor, or a tuple / list / dict of them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    return []


def _detached(value):
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    return value


@contextmanager
def _recording(modules: list[nn.Module], calls: list[list]):
    """Record ``(args, kwargs)`` of every forward call of each module (inputs detached)."""
    handles = [m.register_forward_pre_hook(
        lambda _m, args, kwargs, log=log: log.append((_detached(args), _detached(kwargs))), with_kwargs=True)
        for m, log in zip(modules, calls)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def step_breakdown(cfg: Config, data, *, iters: int) -> dict:
    """Median seconds per phase over ``iters`` steps (after two warm-up steps), and the encoder share.

    cfg: a resolved config (method, encoder, batch, precision, channels_last, device); data: the Samples
    the steps draw from (on the memory path, as a run holds them). The run is made as ``fit`` makes it
    (:func:`kontrast.train.plan.plan_run`, :func:`~kontrast.train.plan.build_run`); the steps are
    :func:`kontrast.train.step.train_step` on random batches, with the lr schedule of a ``STEPS``-step run.
    """
    plan = plan_run(cfg)
    ctx, _, _ = build_run(plan, train=TrainData(data, line=""))
    tc, method = plan.cfg.train, ctx.method
    ctx.lrs = lr_schedule(ctx.peak_lr, STEPS, 0, plan.cfg.optim.min_lr).tolist()
    ctx.wds = weight_decay_schedule(plan.cfg.optim, STEPS)
    targets = [m for m in method.modules() if type(m) is type(method.encoder) and m is not method.encoder]
    targets += list(method.frozen_networks())  # a distillation teacher: forward only, timed with the targets
    one_step = _stepper(ctx, tc, [method.encoder, *targets])
    method.train()
    calls: list[list] = [[] for _ in range(1 + len(targets))]
    one_step(None, 0, calls)  # warm-up, recording the encoder's inputs
    one_step(None, 1)
    encoder_only, targets_only = _replays(method, targets, calls, tc.precision, ctx.device)
    # amdim, yadim and cpc_v2 read the encoder's feature maps (forward_maps, the patch grid), which the
    # forward hooks do not see: their phases are measured, their encoder share is not
    replay = bool(calls[0])
    if replay:
        encoder_only()  # warm-up
    method.zero_grad(set_to_none=True)
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    enc, tgt = [], []
    for i in range(iters):  # step and encoder alone alternate, so a change in machine load hits both
        one_step(times, 2 + i)
        method.zero_grad(set_to_none=True)
        if not replay:
            continue
        t0 = time.perf_counter()
        encoder_only()
        t1 = time.perf_counter()
        targets_only()
        enc.append(t1 - t0)
        tgt.append(time.perf_counter() - t1)
        method.zero_grad(set_to_none=True)
    phases = {p: statistics.median(v) for p, v in times.items()}
    step_s = sum(phases.values())
    out = {"method": cfg.method.name, "batch": tc.batch_size, "step_s": step_s, "img_per_s": tc.batch_size / step_s,
           "phases_s": phases, "encoder_calls": len(calls[0]), "target_calls": sum(len(c) for c in calls[1:])}
    if replay:  # else the encoder share keys are absent
        encoder_s = statistics.median(enc)
        target_s = statistics.median(tgt) if targets else 0.0
        out.update(encoder_fwd_bwd_s=encoder_s, target_fwd_s=target_s,
                   outside_encoder=max(0.0, 1.0 - (encoder_s + target_s) / step_s))
    return out


def _stepper(ctx, tc, encoders: list[nn.Module]):
    """``one_step(times, step, record=None)``: :func:`train_step` on a random batch, each phase's seconds appended
    to ``times[phase]`` (when given), and with ``record`` every call to ``encoders`` recorded (:func:`_recording`)."""
    gen = torch.Generator().manual_seed(tc.seed)
    key = key_tensor(derive_key("bench", tc.seed), ctx.device)

    def one_step(times: dict | None, step: int, record: list | None = None) -> None:
        t = [time.perf_counter()]

        def lap(phase: str) -> None:
            _sync(ctx.device)
            t.append(time.perf_counter())

        idx = torch.randperm(len(ctx.images), generator=gen)[: tc.batch_size]
        with _recording(encoders, record) if record is not None else nullcontext():
            train_step(ctx, idx, key, Progress(step=step, epoch=0, total_steps=STEPS, steps_per_epoch=STEPS), lap)
        if times is not None:
            for name, a, b in zip(PHASES, t, t[1:]):
                times[name].append(b - a)

    return one_step


def _replays(method: nn.Module, targets: list[nn.Module], calls: list[list], precision: str, device: torch.device):
    """``(encoder_only, targets_only)``: the recorded calls replayed, the encoder's forward + backward of a plain
    sum, and its momentum copies' forward only."""

    def encoder_only() -> None:
        with autocast(device, precision):
            outs = [t for args, kw in calls[0] for t in _tensors(method.encoder(*args, **kw))]
        sum(o.float().sum() for o in outs).backward()
        _sync(device)

    def targets_only() -> None:
        with torch.no_grad(), autocast(device, precision):
            for module, log in zip(targets, calls[1:]):
                for args, kw in log:
                    module(*args, **kw)
        _sync(device)

    return encoder_only, targets_only
