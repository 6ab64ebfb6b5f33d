"""torch.distributed in kontrast: the process group, collectives that autograd tracks, BN over all ranks.

Processes are started by PyTorch's own launcher, torchrun (``torch.distributed.run``; ``kontrast train
--nproc N`` calls it), which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous address;
:func:`init` reads them and joins the default process group (gloo on CPU, nccl on CUDA). Without them
the run is one process and nothing here is used.

The contract (docs/distributed.md): a run on W ranks with global batch B computes what one process
computes with batch B. Each rank takes its slice of the step's global batch; the methods see a
:class:`ProcessGroupRanks` (``method.ranks``) for the few places where samples of other ranks enter
(in-batch negatives, batch statistics); BatchNorm layers take the global batch's statistics
(:func:`synchronised_batch_norm`: ``torch.nn.SyncBatchNorm`` on CUDA, :class:`GlobalBatchNorm` on CPU);
gradients are averaged over ranks by DistributedDataParallel while the backward runs (:func:`data_parallel`),
which with the gathers' summed backward gives the gradient of the global loss (the mean over all anchors).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as collectives
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from kontrast.errors import UserError
from kontrast.methods.base import Ranks
from kontrast.precision import at_least_float32


def launched() -> bool:
    """True in a process started by torchrun (``WORLD_SIZE`` set)."""
    return "WORLD_SIZE" in os.environ


def init(device: torch.device, bind: bool = True, timeout: float = 1800.0) -> ProcessGroupRanks:
    """Join the process group torchrun describes (idempotent); the ranks object the methods use.

    ``bind`` (``train.bind_cores``): on CPU, first :func:`bind_cores`, so gloo's threads start on this rank's cores.
    ``timeout`` (``train.collective_timeout``): seconds a collective waits for the other ranks; past it the
    collective raises and the run ends as for a lost process (a rank that is stuck, not dead, ends the run).
    """
    if not dist.is_initialized():
        if bind and device.type == "cpu":
            bind_cores()
        wait = timedelta(seconds=timeout)
        store = restarted_attempt_store(wait)
        ranks = {} if store is None else {"store": store, "rank": int(os.environ["RANK"]),
                                          "world_size": int(os.environ["WORLD_SIZE"])}
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=wait, **ranks)
    return ProcessGroupRanks()


def restarted_attempt_store(timeout: timedelta) -> dist.Store | None:
    """For an attempt that torchrun restarted (``--max-restarts``), its agent's store under a prefix of the attempt's
    own; None otherwise (the default rendezvous). Without it the restarted processes read the first attempt's keys
    in the agent's store, which outlives attempts, and dial its dead peers' addresses: gloo's connectFullMesh fails
    with "Connection refused" (PyTorch 2.14.1, plain ``init_process_group`` in a 2-process ``torchrun --standalone
    --max-restarts 1``; docs/distributed.md, "Faults")."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    return dist.PrefixStore(f"/kontrast/attempt_{attempt}", agent)


def bind_cores() -> set[int] | None:
    """With several CPU processes on this node, each on its own cores: local rank r on cores [r t, (r + 1) t).

    t = this process's torch threads. Only when every local rank's threads fit in the cores this process may use
    (``os.sched_getaffinity``, which ``taskset`` and cgroups narrow); otherwise the scheduler places them, as
    before. A rank's threads and gloo's then share its cores: a collective waiting on the other rank no longer
    waits for a thread that the scheduler moved onto a busy core. 2 ranks x 1 thread, gloo, a 2-core CPU, one
    small collective after each convolution: 0.33-0.98 ms per call bound, 1.1-2.0 ms unbound
    (``benchmarks/gloo_latency.py``, docs/distributed.md).
    """
    local_world, local_rank = int(os.environ.get("LOCAL_WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    if local_world < 2 or not hasattr(os, "sched_setaffinity"):
        return None
    cores, threads = sorted(os.sched_getaffinity(0)), torch.get_num_threads()
    if local_world * threads > len(cores):
        return None
    mine = set(cores[local_rank * threads: (local_rank + 1) * threads])
    for task in os.listdir("/proc/self/task"):  # every thread of this process (OpenMP's, if it started any)
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task), mine)
    return mine


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
        lost its gradient (pytorch issue 120386); tests/integration/test_distributed.py checks both.
        """
        return collectives.all_gather_single(x.contiguous(), 0, dist.group.WORLD)

    def pass_on(self, x: torch.Tensor) -> torch.Tensor:
        """Rank r's ``x`` to rank r + 1 and rank r - 1's back, in one all-to-all whose other splits are empty (its
        backward sends the gradient the other way round the ring)."""
        w, r, b = self.world, self.rank, x.shape[0]
        send = [b if k == (r + 1) % w else 0 for k in range(w)]  # rows to each rank
        receive = [b if k == (r - 1) % w else 0 for k in range(w)]  # rows from each rank
        return collectives.all_to_all_single_autograd(x.contiguous(), receive, send, dist.group.WORLD)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        x = x.contiguous()
        dist.broadcast(x, src)
        return x


class TrainingStep(nn.Module):
    """A method's ``training_step`` as a module's ``forward``: DDP hooks its wrapper's forward, and a step calls several
    sub-networks (encoder, heads, an EMA target) from the method's own code."""

    def __init__(self, method: nn.Module):
        super().__init__()
        self.method = method

    def forward(self, views, indices, progress):
        return self.method.training_step(views, indices, progress)


