"""Similarity room: ``scores [N, M]`` between anchors and candidates.

Every contrastive loss in kontrast starts from such a score matrix; changing
the similarity (dot, cosine/temperature, kernels) changes no loss.

Kernels (Kernel-InfoNCE, Tan, Zhang, Yang & Yuan, "Contrastive Learning Is Spectral Clustering
on Similarity Graph", ICLR 2024, https://arxiv.org/abs/2303.15103) return *log*-kernel scores,
``log k(a, b)``, so that ``info_nce`` over them is InfoNCE with the kernel as similarity:
``exp(score) = k``. On the unit sphere ``||a - b||^2 = 2 - 2 a.b``, so the Gaussian kernel with
temperature ``2 tau`` gives the cosine scores ``a.b / tau`` minus a constant ``1 / tau``, which
softmax ignores: Gaussian-kernel InfoNCE *is* cosine InfoNCE there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kontrast.precision import at_least_float32, float32


def dot(anchors: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Plain inner products: ``[N, D] x [M, D] -> [N, M]``."""
    return anchors @ candidates.T  # [N, M]


def cosine(anchors: torch.Tensor, candidates: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Cosine similarity divided by a temperature (SimCLR's sim(u, v) / tau).

    Computed in float32 even under bf16 autocast (which would otherwise run the matmul in
    bf16): a small tau amplifies rounding (measured at tau 0.01: 2e-3 relative loss error in
    bf16, 1e-7 in fp32; tests/integration/test_reliability_guards.py).
    """
    with float32(anchors):
        a = F.normalize(at_least_float32(anchors), dim=1)  # [N, D]
        c = F.normalize(at_least_float32(candidates), dim=1)  # [M, D]
        return a @ c.T / temperature  # [N, M]


@dataclass(frozen=True)
class CosineScores:
    """``cosine(anchors, candidates, temperature)``, ``[N, M]``, not yet formed.

    What :func:`~kontrast.losses.infonce.info_nce` takes where the matrix can be too large to hold (large
    batches): it forms the scores whole when they are few and in row blocks above a size
    (``losses/chunked.py``: the same value, memory linear in N). ``dense()`` forms them here.
    """

    anchors: torch.Tensor  # [N, D]
    candidates: torch.Tensor  # [M, D]
    temperature: float

    @property
    def shape(self) -> tuple[int, int]:
        return self.anchors.shape[0], self.candidates.shape[0]  # (N, M)

    @property
    def device(self) -> torch.device:
        return self.anchors.device

    def dense(self) -> torch.Tensor:
        return cosine(self.anchors, self.candidates, self.temperature)  # [N, M]


def paired_cosine(a: torch.Tensor, b: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Row-wise cosine of matching rows: ``[N, D], [N, D] -> [N]``."""
    return F.cosine_similarity(at_least_float32(a), at_least_float32(b), dim=1) / temperature  # [N]


def moco_scores(q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, temperature: float) -> torch.Tensor:
    """MoCo's logits (He et al. 2020, https://arxiv.org/abs/1911.05722, Algorithm 1): ``[B, 1+K]``.

    Column 0: each query against the key of its own image, ``cos(q_i, k_i) / tau`` (``l_pos``);
    columns 1..K: against every queued key, ``cos(q_i, queue_j) / tau`` (``l_neg``).
    q, k: [B, D] queries and keys; queue: [K, D].
    """
    l_pos = paired_cosine(q, k, temperature)[:, None]  # [B, 1]
    l_neg = cosine(q, queue, temperature)  # [B, K]
    return torch.cat([l_pos, l_neg], dim=1)  # [B, 1+K]


def bilinear(context: torch.Tensor, candidates: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """CPC's log-bilinear score ``z_j^T W c_i`` (van den Oord et al. 2018, https://arxiv.org/abs/1807.03748, eq. 3).

    context [N, Dc] (c_t), candidates [M, Dz] (z_{t+k}), weight [Dz, Dc] (W_k) -> [N, M].
    The prediction ``W c`` is formed once per anchor, so the cost is one extra [N, Dc] x [Dc, Dz].
    """
    prediction = context @ weight.T  # [N, Dz]: W_k c_t
    return prediction @ candidates.T  # [N, M]


def scaled_dot(anchors: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """AMDIM's raw score ``a.b / sqrt(D)`` (Bachman et al. 2019, https://arxiv.org/abs/1906.00910), fp32: [N, M]."""
    return at_least_float32(anchors) @ at_least_float32(candidates).T / anchors.shape[1] ** 0.5  # [N, M]


def soft_clip(scores: torch.Tensor, clip: float) -> torch.Tensor:
    """AMDIM's soft clipping ``c * tanh(s / c)``: scores stay in (-c, c), near-identity for |s| << c."""
    return clip * torch.tanh(scores / clip)


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``||a_i - b_j||^2`` for all pairs, ``[N, D] x [M, D] -> [N, M]``, in fp32 (fp64 stays fp64).

    Expanded as ``|a|^2 + |b|^2 - 2 a.b`` (one matmul, no [N, M, D] tensor). That expansion
    cancels: for equal rows it leaves rounding noise of a few ``eps * (|a|^2 + |b|^2)``, of either
    sign. Values under that noise floor are set to exactly 0 (so an anchor scores exactly 0
    against itself), which :func:`_distance_power` then handles without an infinite gradient.
    """
    a, b = at_least_float32(a), at_least_float32(b)
    sq_a, sq_b = (a * a).sum(1)[:, None], (b * b).sum(1)[None, :]  # [N, 1], [1, M]
    d2 = sq_a + sq_b - 2 * a @ b.T  # [N, M]
    floor = 16 * torch.finfo(d2.dtype).eps * (sq_a + sq_b)  # [N, M] cancellation noise
    return torch.where(d2 <= floor, torch.zeros_like(d2), d2)


def _distance_power(d2: torch.Tensor, gamma: float) -> torch.Tensor:
    """``d^gamma`` from ``d^2``, with a finite gradient at ``d = 0``.

    For gamma < 2 the derivative of ``(d^2)^(gamma/2)`` blows up at 0 (gamma = 1: 1/(2 d)), and
    a masked entry (an anchor against itself) would still send ``0 * inf = NaN`` back. Entries
    at zero distance take the exact value 0 with zero gradient instead.
    """
    if gamma == 2.0:
        return d2  # exact and smooth everywhere
    zero = d2 <= 0  # [N, M]
    safe = torch.where(zero, torch.ones_like(d2), d2)  # keeps pow's backward finite
    return torch.where(zero, torch.zeros_like(d2), safe.pow(gamma / 2))  # [N, M]


def kernel_scores(a: torch.Tensor, b: torch.Tensor, gamma: float = 2.0, tau: float = 1.0) -> torch.Tensor:
    """Log-kernel scores ``-||a_i - b_j||^gamma / tau``: ``[N, D] x [M, D] -> [N, M]``.

    gamma = 2: Gaussian kernel; gamma = 1: Laplacian; any gamma in (0, 2] is a valid
    (positive-definite) exponential kernel (Tan et al. 2023, section 6). Computed in float32
    even under bf16 autocast, and with a finite gradient at distance 0 (``a_i = b_j``).
    """
    if not 0 < gamma <= 2:
        raise ValueError(f"kernel gamma must be in (0, 2], got {gamma}")
    return -_distance_power(squared_distances(a, b), gamma) / tau  # [N, M]


def paired_kernel_scores(a: torch.Tensor, b: torch.Tensor, gamma: float = 2.0, tau: float = 1.0) -> torch.Tensor:
    """Row-wise ``-||a_i - b_i||^gamma / tau``: ``[N, D], [N, D] -> [N]`` (a MoCo positive column)."""
    a, b = at_least_float32(a), at_least_float32(b)
    d2 = ((a - b) ** 2).sum(1)  # [N]
    return -_distance_power(d2, gamma) / tau  # [N]


Kernels = Sequence[tuple[float, float]]  # ((gamma, tau), ...)


def _log_sum(scores: list[torch.Tensor], weights: Sequence[float] | None) -> torch.Tensor:
    """``log sum_k w_k exp(scores_k)``, stably."""
    if weights is None:
        weights = [1.0] * len(scores)
    if len(weights) != len(scores) or any(w <= 0 for w in weights):
        raise ValueError(f"need one positive weight per kernel, got {weights}")
    logs = [s + torch.log(torch.tensor(float(w), dtype=s.dtype)) for s, w in zip(scores, weights)]
    return torch.logsumexp(torch.stack(logs), dim=0)  # [N, M]


def simple_sum_scores(
    a: torch.Tensor, b: torch.Tensor, kernels: Kernels = ((2.0, 1.0), (1.0, 1.0)),
    weights: Sequence[float] | None = None,
) -> torch.Tensor:
    """Log of the Simple Sum kernel ``sum_k w_k exp(-||a - b||^gamma_k / tau_k)`` (Tan et al., section 6).

    The paper's Simple Sum adds a Gaussian and a ``gamma``-kernel on the whole embedding
    (weights 1); ``weights`` allows a weighted mixture. ``[N, D] x [M, D] -> [N, M]``.
    """
    d2 = squared_distances(a, b)  # [N, M], shared by every kernel
    return _log_sum([-_distance_power(d2, g) / t for g, t in kernels], weights)


def concat_sum_scores(
    a: torch.Tensor, b: torch.Tensor, kernels: Kernels = ((2.0, 1.0), (1.0, 1.0)),
    weights: Sequence[float] | None = None,
) -> torch.Tensor:
    """Log of the Concatenation Sum kernel (Tan et al., section 6): the embedding dims are cut into
    ``len(kernels)`` equal consecutive parts and kernel k sees only part k:
    ``sum_k w_k exp(-||a[part_k] - b[part_k]||^gamma_k / tau_k)``. ``[N, D] x [M, D] -> [N, M]``.
    """
    parts = len(kernels)
    if a.shape[1] % parts:
        raise ValueError(f"embedding dim {a.shape[1]} does not split into {parts} equal parts")
    pieces = zip(a.chunk(parts, dim=1), b.chunk(parts, dim=1), kernels)
    return _log_sum([kernel_scores(pa, pb, g, t) for pa, pb, (g, t) in pieces], weights)
