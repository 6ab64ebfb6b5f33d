"""What every method is: a composition of the five rooms behind two hooks.

The training loop knows nothing else about a method:

``out = training_step(views, indices, progress)``
    ``views``: the batch's views (one tensor per view); ``indices``: the batch's positions in the
    dataset, [B] long, for per-sample state such as memory banks; ``progress``: where the run is
    (a :class:`Progress` whose ``step`` counts the optimizer steps finished *before* this one).
    Returns ``out``: ``"loss"`` (0-d, what is minimised), the 0-d metrics to log, and any
    non-0-d tensors that ``after_step`` needs, under names each method documents (MoCo's
    ``"keys"``, InstDisc's ``"indices"`` and ``"features"``). The loop logs the 0-d entries only
    and hands the whole dict on.
``after_step(out, progress)``
    After the optimizer step, with that step's ``out`` and its :class:`Progress` (``step`` now
    *including* this step): where stateful parts are updated (queues, EMA targets, memory banks).

Inside ``training_step`` the per-sample part (encoder and heads, up to the embeddings the loss compares)
runs through :meth:`Method.in_micro_batches`; everything after it (scores, loss, Sinkhorn, centres, batch
statistics) runs once on the whole batch. With ``train.accumulate K`` that is gradient caching
(:mod:`kontrast.micro_batches`): the step, ``after_step`` and all state still happen once per optimizer step.

State flows through ``out``, never through hidden attributes, and time through ``progress``: no
method keeps its own step counter. Outside training (unit tests, the benchmarks' callers of the
method alone) ``progress`` may be None in ``training_step``: the method then acts as at step 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from kontrast.decisions import Needs
from kontrast.micro_batches import batch_norms, in_micro_batches


@dataclass(frozen=True)
class Progress:
    """Where a training run is, as the loop passes it to both hooks.

    step:            optimizer steps finished so far: in ``training_step`` the steps before this
                     one, in ``after_step`` including this one
    epoch:           0-based epoch of this step
    total_steps:     steps of the whole run
    steps_per_epoch: full batches per epoch (the loop drops the last partial batch)
    """

    step: int
    epoch: int
    total_steps: int
    steps_per_epoch: int

    @property
    def fraction(self) -> float:
        """``step / total_steps``: the share of the run done (momentum schedules read it in ``after_step``)."""
        return self.step / self.total_steps

    @property
    def epochs_done(self) -> float:
        """``step / steps_per_epoch`` as a float (0.0 when ``steps_per_epoch`` is 0): epoch-based switches read it."""
        return self.step / self.steps_per_epoch if self.steps_per_epoch else 0.0


class Ranks:
    """The processes a step is spread over, as a method sees them; this default is one process.

    A run on W ranks (``kontrast train --nproc W``; docs/distributed.md) gives each rank its slice of
    the global batch, ``b = B / W`` samples, rank r holding samples ``r*b .. (r+1)*b`` of the step.
    The training room passes one backed by torch.distributed to the method's constructor; a method never
    imports it. ``gather`` carries gradients back to every rank's inputs.
    """

    rank: int = 0
    world: int = 1

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, ...]`` of every rank in rank order: ``[W * b, ...]`` (one process: ``x``)."""
        return x

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank ``src``'s ``x`` on every rank (one process: ``x``)."""
        return x

    def pass_on(self, x: torch.Tensor) -> torch.Tensor:
        """Around the ring: this rank's ``x [b, ...]`` goes to rank r + 1 and rank r - 1's comes back (one process:
        ``x``); the gradient flows back to the rank that sent it."""
        return x

    def gather_uneven(self, x: torch.Tensor, counts: list[int] | None = None) -> tuple[torch.Tensor, int]:
        """Every rank's ``x [n_r, ...]`` in rank order, where the ranks' n differ (iBOT's masked patches), and where
        this rank's rows start: each pads to the largest n for :meth:`gather`, then the padding is cut (one process:
        ``(x, 0)``). ``counts``: every rank's n when each rank knows them on the host (iBOT draws the global batch's
        masks on every rank); without them the ranks exchange them first, and the device waits for that read."""
        if self.world == 1:
            return x, 0
        if counts is None:
            counts = self.gather(torch.tensor([x.shape[0]], device=x.device)).tolist()  # [W] rows of each rank
        padded = x.new_zeros(max(counts), *x.shape[1:])
        padded[:x.shape[0]] = x
        every = self.gather(padded).view(len(counts), max(counts), *x.shape[1:])  # [W, max n, ...]
        return torch.cat([every[r, :c] for r, c in enumerate(counts)]), sum(counts[:self.rank])

    def own(self, n: int) -> slice:
        """This rank's ``n`` rows among every rank's ``W n`` (in :meth:`gather`'s rank order)."""
        return slice(self.rank * n, (self.rank + 1) * n)

    def everyone(self, x: torch.Tensor) -> tuple[torch.Tensor, slice]:
        """The global candidates and this rank's own rows in them: ``(gather(x) [W n, ...], own(n))``."""
        return self.gather(x), self.own(x.shape[0])