IDLE = "Expected to have finished reduction in the prior iteration"  # DDP's error for a parameter left without gradient


def data_parallel(method: nn.Module, device: torch.device, idle_parameters: bool = False) -> Callable:
    """``method.training_step`` under PyTorch's :class:`~torch.nn.parallel.DistributedDataParallel`: every trainable
    parameter's gradient averaged over ranks in buckets, each bucket's all_reduce started while the backward goes on.

    With the gathers' summed backward that average is the gradient of the global loss (the mean over all anchors).
    Parameters that need no gradient (EMA targets, a frozen patch projection) and networks outside the method (a
    distillation teacher) are not DDP's. ``forward_sync_buffers`` off: the ranks' buffers (queues, BN running
    statistics, memory banks) are kept equal by the methods' own gathers, and MoCo's shuffling BN keeps each rank's
    running statistics its own, as on the authors' GPUs. ``idle_parameters`` (a method's ``Needs``): some parameters
    get no gradient on some steps (prototypes frozen early), so DDP looks for them after each forward
    (``find_unused_parameters``); elsewhere that search is skipped.
    """
    replicas = DistributedDataParallel(TrainingStep(method), device_ids=[device] if device.type == "cuda" else None,
                                       forward_sync_buffers=False, find_unused_parameters=idle_parameters)

    def training_step(views, indices, progress):
        try:
            return replicas(views, indices, progress)
        except RuntimeError as exc:
            if IDLE in str(exc):
                raise UserError(f"{type(method).__name__} left a trainable parameter without a gradient in a step on "
                                "several processes; declare `needs = Needs(idle_parameters=True)` on the method's "
                                "class") from None
            raise

    return training_step


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


def first_over_ranks(item):
    """The lowest rank's ``item`` that is not None (any picklable value), the same on every rank; None when no
    rank has one. One 1-int all_reduce a call; the objects travel only when some rank has one."""
    if not max_over_ranks(int(item is not None)):
        return None
    items = [None] * dist.get_world_size()
    dist.all_gather_object(items, item)
    return next(x for x in items if x is not None)


def mean_metrics(metrics: dict[str, float], world: int) -> dict[str, float]:
    """Each logged metric averaged over ranks (the loss: the mean over every rank's anchors)."""
    keys = sorted(metrics)
    t = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) / world for k, v in zip(keys, t)}


