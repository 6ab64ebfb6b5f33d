"""Shuffling BN on one device: batch-norm statistics over groups, as if on several GPUs.

MoCo (He et al. 2020, https://arxiv.org/abs/1911.05722, section 3.3) found that a query
and its key normalised with the same batch statistics leak information ("the model appears
to cheat the pretext task"). MoCo computes BN per GPU and shuffles the key batch across
GPUs. In the authors' code (facebookresearch/moco, ``builder.py``) each GPU forwards its own
slice of one view's queries (``im_q``) in one call and, separately, its slice of the shuffled
keys (``im_k``); their CIFAR-10 demo emulates 8 GPUs on one with ``SplitBatchNorm`` over each
view's batch. Here likewise: the caller forwards one view at a time, and that view is cut into
``groups`` near-equal groups (``torch.tensor_split``: sizes differ by at most one, so any batch
of at least ``2 * groups`` works), each forwarded separately (its own BN statistics, like one
GPU). For the key encoder the view's samples are permuted before the cut and restored after, so
a key never shares BN statistics with its own query's group. A group never holds samples of two
views, since a call never sees two views.

BatchNorm in training needs 2 samples per group: with fewer than ``2 * groups`` samples the
functions use ``n // 2`` groups instead. Training never gets there (methods' ``Params.validate``
rejects such a batch before training); this keeps direct calls on tiny batches (unit tests,
benchmarks) running.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def group_count(n: int, groups: int) -> int:
    """The groups :func:`grouped_forward` uses for ``n`` samples: ``groups``, or fewer so that each holds >= 2."""
    return max(1, min(groups, n // 2))


def grouped_forward(net: nn.Module, x: torch.Tensor, groups: int) -> torch.Tensor:
    """``net`` on ``groups`` near-equal consecutive groups of ``x [N, ...]`` (separate BN statistics), concatenated.

    Pass one view at a time: the groups are cut from ``x`` alone (see the module docstring).
    """
    groups = group_count(x.shape[0], groups)
    if groups <= 1:
        return net(x)
    return torch.cat([net(part) for part in torch.tensor_split(x, groups)])  # [N, D]


def shuffled_forward(net: nn.Module, x: torch.Tensor, groups: int, ranks=None) -> torch.Tensor:
    """Like :func:`grouped_forward`, but samples are assigned to groups by a random permutation of ``x``.

    ``ranks`` (a ``kontrast.methods.base.Ranks`` of W > 1 processes, each holding its slice of the global
    batch): MoCo's shuffling BN across GPUs (``builder.py``, ``_batch_shuffle_ddp``): every rank's ``x`` is
    gathered, one permutation of the global batch is broadcast from rank 0, each rank forwards its slice of
    the shuffled batch in ``groups / W`` groups, and the outputs are gathered and unshuffled. The same
    permutation and groups as one process with ``groups`` groups on the global batch.
    """
    world = ranks.world if ranks is not None else 1
    if world > 1:
        b = x.shape[0]
        mine = ranks.own(b)  # this rank's rows of the global batch
        perm = ranks.broadcast(torch.randperm(b * world, device=x.device))  # [N] one shuffle for every rank
        out = grouped_forward(net, ranks.gather(x)[perm[mine]], groups // world)  # [b, D] this rank's shuffled slice
        return ranks.gather(out)[torch.argsort(perm)][mine]  # [b, D] unshuffled, this rank's rows
    if group_count(x.shape[0], groups) <= 1:
        return net(x)
    perm = torch.randperm(x.shape[0], device=x.device)  # [N]
    out = grouped_forward(net, x[perm], groups)  # [N, D] in shuffled order
    return out[torch.argsort(perm)]  # [N, D] back in input order
