"""Extract room: from encoder features to what is compared (heads, predictors).

One builder, :func:`mlp`, makes every projection head and predictor:
SimCLR's 2-layer head, MoCo v2's MLP, BYOL's projector and predictor differ
only in their dims and where batch-norm sits; :func:`predictor` is the one
predictor shape that BYOL, MoCo v3, NNCLR and SimSiam share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from kontrast.precision import at_least_float32, float32
from kontrast.similarity import cosine


def mlp(dims: Sequence[int], *, norm: bool = True, last_norm: bool = False, bias_last: bool = True,
        act: Callable[[], nn.Module] | None = None) -> nn.Sequential:
    """``Linear -> [BN] -> ReLU`` for each hidden layer, then a final ``Linear [-> BN]``.

    ``dims = (in, hidden..., out)``. ``norm`` puts BatchNorm1d after each hidden
    Linear (SimCLR v2, BYOL); ``last_norm`` adds an affine-free BN after the
    output (SimSiam / MoCo v3 style). ``act`` builds the hidden activation (default ReLU; DINO: GELU).
    """
    if len(dims) < 2:
        raise ValueError("mlp needs at least (in, out) dims")
    layers: list[nn.Module] = []
    for d_in, d_out in zip(dims[:-2], dims[1:-1]):
        layers.append(nn.Linear(d_in, d_out, bias=not norm))
        if norm:
            layers.append(nn.BatchNorm1d(d_out))
        layers.append(act() if act is not None else nn.ReLU(inplace=True))
    layers.append(nn.Linear(dims[-2], dims[-1], bias=bias_last and not last_norm))
    if last_norm:
        layers.append(nn.BatchNorm1d(dims[-1], affine=False))
    return nn.Sequential(*layers)


def predictor(dim: int, hidden: int) -> nn.Sequential:
    """The predictor q of BYOL, MoCo v3, NNCLR and SimSiam: ``mlp(dim, hidden, dim)``, ``[N, dim] -> [N, dim]``.

    ``Linear -> BN -> ReLU -> Linear``, mapping a projection to a prediction of the other view's in the same space
    (Grill et al. 2020, https://arxiv.org/abs/2006.07733, section 3.1; SimSiam's is a bottleneck, ``hidden`` = dim / 4).
    """
    return mlp([dim, hidden, dim])


@torch.no_grad()
def nearest_neighbours(z: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """Each row's nearest neighbour by cosine in a support set: ``z [B, D], support [K, D] -> [B, D]``.

    NNCLR's ``NN(z, Q) = argmin_{q in Q} ||z - q||`` between L2-normalised embeddings (Dwibedi et al. 2021,
    https://arxiv.org/abs/2104.14548), i.e. the largest cosine; ties go to the lowest row.
    The support rows come back as stored (no gradient: they replace the positive, they are not learned).
    """
    scores = cosine(z.detach(), support)  # [B, K] fp32 even under autocast
    return support[scores.argmax(dim=1)]  # [B, D]


class Prototypes(nn.Module):
    """SwAV's prototypes (Caron et al. 2020, https://arxiv.org/abs/2006.09882): K learnable unit vectors.

    ``forward(z [B, D]) -> [B, K]`` cosine scores of the L2-normalised embeddings with the
    prototypes. ``normalize_()`` puts the rows back on the unit sphere; SwAV calls it before
    every step, kontrast after every optimizer step (and at construction), which is the same.
    """

    def __init__(self, dim: int, count: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(count, dim))  # [K, D]
        self.normalize_()

    @torch.no_grad()
    def normalize_(self) -> None:
        self.weight.copy_(F.normalize(self.weight, dim=1))

    def forward(self, z: torch.Tensor, *, frozen: bool = False) -> torch.Tensor:
        """``frozen``: no gradient reaches the prototypes (SwAV freezes them early in training)."""
        w = self.weight.detach() if frozen else self.weight  # [K, D]
        return F.normalize(z, dim=1) @ w.T  # [B, K]


class DINOHead(nn.Module):
    """DINO's head (Caron et al. 2021, https://arxiv.org/abs/2104.14294, section 3.1 and the authors' ``DINOHead``).

    ``embed(x [N, in]) -> [N, bottleneck]``: a ``layers``-deep MLP (GELU, weights trunc-normal std 0.02, biases 0;
    ``bn``: BatchNorm1d after each hidden linear layer, which then has no bias: the authors' ``use_bn_in_head``,
    default off), L2-normalised. ``prototypes(z) -> [N, K]``: a weight-normalised linear layer
    ``z @ (g V / |V|)^T`` per row of ``V [K, bottleneck]``, its gain ``g [K, 1]`` fixed at 1 with
    ``norm_last_layer`` (the authors' default; ``z @ (V / |V|)^T``) or learned from 1 without it (their choice
    for ViT-S); ``frozen``: no gradient reaches ``V`` or ``g`` (the authors' ``freeze_last_layer``).
    ``forward = prototypes(embed(x))``.
    Unlike SwAV's :class:`Prototypes` (rows renormalised after each step), ``V`` itself is free and its
    gradient passes through the normalisation, as ``nn.utils.weight_norm`` with ``weight_g`` frozen.
    """

    def __init__(self, dim_in: int, hidden: int, bottleneck: int, count: int, layers: int = 3, bn: bool = False,
                 norm_last_layer: bool = True):
        super().__init__()
        self.mlp = mlp([dim_in, *[hidden] * (layers - 1), bottleneck], norm=bn, act=nn.GELU)
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        self.last = nn.Linear(bottleneck, count, bias=False)  # V [K, bottleneck], nn.Linear's init (the authors')
        self.gain = None if norm_last_layer else nn.Parameter(torch.ones(count, 1))  # g [K, 1]: weight_norm's weight_g

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.mlp(x), dim=1)  # [N, bottleneck]

    def prototypes(self, z: torch.Tensor, *, frozen: bool = False) -> torch.Tensor:
        """Cosines with the prototypes in float32 even under bf16 autocast (DINO divides them by tau_t = 0.04)."""
        v = self.last.weight.detach() if frozen else self.last.weight  # [K, bottleneck]
        with float32(z):
            w = F.normalize(at_least_float32(v), dim=1)  # [K, bottleneck] unit rows
            if self.gain is not None:
                w = w * (self.gain.detach() if frozen else self.gain)  # [K, bottleneck] g_k V_k / |V_k|
            return at_least_float32(z) @ w.T  # [N, K]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.prototypes(self.embed(x))  # [N, K]


# --------------------------------------------------------------------------- positions: context and local features


def positions(maps: torch.Tensor) -> torch.Tensor:
    """A feature map as a set of positions: ``[B, D, h, w] -> [B, h·w, D]`` (row-major)."""
    return maps.flatten(2).transpose(1, 2)


class GRUContext(nn.Module):
    """CPC's autoregressive g_ar: ``c_t = GRU(z_1..z_t)``, ``[B, T, D] -> [B, T, H]``.

    van den Oord et al. 2018, https://arxiv.org/abs/1807.03748, section 3.1 (a 256-unit GRU).
    A unidirectional recurrence: c_t never depends on z_{t+1}, ...
    """

    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.gru = nn.GRU(dim_in, dim_out, batch_first=True)
        self.dim = dim_out

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.gru(z)[0]  # [B, T, H]


class PooledContext(nn.Module):
    """Encoder + autoregressive context, averaged over positions: CPC's representation for evaluation.

    ``forward(x) -> mean_t c_t`` ``[B, H]``; ``forward_sequence(x) -> (z [B, T, D], c [B, T, H])``.
    """

    def __init__(self, encoder: nn.Module, context: nn.Module):
        super().__init__()
        self.encoder, self.context = encoder, context
        self.dim: int = context.dim

    def forward_sequence(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.encoder.forward_sequence(x)  # [B, T, D]
        return z, self.context(z)  # [B, T, D], [B, T, H]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_sequence(x)[1].mean(dim=1)  # [B, H]


class RowCausalConv(nn.Module):
    """k x k convolution whose output row i sees input rows i-k+1..i only (padding above, none below)."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel)
        self.pad = (kernel // 2, kernel // 2, kernel - 1, 0)  # left, right, top, bottom

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, self.pad))  # [B, c_out, h, w]


