"""InfoNCE over cosine scores with memory linear in the batch: the [N, M] matrix is never whole.

Dense InfoNCE builds ``scores [N, M]`` and keeps it (and its softmax) for the backward pass:
for SimCLR's 2B x 2B that is quadratic in the batch (B = 8192: 16384^2 fp32 = 1 GiB per copy).
Here the loss is written as

    L = mean_i [ logsumexp_{j != excluded(i)} s_ij - s_i,pos(i) ],   s_ij = a_i . c_j / tau

(van den Oord et al. 2018, https://arxiv.org/abs/1807.03748, eq. 4; SimCLR's NT-Xent is the
case a = c = cat(z1, z2), pos(i) = the other view, excluded(i) = i). The positive term is a
row-wise product (autograd, O(N D)); the log-sum-exp is a custom autograd Function that visits
the anchors in row blocks of ``chunk`` rows, keeps only ``lse [N]``, and in the backward pass
recomputes each block's scores to form the softmax-weighted gradients

    dL/da_i = (sum_j p_ij c_j) g_i,    dL/dc_j = sum_i p_ij a_i g_i,    p_ij = exp(s_ij - lse_i)

so peak extra memory is ``chunk x M`` floats, linear in the batch for a fixed chunk. The
price is one more matmul per block in the backward pass and ceil(N / chunk) kernel calls
instead of one. ``nt_xent`` switches to this form above ``CHUNKED_ABOVE`` score entries
(measured in docs/lab/performance.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kontrast.precision import at_least_float32, float32

CHUNK_ROWS = 1024  # anchors per block: chunk x M scores live at once
# nt_xent uses the blocked form when N x M exceeds this (SimCLR batches above 512): on one CPU thread it
# was 1.5x faster than the dense form at batch 512 and break-even at batch 256 (docs/lab/performance.md,
# `kontrast bench --sections loss`); below it the dense form is as fast and is the simplest reference.
CHUNKED_ABOVE = 1 << 20


class _BlockLogSumExp(torch.autograd.Function):
    """``lse[i] = logsumexp_j (a @ c.T)[i, j]`` over all columns but ``exclude[i]``, in row blocks."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, c: torch.Tensor, exclude: torch.Tensor | None, chunk: int) -> torch.Tensor:
        lse = a.new_empty(a.shape[0])  # [N]
        for start in range(0, a.shape[0], chunk):
            s = a[start : start + chunk] @ c.T  # [C, M] one block of scores
            if exclude is not None:
                s.scatter_(1, exclude[start : start + chunk, None], float("-inf"))  # drop each row's own column
            lse[start : start + chunk] = torch.logsumexp(s, dim=1)  # [C]
        ctx.save_for_backward(a, c, exclude, lse)
        ctx.chunk = chunk
        return lse

    @staticmethod
    def backward(ctx, grad_lse: torch.Tensor):
        a, c, exclude, lse = ctx.saved_tensors
        grad_a, grad_c = torch.empty_like(a), torch.zeros_like(c)  # [N, D], [M, D]
        for start in range(0, a.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            s = a[rows] @ c.T  # [C, M] recomputed
            if exclude is not None:
                s.scatter_(1, exclude[rows, None], float("-inf"))
            p = (s - lse[rows, None]).exp_().mul_(grad_lse[rows, None])  # [C, M] softmax x upstream grad
            grad_a[rows] = p @ c  # [C, D]
            grad_c.addmm_(p.T, a[rows])  # [M, D] += [M, C] @ [C, D]
        return grad_a, grad_c, None, None


def info_nce_chunked(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    positives: torch.Tensor,
    temperature: float,
    *,
    exclude: torch.Tensor | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """``info_nce(cosine(anchors, candidates, temperature), positives, mask)`` without the [N, M] matrix.

    anchors:    [N, D], candidates: [M, D] (normalised here; fp32 even under autocast, fp64 stays fp64)
    positives:  [N] int64, column of each row's positive
    exclude:    [N] int64, one column per row left out of the denominator (NT-Xent: the anchor
                itself), or None; it must not be the row's positive
    chunk:      anchors per block (memory ``chunk x M``; default ``CHUNK_ROWS``)
    """
    with float32(anchors):
        a = F.normalize(at_least_float32(anchors), dim=1) / temperature  # [N, D], 1/tau folded into the anchors
        c = F.normalize(at_least_float32(candidates), dim=1)  # [M, D]
        positive = (a * c[positives]).sum(dim=1)  # [N] s_i,pos(i)
        lse = _BlockLogSumExp.apply(a, c, exclude, chunk or CHUNK_ROWS)  # [N]
        return (lse - positive).mean()
