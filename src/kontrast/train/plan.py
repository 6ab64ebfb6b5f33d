"""The run plan: every decision of a training run, made once, from the resolved config and the machine.

:func:`plan_run` decides what the config leaves to the machine: the device, the precision and memory layout
(``auto``, and why), the data path (``data.mode: auto``, and why; several processes agree on one), the view
recipe and the views at ``data.size``, the encoder's constructor arguments. The :class:`RunPlan` is frozen. Its
config holds every decided value and is written to ``RUN/config.yaml`` with the plan beside it (``plan:``), so a
resume and every reader of the run take the decisions from there (:func:`read_run_config`); its lines are
printed at the start of the run. :func:`build_run` makes from a plan what :func:`kontrast.train.loop.fit` steps
through: the data, the method, the optimizer, the lr and weight-decay schedules and the step context.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import yaml

from kontrast.augment import ViewSpec, ramp_sides, recipe_views, side_schedule, sized_view_maker, view_maker
from kontrast.checkpoint import PLAN_KEY, RUN_CONFIG
from kontrast.config import Config, to_dict
from kontrast.data import batch_indices
from kontrast.data.sources import absolute_source
from kontrast.decisions import Decisions, check_inputs, decide, encoder_layers, recipe_lines
from kontrast.errors import UserError
from kontrast.methods.base import Progress, Ranks
from kontrast.methods.build import create_method
from kontrast.plugins import RUN_KEY, plugin_files
from kontrast.precision import choose_precision, in_precision
from kontrast.registry import METHODS
from kontrast.train import distributed, sharding
from kontrast.train.data_path import TrainData, choose_mode, choose_workers, load_train_data
from kontrast.train.guards import NonFiniteGuard
from kontrast.train.optim import create_optimizer, lr_schedule, peak_lr, weight_decay_schedule
from kontrast.train.step import StepContext


def resolve_device(name: str) -> torch.device:
    """``train.device`` as a device: ``auto`` is CUDA where there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {name!r} requested but no CUDA device is available; use --device cpu")
    return torch.device(name)


@dataclass(frozen=True)
class RunPlan:
    """A run's decisions. ``cfg`` is resolved, with absolute paths and no ``auto`` left in precision,
    channels_last and data.mode; the rest is what the machine and the config together fix."""

    cfg: Config
    device: str  # this process's device: "cpu", "cuda:1" (each rank of a node takes its own GPU)
    rank: int
    world: int  # processes of the run; the global batch is cfg.train.batch_size
    numerics: str  # the line saying which precision and memory layout, and why
    data_why: str  # why this data path
    decisions: Decisions  # size, stem, recipe, views, encoder arguments, the method's needs (kontrast.decisions)
    ramp_views: tuple[tuple[int, tuple[ViewSpec, ...]], ...] = ()  # progressive resolution: views at each smaller side

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def recipe(self) -> str | None:
        """The views' recipe at data.size; None for a sequence method (it gets the raw batch)."""
        return self.decisions.recipe

    @property
    def views(self) -> tuple[ViewSpec, ...]:
        """The views at data.size; () for a sequence method."""
        return self.decisions.views

    @property
    def encoder(self) -> dict:
        """The encoder's constructor arguments."""
        return self.decisions.encoder_args

    @property
    def sized(self) -> tuple[str, ...]:
        """A line for data.size and for encoder.stem where they were auto: what, from what, the --set."""
        return self.decisions.reasons

    def lines(self) -> list[str]:
        """The start-up lines: what was decided for size and stem, the method's recipe for its encoder family,
        numerics, and the views where the recipe is not the method's own at this size."""
        lines = [*self.sized, *recipe_lines(self.cfg), self.numerics]
        tc = self.cfg.train
        if tc.accumulate > 1:
            share, whose = tc.batch_size // self.world, "each process's batch" if self.world > 1 else "the batch"
            synced = " over every process" if self.world > 1 and tc.sync_bn else ""
            lines.append(f"gradient caching: {whose} of {share} in {tc.accumulate} micro-batches of "
                         f"{share // tc.accumulate}, BatchNorm statistics per micro-batch{synced}")
        rounded = [(round(self.cfg.data.size * v.size_factor, 1), v.size) for v in self.views
                   if v.size != max(1, round(self.cfg.data.size * v.size_factor))]
        if rounded:  # a ViT's multi-crop views in whole patches (kontrast.decisions, patch_multiple)
            said = ", ".join(sorted({f"{a:g} -> {b} px" for a, b in rounded}))
            lines.append(f"views: the small crops in whole {self.decisions.patch_multiple}-px ViT "
                         f"patches ({said})")
        if self.ramp_views:
            start, end = (round(100 * f) for f in self.cfg.augment.size_ramp)
            sides = ", ".join(str(side) for side, _ in self.ramp_views)
            lines.append(f"views: progressive resolution, {sides} px before {self.cfg.data.size} px, growing from "
                         f"{start} % to {end} % of the steps (augment.min_size, augment.size_ramp)")
        native = self.cfg.augment.recipe or METHODS.get(self.cfg.method.name).recipe
        if self.recipe is not None and self.recipe != native:
            lines.append(f"views: {self.recipe!r}, the ImageNet version of {native!r} at data.size "
                         f"{self.cfg.data.size} (set augment.recipe={native} to keep the CIFAR-scale one)")
        return lines

    def to_dict(self) -> dict:
        """The ``plan:`` section of ``RUN/config.yaml`` (the config sections hold the decided values)."""
        views = [{k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(s).items()}
                 for s in self.views]
        return {"device": self.device, "world": self.world, "sized": list(self.sized), "numerics": self.numerics,
                "data": self.data_why,
                "recipe": self.recipe, "encoder": dict(self.encoder), "views": views,
                "ramp_sides": [side for side, _ in self.ramp_views]}


