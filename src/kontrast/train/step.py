"""One training step, the same for ``fit``, the benchmarks and the tests.

indices -> uint8 images (already on the device) -> views -> ``method.training_step`` under the
run's autocast -> backward -> non-finite check -> per-parameter gradient clipping (``optim.clip_grad``) ->
optimizer step with the step's lr and weight decay ->
``method.after_step``. Before the step the global generators are re-seeded from (seed, step),
so anything a method draws from them (MoCo's shuffled BN groups, dropout) is a function of the
step and a resumed run draws the same. Under ``nonfinite="skip"`` a step whose loss or gradient
is not finite changes nothing: no optimizer step, buffers restored, no ``after_step``.

On W ranks (``ctx.ranks.world > 1``; docs/distributed.md) every rank gets the same global batch
``indices`` and takes its slice; the step runs through ``ctx.training_step``, the method's under
DistributedDataParallel (or FSDP2 with ``train.shard``), which has averaged the gradients over ranks when the
backward returns, so the non-finite check sees the same gradients on every rank (a sharded run's: the DTensor norms
reduced over ranks) and every rank skips or stops together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kontrast.augment import derive_key
from kontrast.methods.base import Method, Progress, Ranks
from kontrast.precision import autocast, in_precision
from kontrast.train.guards import NonFiniteGuard
from kontrast.train.optim import clip_per_parameter

PHASES = ("data_augment", "forward_loss", "backward", "guard", "optimizer", "after_step")


def step_seed(seed: int, step: int) -> int:
    """Seed of the global generators for step ``step`` (0-based: the steps finished before it)."""
    return derive_key("step", seed, step) & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class StepContext:
    """What every step of a run shares.

    images: uint8 [N, 3, H, W] (or float32 sequences [N, C, L]) on ``device``, None on the streaming path; make_views:
    ``(images[idx], idx, epoch_key) -> views`` (``kontrast.augment.view_maker``), None for a
    sequence method, which gets the raw batch; lrs: the lr of every step (``fixed_lr`` groups
    keep ``peak_lr``); wds: the weight decay of every step for the decayed groups (None: constant);
    clip_grad: each parameter's gradient clipped to this norm before the optimizer step (0: off).
    """

    method: Method
    optimizer: torch.optim.Optimizer
    images: torch.Tensor | None
    make_views: Callable | None
    lrs: list[float]
    peak_lr: float
    seed: int
    device: torch.device
    guard: NonFiniteGuard
    precision: str = "fp32"
    channels_last: bool = False
    nonfinite: str = "stop"  # or "skip"
    ranks: Ranks = Ranks()  # one process unless the run was launched on several (train/distributed.py)
    wds: list[float] | None = None
    clip_grad: float = 0.0
    view_sides: list[int] | None = None  # progressive resolution: the views' side at every step (make_views takes it)
    # on several processes, method.training_step under DistributedDataParallel (train/distributed.py::data_parallel)
    # or with the parameters sharded (train.shard: train/sharding.py::sharded); None: the method's own
    training_step: Callable | None = None


@dataclass
class StepResult:
    out: dict[str, torch.Tensor]  # what training_step returned (loss, metrics, state for after_step)
    skipped: bool  # nonfinite="skip" and the step was not finite: nothing changed

    def metrics(self) -> dict[str, float]:
        """The 0-d entries of ``out`` as floats (a host sync): what the metric log records."""
        return {k: float(v.detach()) for k, v in self.out.items() if torch.is_tensor(v) and v.dim() == 0}


def _no_lap(phase: str) -> None:
    pass


def train_step(ctx: StepContext, indices: torch.Tensor, epoch_key: torch.Tensor, progress: Progress,
               lap: Callable[[str], None] = _no_lap, batch=None) -> StepResult:
    """Step number ``progress.step + 1`` on the global batch ``indices`` (int64 [B], CPU; this rank's slice is used).

    ``epoch_key``: the epoch's augmentation key (``key_tensor(derive_key("augment", seed, epoch))``);
    ``lap(phase)`` is called at the end of each of :data:`PHASES` (the benchmarks time them).
    ``batch``: the streaming path's :class:`~kontrast.data.stream_dataset.StreamBatch`, this rank's crops
    (uint8 [b, 3, S_v, S_v] per view), with ``indices`` its samples only (int64 [b]); ``ctx.images`` is unused.
    """
    method, step = ctx.method, progress.step
    for group in ctx.optimizer.param_groups:
        group["lr"] = ctx.peak_lr if group.get("fixed_lr") else ctx.lrs[step]
        if ctx.wds is not None and group.get("decay"):
            group["weight_decay"] = ctx.wds[step]
    torch.manual_seed(step_seed(ctx.seed, step))
    ranks = ctx.ranks
    if ranks.world > 1 and batch is None:  # a stream batch is this rank's already
        indices = indices[ranks.own(len(indices) // ranks.world)]  # [B / W] this rank's slice
    idx = indices.to(ctx.device)
    inputs = ctx.images[idx] if batch is None else [v.to(ctx.device, non_blocking=True) for v in batch.views]
    if ctx.make_views is None:  # a sequence method: the raw batch
        views = [inputs]
    elif ctx.view_sides:  # progressive resolution: this step's side
        views = ctx.make_views(inputs, idx, epoch_key, ctx.view_sides[step])
    else:
        views = ctx.make_views(inputs, idx, epoch_key)
    if ctx.channels_last and ctx.make_views:
        views = [v.contiguous(memory_format=torch.channels_last) for v in views]
    views = [in_precision(v, ctx.precision) for v in views]  # fp64: views made in float32 as in every run, then cast
    buffers = [b.clone() for b in method.buffers()] if ctx.nonfinite == "skip" else None
    lap("data_augment")
    with autocast(ctx.device, ctx.precision):
        out = (ctx.training_step or method.training_step)(views, idx, progress)
    lap("forward_loss")
    ctx.optimizer.zero_grad(set_to_none=True)
    out["loss"].backward()  # on several processes DDP's buckets average the gradients over ranks meanwhile
    lap("backward")
    bad = ctx.guard.check_step(step + 1, out["loss"])
    skipped = ctx.nonfinite == "skip" and bool(bad)  # the skip policy reads the flag every step
    lap("guard")
    if skipped:
        torch._foreach_copy_(list(method.buffers()), buffers)  # as if the step never ran
        ctx.guard.first_bad.fill_(-1)
        return StepResult(out, True)
    if ctx.clip_grad:
        clip_per_parameter(ctx.guard.params, ctx.clip_grad)
    ctx.optimizer.step()
    lap("optimizer")
    method.after_step(out, Progress(step=step + 1, epoch=progress.epoch, total_steps=progress.total_steps,
                                    steps_per_epoch=progress.steps_per_epoch))
    lap("after_step")
    return StepResult(out, False)