class GridContext(nn.Module):
    """CPC v2's context network over a patch grid: c_{i,j} depends on rows <= i of z only.

    Hénaff et al. 2019, https://arxiv.org/abs/1905.09272, section 3 (a PixelCNN-style masked
    network read top to bottom): residual blocks ``ReLU -> 1x1 -> ReLU -> row-causal 3x3``,
    ``[B, D, gh, gw] -> [B, D, gh, gw]``.
    """

    def __init__(self, dim: int, hidden: int, blocks: int):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.ReLU(), nn.Conv2d(dim, hidden, 1), nn.ReLU(), RowCausalConv(hidden, dim, 3))
            for _ in range(blocks)
        )
        self.dim = dim

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        c = z
        for block in self.blocks:
            c = c + block(c)  # [B, D, gh, gw]
        return c


class LocalProjection(nn.Module):
    """AMDIM's per-location head: a residual 1x1 "network in network", ``[B, C, h, w] -> [B, R, h, w]``.

    Bachman et al. 2019, https://arxiv.org/abs/1906.00910, section 3.3, as the authors' ``FakeRKHSConvNet``
    (github.com/Philip-Bachman/amdim-public, ``model.py``): ``BN(shortcut(x) + W2 ReLU(BN(W1 x)))`` at every
    location, so local and global features land in one R-dim space. As there: the output BN (affine), a
    shortcut 1x1 conv with bias initialised to the identity (off-diagonal U(-0.01, 0.01)) where ``R >= C``,
    and the residual branch's last conv initialised to zero (their ``init_weights``, "like fixup/zero init"),
    so at init the head is ``BN(shortcut(x))``: the input itself on its first C channels, up to the BN.
    The branch's inner BN is the authors' ``use_bn`` option, on here as everywhere in kontrast's encoders.
    """

    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.shortcut = nn.Conv2d(dim_in, dim_out, 1)
        self.body = nn.Sequential(nn.Conv2d(dim_in, dim_out, 1, bias=False), nn.BatchNorm2d(dim_out),
                                  nn.ReLU(inplace=True), nn.Conv2d(dim_out, dim_out, 1, bias=False))
        self.norm = nn.BatchNorm2d(dim_out)
        with torch.no_grad():
            nn.init.zeros_(self.body[-1].weight)
            if dim_out >= dim_in:
                w = self.shortcut.weight[:, :, 0, 0]  # [dim_out, dim_in]
                w.uniform_(-0.01, 0.01)
                w[:dim_in].fill_diagonal_(1.0)

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        return self.norm(self.shortcut(maps) + self.body(maps))  # [B, R, h, w]