def plan_run(cfg: Config, ranks: Ranks = Ranks()) -> RunPlan:
    """The plan of ``cfg`` (resolved: :func:`kontrast.methods.build.resolve`) on this machine, as rank
    ``ranks.rank`` of ``ranks.world``; with several processes the data path is one for all of them."""
    device = distributed.local_device(resolve_device(cfg.train.device))
    cfg = absolute_paths(cfg)
    decisions = decide(cfg, ranks.world)  # size, stem, views, encoder; every refusal of the config, before any data
    cfg = decisions.cfg
    sharded = cfg.train.shard and ranks.world > 1  # FSDP2 shards contiguous parameters only: NCHW
    precision, layout, numerics = choose_precision(cfg.train.precision, False if sharded else cfg.train.channels_last,
                                                   device, encoder_layers(decisions.encoder_args))
    if sharded:
        numerics += "; channels_last off: train.shard (FSDP2) shards contiguous parameters only"
    cfg = replace(cfg, train=replace(cfg.train, precision=precision, channels_last=layout))
    cfg, data_why = choose_mode(cfg, device)
    if ranks.world > 1 and cfg.data.mode != "stream" and distributed.max_over_ranks(int(cfg.data.mode == "stream")):
        cfg = replace(cfg, data=replace(cfg.data, mode="stream"))  # one path for all: a node's budget is short
        data_why += "; streamed because another process's memory budget is too small"
    if cfg.data.mode == "stream":
        cfg, workers_why = choose_workers(cfg, device)
        data_why += f"; decoding workers {workers_why}" if workers_why else ""
    decisions = replace(decisions, cfg=cfg)
    ramp = _ramp_views(decisions) if cfg.augment.min_size else ()
    return RunPlan(cfg=cfg, device=str(device), rank=ranks.rank, world=ranks.world, numerics=numerics,
                   data_why=data_why, decisions=decisions, ramp_views=ramp)