# what methods declared before `needs`, and where each went
RETIRED_DECLARATIONS = {"distributed": "Needs(processes=True)", "vit_only": "Needs(vit=True)",
                        "sync_bn": "Needs(sync_bn=False)", "check_world": "Needs(pool=..., bn_groups=...)",
                        "encoder_side": "Needs(encoder_side=...)", "size_problem": "Needs(min_view=...)"}


class Method(nn.Module):
    """Base class: holds ``encoder`` (what evaluation uses) and declares the recipe.

    Subclasses set ``name``, ``description`` (one line), ``recipe`` (an augment
    recipe name), ``Params`` (a frozen dataclass of their hyperparameters, paper
    defaults) and optionally ``defaults`` (overrides of other config sections,
    e.g. BYOL's LARS optimizer) and ``vit_defaults`` (applied over them when the encoder is
    a ViT: DINO's and MoCo v3's ViT recipes; :func:`kontrast.methods.build.method_defaults`).
    ``needs`` declares what the method needs from a run as data (:class:`~kontrast.decisions.Needs`: sequences
    or images and how many views, a ViT only, several processes, labels, text, a pool of samples that divides the
    batch, the smallest view); :func:`kontrast.decisions.decide` checks all of it in one place.
    A ``Params`` may define ``resolved(cfg)`` (its ``auto`` values decided from the config) and
    ``lines(cfg)`` (start-up lines saying what it decided). ``fixed_lr_modules`` names submodules whose
    learning rate stays at the peak instead of following the schedule (SimSiam's predictor).
    ``retired_state`` names state-dict entries that checkpoints of older versions hold and this
    one no longer keeps (SwAV's ``steps``); loading a checkpoint drops them.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    recipe: ClassVar[str]
    Params: ClassVar[type]
    defaults: ClassVar[Mapping[str, Any]] = {}
    vit_defaults: ClassVar[Mapping[str, Any]] = {}  # over `defaults` on a ViT encoder: the paper's ViT recipe
    vit_recipe: ClassVar[str] = ""  # where vit_defaults come from (said at start-up)
    fixed_lr_modules: tuple[str, ...] = ()
    needs: ClassVar[Needs] = Needs()  # what it needs from a run, checked by kontrast.decisions.decide
    retired_state: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        old = [name for name in RETIRED_DECLARATIONS if name in vars(cls)]
        if old:
            raise TypeError(f"{cls.__name__} declares {', '.join(old)}: a method declares what it needs as "
                            f"`needs = Needs(...)` ({RETIRED_DECLARATIONS[old[0]]})")

    def __init__(self, encoder: nn.Module, params: Any, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__()
        self.encoder = encoder
        self.params = params
        self.num_samples = num_samples  # training-set size, for per-sample state (0 when unknown)
        self.ranks = ranks  # the processes a step is spread over (one, or the training room's torch.distributed ones)
        self.accumulate = 1  # train.accumulate (the training room sets it): each process's batch in this many parts

    @property
    def micro_batches(self) -> int:
        """The micro-batches a training step's per-sample part runs in (``accumulate``; 1 outside training)."""
        return self.accumulate if self.training else 1

    def in_micro_batches(self, fn, views: list[torch.Tensor], *rows: list[torch.Tensor]):
        """``fn(torch.cat(views), *(torch.cat(r) for r in rows))`` for the per-sample part of a step (encoder,
        heads; ``rows``: per-row inputs parallel to ``views``, iBOT's masks): in training with ``accumulate`` K > 1,
        run on K micro-batches with gradient caching (:mod:`kontrast.micro_batches`), micro-batch k holding rows
        k b .. (k+1) b of every view, as process k of K would."""
        count = self.micro_batches
        return in_micro_batches(fn, views, count, batch_norms(self) if count > 1 else (), rows)

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        """Forward and loss: ``{"loss": 0-d, <0-d metrics>, <state for after_step>}`` (module docstring)."""
        raise NotImplementedError

    def after_step(self, out: dict[str, torch.Tensor], progress: Progress) -> None:
        """Update stateful parts after the optimizer step from ``out`` (this step's ``training_step`` output)."""

    def frozen_networks(self) -> tuple[nn.Module, ...]:
        """Networks the step runs forward only that are not submodules (a distillation teacher): outside the
        optimizer and the checkpoint, and timed by ``kontrast bench`` as targets are. Most methods have none."""
        return ()

    def bind_data(self, data: Any) -> str | None:
        """Receive the training set (:class:`~kontrast.data.Samples`) once, before training.

        For per-sample data a method needs beside the inputs (CLIP's captions), looked up
        with ``indices`` in ``training_step``; kept out of checkpoints (it is data, not state).
        Returns an optional one-line note for the log. Most methods need nothing.
        """
        return None


def step_generator() -> torch.Generator:
    """A CPU generator seeded from the step's seed (the training room seeds each step from the run's seed and the
    step): draws alike on every rank, new each step, repeated by a resumed run (LeJEPA's directions, iBOT's masks)."""
    return torch.Generator().manual_seed(torch.initial_seed())


def embedding_std(z: torch.Tensor) -> torch.Tensor:
    """Mean per-dimension std of L2-normalised embeddings: ~1/sqrt(D) healthy, 0 collapsed.

    (Monitor from SimSiam, Chen & He 2021, https://arxiv.org/abs/2011.10566, section 4.1.)
    """
    return F.normalize(z.detach().float(), dim=1).std(dim=0).mean()