class _GlobalBatchNormFn(torch.autograd.Function):
    """Batch normalisation with the global batch's statistics: one collective forward, one backward.

    Forward: each rank's mean and biased variance, all-gathered with its count and combined
    (Chan et al.'s parallel variance), then the fused ``F.batch_norm`` kernel with those statistics.
    Backward (the gradient of the sum of every rank's loss, as the gathers' reduce-scatter gives it):
    ``dx = w / sigma * (dy - mean(dy) - xhat * mean(dy * xhat))`` with both means over the global batch
    (one all_reduce): PyTorch's fused kernel with this rank's means, corrected to the global ones;
    ``dw``, ``db`` from this rank's samples, averaged with the other gradients after.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float):
        # [C] each, this rank; PyTorch's BN statistics kernel (on CPU ~5x faster than var_mean over these dims)
        mean_r, var_r = torch.batch_norm_update_stats(x, None, None, 0.0)
        n_r = x.new_full((1,), x.numel() / x.shape[1])
        stats = x.new_empty(dist.get_world_size() * (2 * x.shape[1] + 1))
        dist.all_gather_single(stats, torch.cat([mean_r, var_r, n_r]))
        stats = stats.view(dist.get_world_size(), -1)  # [W, 2C + 1]: every rank's mean, variance, count
        # [W, C] [W, C] [W, 1]
        means, variances, counts = stats[:, : x.shape[1]], stats[:, x.shape[1]: -1], stats[:, -1:]
        n = counts.sum()
        mean = (counts * means).sum(0) / n  # [C]
        var = (counts * (variances + (means - mean).pow(2))).sum(0) / n  # [C] biased, over the global batch
        y = F.batch_norm(x, mean, var, weight, bias, False, 0.0, eps)
        invstd = torch.rsqrt(var + eps)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.n, ctx.eps = n, eps
        ctx.mark_non_differentiable(mean, var, n)
        return y, mean, var, n

    @staticmethod
    def backward(ctx, dy, _mean, _var, _n):
        x, weight, mean, invstd = ctx.saved_tensors
        shape = [1, -1] + [1] * (x.dim() - 2)
        w = torch.ones_like(mean) if weight is None else weight
        # PyTorch's fused kernel with the global statistics: dx from this rank's means of dy and dy * xhat, and
        # db = sum(dy), dw = sum(dy * xhat) over this rank's samples
        dx, dw, db = torch.ops.aten.native_batch_norm_backward(dy, x, w, None, None, mean, invstd, True, ctx.eps,
                                                               [True, True, True])
        sums = torch.cat([db, dw])
        dist.all_reduce(sums)  # [2C]: the same sums over the global batch
        g_db, g_dw = sums.chunk(2)
        n_r = x.numel() / x.shape[1]
        # swap this rank's means for the global ones: dx += w / sigma * (a + xhat * b), linear in x per channel
        a = w * invstd * (db / n_r - g_db / ctx.n)  # [C]
        b = w * invstd * (dw / n_r - g_dw / ctx.n)  # [C]
        scale = b * invstd
        dx.addcmul_(x, scale.view(shape)).add_((a - scale * mean).view(shape))
        return dx, dw if weight is not None and ctx.needs_input_grad[1] else None, \
            db if ctx.needs_input_grad[2] else None, None


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics are those of the global batch (all ranks), on any device.

    torch.nn.SyncBatchNorm computes the same but refuses CPU tensors (it needs CUDA, HPU or XPU; its
    statistics kernels exist only there), and kontrast's distributed tests run on CPU with gloo. Like
    it, two collectives per layer and step (:class:`_GlobalBatchNormFn`); biased variance for
    normalising, unbiased for the running estimate, as ``nn.BatchNorm``. State-dict keys as BatchNorm.
    """

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input, got {x.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        weight = None if self.weight is None else at_least_float32(self.weight)
        bias = None if self.bias is None else at_least_float32(self.bias)
        y, mean, var, n = _GlobalBatchNormFn.apply(at_least_float32(x), weight, bias, self.eps)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = self.momentum
                self.running_mean.mul_(1 - m).add_(mean, alpha=m)
                self.running_var.mul_(1 - m).add_(var * n / (n - 1), alpha=m)
        return y.to(x.dtype)


SYNC_BN_DEVICES = ("cuda", "xpu", "hpu")  # where torch.nn.SyncBatchNorm has its statistics kernels


def synchronised_batch_norm(module: nn.Module, device: torch.device) -> nn.Module:
    """Every BatchNorm of ``module`` (in place, same parameters, buffers and state-dict keys) with the training
    statistics of the global batch: PyTorch's :class:`torch.nn.SyncBatchNorm` on the devices it runs on (CUDA, XPU,
    HPU: its fused statistics kernels, with nccl), :class:`GlobalBatchNorm` where it refuses the tensors (CPU)."""
    if device.type in SYNC_BN_DEVICES:
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    return global_batch_norm(module)


def global_batch_norm(module: nn.Module) -> nn.Module:
    """Every BatchNorm of ``module`` replaced (in place, the same parameter and buffer objects) by
    :class:`GlobalBatchNorm`."""
    for name, child in module.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm) and not isinstance(child, GlobalBatchNorm):
            if child.momentum is None:
                raise UserError("train.sync_bn: BatchNorm with momentum=None (cumulative average) is not supported")
            new = GlobalBatchNorm(child.num_features, child.eps, child.momentum, child.affine,
                                  child.track_running_stats)
            # the same Parameter and buffer objects, as convert_sync_batchnorm keeps them: an EMA target's BN stays
            # frozen (requires_grad False) and the optimizer's references hold
            for key, value in [*child.named_parameters(recurse=False), *child.named_buffers(recurse=False)]:
                setattr(new, key, value)
            new.train(child.training)
            setattr(module, name, new)
        else:
            global_batch_norm(child)
    return module