def _ramp_views(d: Decisions) -> tuple[tuple[int, tuple[ViewSpec, ...]], ...]:
    """Progressive resolution (``augment.min_size``): the recipe's views at every side below ``data.size`` that
    :func:`~kontrast.augment.side_schedule` can pick, smallest first; one line for a setting it cannot take."""
    cfg, recipe = d.cfg, d.recipe
    aug, size, multiple = cfg.augment, cfg.data.size, d.patch_multiple
    low, (start, end) = aug.min_size, aug.size_ramp
    if low >= size:
        raise UserError(f"augment.min_size ({low}) must be below data.size ({size}) for progressive resolution; "
                        "set a smaller one, or 0 to train at data.size throughout")
    if start > end:
        raise UserError(f"augment.size_ramp {list(aug.size_ramp)} must start no later than it ends; e.g. [0.0, 0.75]")
    if cfg.data.mode == "stream":
        raise UserError("augment.min_size needs the images in memory (the streaming path crops at data.size as it "
                        "decodes); set data.mode=memory or augment.min_size=0")
    if low % multiple:
        raise UserError(f"augment.min_size ({low}) must be a multiple of the ViT's {multiple}-px patch; "
                        f"use {max(multiple, low // multiple * multiple)}")
    try:
        return tuple((side, recipe_views(recipe, side, aug.view, aug.views, multiple))
                     for side in ramp_sides(low, size, multiple))
    except UserError as err:
        raise UserError(f"augment.min_size ({low}) is too small for {cfg.method.name}'s views: {err}; "
                        "set a larger augment.min_size") from None


LOG_POINTS = 50  # train.log_every auto: at least this many metric lines where a run is shorter than 10 x it