def split_mlp(head: nn.Sequential, layers: int) -> tuple[nn.Sequential, nn.Sequential]:
    """(first ``layers`` hidden layers of an :func:`mlp`, the rest): cut after its ``layers``-th ReLU."""
    relus = [i for i, m in enumerate(head) if isinstance(m, nn.ReLU)]
    if not 0 <= layers <= len(relus):
        raise ValueError(f"the head has {len(relus)} hidden layers; cannot keep {layers}")
    cut = relus[layers - 1] + 1 if layers else 0
    return head[:cut], head[cut:]


class EncoderWithHead(nn.Module):
    """An encoder followed by the first layers of a projection head, usable as an encoder.

    SimCLR v2 (Chen et al. 2020, https://arxiv.org/abs/2006.10029, section 2) evaluates and
    fine-tunes "from the middle layer of the projection head". Wrapping the kept layers here
    makes them part of ``method.encoder``, which is what every evaluation reads.
    ``forward(x) -> [B, dim]``; ``.dim`` = the width of the last kept layer.
    """

    def __init__(self, backbone: nn.Module, head: nn.Sequential, dim: int):
        super().__init__()
        self.backbone, self.head, self.dim = backbone, head, dim

    def forward(self, x):
        return self.head(self.backbone(x))  # [B, dim]
