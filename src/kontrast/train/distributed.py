"""torch.distributed in kontrast: the process group, collectives that autograd tracks, BN over all ranks.

Processes are started by PyTorch's own launcher, torchrun (``torch.distributed.run``; ``kontrast train
--nproc N`` calls it), which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous address;
:func:`init` reads them and joins the default process group (gloo on CPU, nccl on CUDA). Without them
the run is one process and nothing here is used.

The contract (docs/distributed.md): a run on W ranks with global batch B computes what one process
computes with batch B. Each rank takes its slice of the step's global batch; the methods see a
:class:`ProcessGroupRanks` (``method.ranks``) for the few places where samples of other ranks enter
(in-batch negatives, batch statistics); BatchNorm layers become :class:`GlobalBatchNorm` (statistics
over the global batch); gradients are averaged over ranks after the backward, which with the
gathers' summed backward gives the gradient of the global loss (the mean over all anchors).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as collectives
import torch.nn as nn
import torch.nn.functional as F

from kontrast.errors import UserError
from kontrast.methods.base import Ranks


def launched() -> bool:
    """True in a process started by torchrun (``WORLD_SIZE`` set)."""
    return "WORLD_SIZE" in os.environ


def init(device: torch.device) -> "ProcessGroupRanks":
    """Join the process group torchrun describes (idempotent); the ranks object the methods use."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return ProcessGroupRanks()


def check_world(cfg, world: int) -> None:
    """A run on ``world`` processes needs a global batch that divides by it and a method verified across ranks."""
    from kontrast.registry import METHODS

    if cfg.train.batch_size % world:
        raise UserError(f"train.batch_size ({cfg.train.batch_size}) is the global batch and must divide by the number "
                        f"of processes ({world}); use a multiple of {world}")
    if world > 1 and not METHODS.get(cfg.method.name).distributed:
        raise UserError(f"method {cfg.method.name!r} does not run on several processes yet (docs/distributed.md lists "
                        "the methods that do); train it with --nproc 1")
    METHODS.get(cfg.method.name).check_world(cfg.method.params, world, cfg.train.batch_size)


def local_device(device: torch.device) -> torch.device:
    """On CUDA each process of a node takes its own GPU (``LOCAL_RANK``); CPU ranks share the CPU."""
    if device.type == "cuda" and launched():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return device


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class ProcessGroupRanks(Ranks):
    """:class:`~kontrast.methods.base.Ranks` over the default process group."""

    def __init__(self):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, ...]`` of every rank concatenated in rank order, ``[W * b, ...]``; gradient flows back.

        PyTorch's functional collectives (what ``torch.distributed.nn.functional``, now deprecated, points
        to): the backward is a reduce-scatter, so each rank's slice gets the sum of every rank's gradient.
        The input is made contiguous first: a backward through all_gather of a non-contiguous tensor once
        lost its gradient (pytorch issue 120386); tests/test_distributed.py checks both.
        """
        return collectives.all_gather_single(x.contiguous(), 0, dist.group.WORLD)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, gradient tracked (the backward sums the gradients of every rank's copy)."""
        return _sum_over_ranks(x)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        x = x.contiguous()
        dist.broadcast(x, src)
        return x


def _sum_over_ranks(x: torch.Tensor) -> torch.Tensor:
    return collectives.all_reduce(x.contiguous(), "sum", dist.group.WORLD)  # gradient: summed over ranks


def average_gradients(params: list[torch.Tensor], world: int) -> None:
    """Mean of every gradient over ranks, in one all_reduce of a flat buffer (what DDP's buckets compute).

    Every rank holds gradients for the same parameters (the methods' control flow does not depend on
    the rank), so the buffers line up.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1).float() for g in grads])  # [P]
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def barrier() -> None:
    dist.barrier()


def peer_lost(exc: BaseException) -> bool:
    """Did a collective fail because another process went away (killed, crashed, its node lost)?"""
    text = str(exc)
    return isinstance(exc, dist.DistError) or any(
        s in text for s in ("Connection reset", "Connection closed", "Broken pipe", "gloo", "NCCL"))


def first_line(exc: BaseException) -> str:
    """The error's first line without the backend's source location, for a one-line message."""
    line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return line.split("] ", 1)[-1][:160]


def max_over_ranks(value: int) -> int:
    """The largest ``value`` of any rank (a received signal's number, 0 for none)."""
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def mean_metrics(metrics: dict[str, float], world: int) -> dict[str, float]:
    """Each logged metric averaged over ranks (the loss: the mean over every rank's anchors)."""
    keys = sorted(metrics)
    t = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) / world for k, v in zip(keys, t)}


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics are those of the global batch (all ranks), on any device.

    torch.nn.SyncBatchNorm computes the same but refuses CPU tensors (it needs CUDA, HPU or XPU), and
    kontrast's distributed tests run on CPU with gloo. Two passes, like the single-process kernel (the
    mean, then the mean squared deviation), each one all_reduce that autograd tracks; biased variance
    for normalising, unbiased for the running estimate, as ``nn.BatchNorm``. State-dict keys as BatchNorm.
    """

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input, got {x.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        dims = [0] + list(range(2, x.dim()))  # all but the channel
        shape = [1, -1] + [1] * (x.dim() - 2)
        xf = x.float()
        count = torch.tensor([xf.numel() / xf.shape[1]], device=x.device, dtype=torch.float32)
        sums = _sum_over_ranks(torch.cat([xf.sum(dims), count]))  # [C + 1] over all ranks
        n = sums[-1]
        mean = sums[:-1] / n  # [C]
        centred = xf - mean.view(shape)
        var = _sum_over_ranks(centred.pow(2).sum(dims)) / n  # [C] biased
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = self.momentum
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                self.running_var.mul_(1 - m).add_(var.detach() * n / (n - 1), alpha=m)
        y = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)


def global_batch_norm(module: nn.Module) -> nn.Module:
    """Every BatchNorm of ``module`` replaced (in place, same parameters and buffers) by :class:`GlobalBatchNorm`."""
    for name, child in module.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm) and not isinstance(child, GlobalBatchNorm):
            if child.momentum is None:
                raise UserError("train.sync_bn: BatchNorm with momentum=None (cumulative average) is not supported")
            new = GlobalBatchNorm(child.num_features, child.eps, child.momentum, child.affine, child.track_running_stats)
            new.load_state_dict(child.state_dict())
            new.train(child.training)
            setattr(module, name, new.to(next(child.buffers(), torch.empty(0)).device))
        else:
            global_batch_norm(child)
    return module
