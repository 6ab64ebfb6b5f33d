"""Gradient caching: the per-sample part of a step in micro-batches, the loss on the whole batch.

Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup"
(https://arxiv.org/abs/2101.06983). A contrastive loss is a function of every embedding of the batch, so plain
gradient accumulation (a loss per micro-batch) computes another loss. Gradient caching computes the large batch's
gradient exactly: the network that maps each sample to its embedding runs on one micro-batch at a time without
keeping its activations; the loss runs once on all embeddings and back-propagates to them; then each micro-batch
is forwarded again, with its activations, and back-propagated from its embeddings' gradient.

Here that is activation checkpointing at the embeddings (``torch.utils.checkpoint``, non-reentrant): the step is
written once, for the whole batch, and :func:`in_micro_batches` runs ``fn`` (encoder and heads) per micro-batch
under a checkpoint; autograd's backward then re-forwards one micro-batch at a time, last to first, and frees its
activations before the next. What the checkpoint keeps per micro-batch is its input and its embeddings. The
re-forward replays the first forward's random draws (dropout, stochastic depth: the checkpoint restores the RNG
state) and does not update BatchNorm running statistics a second time (:func:`_running_stats_kept`).

Micro-batch k holds rows ``k b .. (k+1) b`` of every view (``b = B / K``), concatenated view after view, as a
process k of K would hold them on ``--nproc K``; BatchNorm layers see that micro-batch's statistics. So K
micro-batches on one process compute what K processes compute without synchronised BatchNorm, and what the
plain batch computes for a network without BatchNorm (a ViT).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

Output = torch.Tensor | tuple[torch.Tensor, ...]


def in_micro_batches(fn: Callable[..., Output], views: Sequence[torch.Tensor], count: int,
                     norms: Sequence[nn.Module] = (), rows: Sequence[Sequence[torch.Tensor]] = ()) -> Output:
    """``fn(torch.cat(views), *(torch.cat(r) for r in rows))``, computed in ``count`` micro-batches (rows in the
    same order). ``rows``: per-row inputs beside the views (iBOT's masks), each a list parallel to ``views``.

    ``fn``: per-sample (row i of its output depends on row i of its input only, BatchNorm statistics aside), a
    tensor or a tuple of tensors out; ``views``: [B, ...] each, B divisible by ``count``; ``norms``: the BatchNorm
    layers ``fn`` may run (their running statistics are kept through the re-forward). ``count == 1`` or autograd
    off (a momentum teacher): no checkpoint, and with ``count == 1`` nothing but ``fn(torch.cat(views))``.
    """
    if count == 1:
        return fn(views[0] if len(views) == 1 else torch.cat(views), *(torch.cat(list(r)) for r in rows))
    b = views[0].shape[0] // count
    if any(v.shape[0] != b * count for v in views):
        raise ValueError(f"views of {[v.shape[0] for v in views]} rows do not divide into {count} micro-batches")
    cached = torch.is_grad_enabled()
    outs = []
    for k in range(count):
        x = torch.cat([v[k * b:(k + 1) * b] for v in views])  # [V b, ...] micro-batch k of every view
        args = [torch.cat([v[k * b:(k + 1) * b] for v in r]) for r in rows]  # the same rows of each per-row input
        if cached:
            y = checkpoint(fn, x, *args, use_reentrant=False,
                           context_fn=lambda: (contextlib.nullcontext(), _running_stats_kept(norms)))
        else:
            y = fn(x, *args)
        outs.append(y if isinstance(y, tuple) else (y,))
    joined = tuple(_rows_in_view_order([o[i] for o in outs], len(views), b) for i in range(len(outs[0])))
    return joined if isinstance(y, tuple) else joined[0]


def _rows_in_view_order(parts: list[torch.Tensor], n_views: int, b: int) -> torch.Tensor:
    """Micro-batch outputs ``[V b, ...]`` each -> ``[V B, ...]``: view 1's rows of every micro-batch, then
    view 2's..."""
    if any(p.shape[0] != n_views * b for p in parts):
        raise ValueError(f"a micro-batched function must keep its rows: {n_views * b} in, {parts[0].shape[0]} out")
    return torch.cat([p[j * b:(j + 1) * b] for j in range(n_views) for p in parts])  # [V B, ...]


@contextlib.contextmanager
def _running_stats_kept(norms: Sequence[nn.Module]):
    """BatchNorm running statistics as they were before the block (the re-forward updates them once more)."""
    saved = [(m, [t.clone() for t in _stats(m)]) for m in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, tensors in saved:
                for t, s in zip(_stats(m), tensors):
                    t.copy_(s)


def _stats(m: nn.Module) -> list[torch.Tensor]:
    return [t for t in (m.running_mean, m.running_var, m.num_batches_tracked) if t is not None]


def batch_norms(module: nn.Module) -> list[nn.Module]:
    """Every BatchNorm layer of ``module`` that tracks running statistics."""
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