def with_run_length(plan: RunPlan, total_steps: int) -> RunPlan:
    """``plan`` with ``train.log_every`` decided where it is ``auto``: every 10 steps, or every
    ``total_steps // LOG_POINTS`` (at least 1) for a short run, so its curves have points. The step count is known
    once the data is (:func:`build_run`), which is why this is the plan's one decision made after it."""
    tc = plan.cfg.train
    if tc.log_every != "auto":
        return plan
    every = min(10, max(1, total_steps // LOG_POINTS))
    return replace(plan, cfg=replace(plan.cfg, train=replace(tc, log_every=every)))


def absolute_paths(cfg: Config) -> Config:
    """``cfg`` with its paths on disk (data source, cache, initial weights) absolute, as config.yaml keeps them."""
    weights = cfg.encoder.weights and str(Path(cfg.encoder.weights).expanduser().absolute())
    cache = cfg.data.cache_dir and str(Path(cfg.data.cache_dir).expanduser().absolute())
    return replace(cfg, data=replace(cfg.data, source=absolute_source(cfg.data.source), cache_dir=cache),
                   encoder=replace(cfg.encoder, weights=weights))


def write_run_config(plan: RunPlan, run_dir: Path) -> None:
    """``RUN/config.yaml``: the config's sections (every decided value) and the plan beside them
    (:func:`kontrast.checkpoint.read_run_config` reads both)."""
    files = plugin_files(plan.cfg.method.name)  # a method from a user's file: --resume and eval load it from there
    body = {**to_dict(plan.cfg), PLAN_KEY: {**plan.to_dict(), **({RUN_KEY: files} if files else {})}}
    (Path(run_dir) / RUN_CONFIG).write_text(yaml.safe_dump(body, sort_keys=False))


@dataclass
class Schedule:
    """The run's length: ``steps_per_epoch`` full batches (the last partial one is dropped)."""

    num_samples: int
    steps_per_epoch: int
    total_steps: int

    def progress(self, step: int, epoch: int) -> Progress:
        return Progress(step=step, epoch=epoch, total_steps=self.total_steps, steps_per_epoch=self.steps_per_epoch)


def build_run(plan: RunPlan, ranks: Ranks = Ranks(), *, resume: bool = False,
              train: TrainData | None = None) -> tuple[StepContext, Schedule, TrainData]:
    """The data, method, optimizer, lr schedule and step context of ``plan`` (nothing on disk yet).

    ``resume``: the method's weights come from the checkpoint, not ``encoder.weights``. ``train``: the
    training data when the caller holds it already (``kontrast bench``: one set for every method).
    """
    cfg, tc, device = plan.cfg, plan.cfg.train, plan.torch_device
    train = train if train is not None else _load_data(plan)
    n = len(train)
    steps_per_epoch = len(batch_indices(n, tc.batch_size, 0, tc.seed))
    schedule = Schedule(n, steps_per_epoch, tc.epochs * steps_per_epoch)
    method = _build_method(plan, ranks, train.data, resume)
    training_step = _on_ranks(plan, ranks, method)  # before the optimizer: sharding makes the parameters DTensors
    optimizer = create_optimizer(method, cfg.optim, tc.batch_size)
    peak = peak_lr(cfg.optim, tc.batch_size)
    warmup = round(cfg.optim.warmup_epochs * steps_per_epoch)
    ctx = StepContext(
        method=method, optimizer=optimizer, images=None if train.stream else train.data.x.to(device),  # memory: all
        make_views=_view_maker(plan, train), view_sides=_view_sides(plan, schedule.total_steps),
        lrs=lr_schedule(peak, schedule.total_steps, warmup, cfg.optim.min_lr).tolist(), peak_lr=peak,
        wds=weight_decay_schedule(cfg.optim, schedule.total_steps), clip_grad=cfg.optim.clip_grad,
        seed=tc.seed, device=device, guard=NonFiniteGuard(method, device), precision=tc.precision,
        channels_last=tc.channels_last, nonfinite=tc.nonfinite, ranks=ranks, training_step=training_step)
    return ctx, schedule, train


def _on_ranks(plan: RunPlan, ranks: Ranks, method):
    """The step's forward on several processes: the method sharded (``train.shard``, FSDP2) or replicated (DDP);
    None on one process."""
    if ranks.world == 1:
        return None
    if plan.cfg.train.shard:
        step, line = sharding.sharded(method)
        if plan.rank == 0:
            print(line, flush=True)
        return step
    return distributed.data_parallel(method, plan.torch_device, plan.decisions.needs.idle_parameters)


def _view_maker(plan: RunPlan, train: TrainData):
    """The step's view function: at data.size, or at the step's side under progressive resolution."""
    if not plan.views:
        return None  # a sequence method: the raw batch
    if plan.ramp_views:
        return sized_view_maker({**dict(plan.ramp_views), plan.cfg.data.size: plan.views}, plan.cfg.train.compile)
    return view_maker(plan.views, compile=plan.cfg.train.compile, cropped=train.stream is not None)


def _view_sides(plan: RunPlan, total_steps: int) -> list[int] | None:
    """Progressive resolution: the views' side at every step (None: data.size throughout)."""
    if not plan.ramp_views:
        return None
    cfg = plan.cfg
    return side_schedule(total_steps, cfg.augment.min_size, cfg.data.size, cfg.augment.size_ramp,
                         plan.decisions.patch_multiple)


def _load_data(plan: RunPlan) -> TrainData:
    """The training split on the plan's path; rank 0 decodes and caches first, the others then map its entry."""
    if plan.rank > 0:
        distributed.barrier()
    train = load_train_data(plan.cfg, plan.torch_device, plan.data_why)
    if plan.rank == 0:
        print(train.line, flush=True)  # stdout: stderr stays for errors and warnings
        if plan.world > 1:
            distributed.barrier()
    return train


def _build_method(plan: RunPlan, ranks: Ranks, data, resume: bool):
    """The method on the plan's device, layout and ranks, bound to its data and checked against it."""
    cfg, tc = plan.cfg, plan.cfg.train
    torch.manual_seed(tc.seed)
    method = create_method(cfg, num_samples=len(data), pretrained=not resume, ranks=ranks,
                           decisions=plan.decisions).to(plan.torch_device)
    method = in_precision(method, tc.precision)  # fp64: parameters and buffers; the views follow in the step
    method.accumulate = tc.accumulate  # gradient caching: the per-sample part of each step in micro-batches
    if ranks.world > 1 and tc.sync_bn and plan.decisions.needs.sync_bn:
        distributed.synchronised_batch_norm(method, plan.torch_device)  # the global batch's BN statistics
    if tc.channels_last:
        method = method.to(memory_format=torch.channels_last)
    if tc.compile:  # in place (nn.Module.compile): same parameters and state_dict keys, checkpoints unchanged
        method.encoder.compile()  # (the view pipeline is compiled too: build_run's view_maker)
    check_inputs(cfg, data)  # before bind_data: the data's kind, and labels or captions where the method reads them
    note = method.bind_data(data)  # per-sample data beside the images (CLIP's captions); None for most methods
    if note:
        print(note, file=sys.stderr)
    return method
