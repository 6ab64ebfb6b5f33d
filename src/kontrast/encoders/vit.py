"""Vision Transformer encoders ``vit_tiny`` and ``vit_small``, written here (timm is not needed).

ViT: Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words", https://arxiv.org/abs/2010.11929.
Sizes of DeiT (Touvron et al. 2020, https://arxiv.org/abs/2012.12877): tiny = dim 192, 12 blocks,
3 heads; small = dim 384, 12 blocks, 6 heads (head dim 64; MoCo v3's own ViT-S has 12 heads of 32).
MLP ratio 4 (GELU), pre-norm blocks ``x + attn(LN(x))``, ``x + mlp(LN(x))``, LayerNorm eps 1e-6,
a class token, attention by ``F.scaled_dot_product_attention``. ``forward`` returns the class token
after the final LayerNorm ``[B, dim]`` (``pool="mean"``: the mean of the patch tokens after it); ``forward_maps`` the
patch tokens as one map ``[B, dim, h, w]``.

Choices, as MoCo v3 (Chen, Xie & He 2021, https://arxiv.org/abs/2104.02057, sec. 4.2 and its ``vits.py``):
- position embedding: fixed 2-D sin-cos (not learned), a buffer; computed for any other token grid on
  the fly, so multi-crop views and patch grids of another size work. The class token's position is 0.
- init: Xavier-uniform Linear layers (q, k and v each as its own matrix), the patch projection
  Xavier-uniform over its ``3·p·p`` inputs, class token N(0, 1e-6).
- ``freeze_patch_embed=True``: the patch projection stays at its random init (``requires_grad=False``),
  MoCo v3's "random patch projection" against training instability; the optimizer never sees it.

Options (config keys ``encoder.*``):
- ``patch_size`` (None: from ``image_size``: 4 up to 64 px, 8 up to 128 px, 16 above; 32 px -> 8x8
  tokens, 224 px -> 14x14). ``image_size`` (``data.size``) must be a multiple of it.
- ``width`` scales the head dimension: ``64 · width`` rounded to a multiple of 8 (at least 8); heads and
  depth stay, ``dim = heads · head_dim`` (vit_tiny at width 0.125: dim 24). Width 1 = the DeiT sizes.
- ``depth``: the number of blocks (None: 12).
- ``drop_path``: stochastic depth (:class:`DropPath`), rising linearly from 0 at the first block to this at
  the last (DINO's ViTs: 0.1); momentum targets turn it off (:class:`kontrast.encoders.target.MomentumTarget`).
- ``pool``: the feature ``forward`` returns: ``"token"``, the class token; ``"mean"``, the mean of the patch tokens
  after the final LayerNorm (I-JEPA's evaluation: its ViT has no class token, and its loss trains only patch tokens).
No ``zero_init_residual``: with every block the identity the class token would not depend on the image
(measured: no gradient reaches the encoder through the heads' BatchNorm); ``kontrast.methods.build.resolve``
leaves SimSiam's, Barlow Twins' and VICReg's ResNet default of it out on a ViT.

Module and parameter names are torchvision's ``VisionTransformer`` (``conv_proj``, ``class_token``,
``encoder.pos_embedding``, ``encoder.layers.encoder_layer_i.{ln_1, self_attention, ln_2, mlp}``,
``encoder.ln``), so the state_dict loads into ``torchvision.models.VisionTransformer`` (heads replaced
by ``nn.Identity()``) strictly, with the sin-cos table as its (then learned) position embedding.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from kontrast.encoders.attention import attention
from kontrast.errors import UserError
from kontrast.registry import ENCODERS

VIT_SIZES = {"vit_tiny": (192, 3), "vit_small": (384, 6)}  # name -> (dim at width 1, heads); DeiT
DEPTH, MLP_RATIO, LN_EPS, HEAD_DIM = 12, 4, 1e-6, 64
POOLS = ("token", "mean")  # encoder.pool: the class token, or the mean of the patch tokens


def default_patch_size(image_size: int) -> int:
    """4 up to 64 px (32 px: 8x8 tokens), 8 up to 128 px, else 16 (224 px: 14x14 tokens)."""
    return 4 if image_size <= 64 else 8 if image_size <= 128 else 16


def sincos_2d(dim: int, gh: int, gw: int, device: torch.device | None = None) -> torch.Tensor:
    """Fixed 2-D sin-cos positions ``[gh·gw, dim]`` in row-major token order (MoCo v3's ``vits.py``).

    A quarter of the channels each: sin(x ω), cos(x ω), sin(y ω), cos(y ω), ω_k = 10000^(-k / (dim/4));
    ``dim`` must be a multiple of 4.
    """
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float32, device=device),
                            torch.arange(gw, dtype=torch.float32, device=device), indexing="ij")  # [gh, gw] each
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float32, device=device) / (dim // 4))  # [dim/4]
    x, y = xs.flatten()[:, None] * omega, ys.flatten()[:, None] * omega  # [N, dim/4] each
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)  # [N, dim]


def with_class_position(pos: torch.Tensor) -> torch.Tensor:
    """``[N, dim]`` patch positions -> ``[1, 1 + N, dim]`` with a zero row for the class token."""
    return torch.cat([pos.new_zeros(1, pos.shape[1]), pos])[None]


class Attention(nn.Module):
    """Multi-head self-attention through ``F.scaled_dot_product_attention`` (:func:`attention`).

    Parameter names are ``nn.MultiheadAttention``'s (``in_proj_weight [3D, D]``, ``in_proj_bias``,
    ``out_proj``), hence torchvision's ViT's.
    """

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)  # [B, N, 3D]
        q, k, v = qkv.view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # [B, h, N, D/h] each
        out = attention(q, k, v)  # [B, h, N, D/h] softmax(q kᵀ / sqrt(D/h)) v
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))  # [B, N, D]


class DropPath(nn.Module):
    """Stochastic depth (Huang et al. 2016, https://arxiv.org/abs/1603.09382) on a residual branch: in training,
    each sample's branch output is zeroed with probability ``p`` and the kept ones scaled by ``1 / (1 - p)``
    (DINO's and timm's ``drop_path``); the identity in eval mode or at ``p = 0``. The mask is drawn from the
    global generator, which the training step seeds from (seed, step): a resumed run draws the same masks."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape[0], *[1] * (x.dim() - 1), device=x.device) >= self.p  # [B, 1, 1] per sample
        return x * keep.to(x.dtype) / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p:g}"


class Block(nn.Module):
    """Pre-norm transformer block: ``x + drop(attn(LN(x)))``, then ``x + drop(mlp(LN(x)))`` (``drop``:
    :class:`DropPath`, the identity unless ``encoder.drop_path`` is set)."""

    def __init__(self, dim: int, heads: int, drop_path: float = 0.0):
        super().__init__()
        self.drop_path = DropPath(drop_path)
        self.ln_1 = nn.LayerNorm(dim, eps=LN_EPS)
        self.self_attention = Attention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim, eps=LN_EPS)
        # keys "0" and "3": torchvision's MLPBlock (Linear, GELU, Dropout, Linear, Dropout), without the dropouts
        self.mlp = nn.Sequential(OrderedDict([("0", nn.Linear(dim, MLP_RATIO * dim)), ("1", nn.GELU()),
                                              ("3", nn.Linear(MLP_RATIO * dim, dim))]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.self_attention(self.ln_1(x)))  # [B, N, D]
        return x + self.drop_path(self.mlp(self.ln_2(x)))  # [B, N, D]


class Blocks(nn.Module):
    """torchvision's ``Encoder`` part: the position table, the blocks and the final LayerNorm."""

    def __init__(self, dim: int, heads: int, depth: int, grid: tuple[int, int], drop_path: float = 0.0):
        super().__init__()
        self.register_buffer("pos_embedding", with_class_position(sincos_2d(dim, *grid)))  # [1, 1 + N, D] fixed
        rates = torch.linspace(0, drop_path, depth).tolist()  # rising over the blocks (DINO's, DeiT's)
        self.layers = nn.Sequential(OrderedDict((f"encoder_layer_{i}", Block(dim, heads, rates[i]))
                                                for i in range(depth)))
        self.ln = nn.LayerNorm(dim, eps=LN_EPS)


class VisionTransformer(nn.Module):
    """ViT encoder: ``forward(x [B, 3, H, W]) -> [B, dim]`` (class token after the final norm), no head.

    Args:
        dim, heads, depth: embedding size, attention heads (``dim % heads == 0``), blocks.
        image_size: the training resolution; sets the default patch size and the stored position table.
        patch_size: pixels per patch side (None: :func:`default_patch_size`).
        freeze_patch_embed: keep the random patch projection fixed (MoCo v3).
        drop_path: stochastic depth of the last block; block i drops at ``drop_path · i / (depth - 1)``.
        pool: ``"token"`` (the class token) or ``"mean"`` (the mean of the patch tokens): what ``forward`` returns.

    Attributes:
        dim: feature size; ``map_dims = (dim,)``: ``forward_maps`` gives one map, the patch tokens.
        patch_size, depth, image_size, pool: as built (``kontrast export`` records them).
    """

    def __init__(self, dim: int, heads: int, depth: int = DEPTH, *, image_size: int = 224,
                 patch_size: int | None = None, freeze_patch_embed: bool = False, drop_path: float = 0.0,
                 pool: str = "token"):
        super().__init__()
        patch_size = patch_size or default_patch_size(image_size)
        if pool not in POOLS:
            raise UserError(f"encoder.pool must be one of {', '.join(POOLS)}; got {pool!r}")
        if image_size % patch_size:
            raise UserError(f"data.size {image_size} is not a multiple of the ViT patch size {patch_size}; "
                            "set encoder.patch_size to a divisor of it")
        self.dim, self.heads, self.depth = dim, heads, depth
        self.image_size, self.patch_size, self.pool = image_size, patch_size, pool
        self.min_size = patch_size  # a smaller view has no patch
        self.map_dims: tuple[int, ...] = (dim,)
        self.conv_proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        grid = image_size // patch_size
        self.encoder = Blocks(dim, heads, depth, (grid, grid), drop_path)  # torchvision's name for this part
        self._init()
        self.conv_proj.requires_grad_(not freeze_patch_embed)

    def _init(self) -> None:
        """MoCo v3's init (module docstring)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, Attention):
                bound = math.sqrt(6.0 / (2 * self.dim))  # Xavier-uniform of each D x D matrix q, k, v
                nn.init.uniform_(m.in_proj_weight, -bound, bound)
        fan = 3 * self.patch_size**2
        bound = math.sqrt(6.0 / (fan + self.dim))  # Xavier-uniform with the conv as a [D, 3·p·p] matrix
        nn.init.uniform_(self.conv_proj.weight, -bound, bound)
        nn.init.zeros_(self.conv_proj.bias)
        nn.init.normal_(self.class_token, std=1e-6)

    def positions(self, gh: int, gw: int, like: torch.Tensor) -> torch.Tensor:
        """``[1, 1 + gh·gw, D]``: the stored table at its grid, the sin-cos one at any other."""
        stored = self.encoder.pos_embedding
        if stored.shape[1] == 1 + gh * gw and gh == gw == self.image_size // self.patch_size:
            return stored
        return with_class_position(sincos_2d(self.dim, gh, gw)).to(like)

    def forward_tokens(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                       mask_token: torch.Tensor | None = None,
                       keep: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[int, int]]:
        """Every token after the final LayerNorm ``[B, 1 + h·w, D]`` (class token first) and the grid (h, w).

        ``mask [B, h·w]`` (bool, row-major patches) with ``mask_token [D]``: the masked patches' embeddings are
        replaced by the token before the positions are added (iBOT's masked image modelling, BEiT's order).
        ``keep [B, n]`` (long, row-major patch indices): only these patches, with their positions, go through the
        blocks, and the result is ``[B, 1 + n, D]`` (MAE's encoder on the visible patches, I-JEPA's context)."""
        h, w = x.shape[-2:]
        if h % self.patch_size or w % self.patch_size:
            raise UserError(f"a {h}x{w} view does not split into {self.patch_size}-px ViT patches; set "
                            "encoder.patch_size to a divisor of every view's size")
        t = self.conv_proj(x)  # [B, D, h/p, w/p]
        gh, gw = t.shape[-2:]
        t = t.flatten(2).transpose(1, 2)  # [B, N, D] row-major patches
        if mask is not None:
            t = torch.where(mask[..., None], mask_token.to(t.dtype), t)  # [B, N, D] masked patches -> the token
        t = torch.cat([self.class_token.expand(t.shape[0], -1, -1).to(t.dtype), t], dim=1)  # [B, 1 + N, D]
        t = t + self.positions(gh, gw, t)
        if keep is not None:
            kept = t[:, 1:].gather(1, keep[..., None].expand(-1, -1, t.shape[-1]))  # [B, n, D] with their positions
            t = torch.cat([t[:, :1], kept], dim=1)  # [B, 1 + n, D]
        return self.encoder.ln(self.encoder.layers(t)), (gh, gw)  # [B, 1 + N or 1 + n, D]

    def forward_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The patch tokens as one feature map ``[B, D, h, w]`` (yadim's last map; amdim needs three)."""
        t, (gh, gw) = self.forward_tokens(x)
        return [t[:, 1:].transpose(1, 2).reshape(t.shape[0], self.dim, gh, gw)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The feature ``[B, dim]``: the class token after the final LayerNorm, or (``pool="mean"``) the mean of the
        patch tokens after it."""
        tokens = self.forward_tokens(x)[0]  # [B, 1 + N, D]
        return tokens[:, 1:].mean(dim=1) if self.pool == "mean" else tokens[:, 0]


class TokenPredictor(nn.Module):
    """A narrow ViT that fills in the tokens of wanted patches from known ones: MAE's decoder (He et al. 2022,
    https://arxiv.org/abs/2111.06377, sec. 3) and I-JEPA's predictor (Assran et al. 2023,
    https://arxiv.org/abs/2301.08243, sec. 3).

    The known tokens ``[B, n, in_dim]`` are projected to ``dim`` and given the fixed sin-cos positions of their patches
    (``known [B, n]``, row-major on ``grid``); each wanted patch (``wanted [B, m]``) enters as one learned mask token
    plus its position; all ``n + m`` go through ``depth`` pre-norm blocks, a LayerNorm and a linear map to ``out_dim``,
    and the wanted ones come out ``[B, m, out_dim]``. Attention does not depend on the order of the tokens, so none
    is restored (MAE's code un-shuffles; the result is the same).
    """

    def __init__(self, in_dim: int, dim: int, depth: int, heads: int, out_dim: int):
        super().__init__()
        if dim % heads or dim % 4:
            raise UserError(f"a predictor of width {dim} does not split into {heads} heads with sin-cos positions; "
                            "choose a width that is a multiple of 4 and of the heads")
        self.dim = dim
        self.embed = nn.Linear(in_dim, dim)
        self.mask_token = nn.Parameter(torch.zeros(dim))
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(depth)))
        self.ln = nn.LayerNorm(dim, eps=LN_EPS)
        self.out = nn.Linear(dim, out_dim)
        for m in self.modules():  # MAE's init: Xavier-uniform linear maps, the mask token N(0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, Attention):
                bound = math.sqrt(6.0 / (2 * dim))
                nn.init.uniform_(m.in_proj_weight, -bound, bound)
        nn.init.normal_(self.mask_token, std=0.02)

    def forward(self, tokens: torch.Tensor, known: torch.Tensor, wanted: torch.Tensor,
                grid: tuple[int, int]) -> torch.Tensor:
        pos = sincos_2d(self.dim, *grid, device=tokens.device).to(tokens.dtype)  # [h·w, dim] made on the device
        x = self.embed(tokens) + pos[known]  # [B, n, dim] the known patches at their places
        q = self.mask_token.to(x.dtype) + pos[wanted]  # [B, m, dim] a mask token at each wanted place
        y = self.blocks(torch.cat([x, q], dim=1))  # [B, n + m, dim]
        return self.out(self.ln(y[:, tokens.shape[1]:]))  # [B, m, out_dim]


def build_vit(name: str, *, stem: str | None = None, width: float = 1.0, depth: int | None = None,
              **kw) -> VisionTransformer:
    """``vit_tiny`` / ``vit_small`` at ``width`` (head dim ``64·width``, a multiple of 8) and ``depth``."""
    if stem not in (None, "cifar"):  # create_encoder fills in "cifar" when unset
        raise UserError(f"{name} has no {stem!r} stem; leave encoder.stem unset (encoder.patch_size sets the "
                        "patch size, else it follows data.size)")
    if not width > 0:
        raise UserError(f"encoder width must be > 0, got {width}")
    heads = VIT_SIZES[name][1]
    head_dim = max(8, 8 * round(HEAD_DIM * width / 8))
    return VisionTransformer(heads * head_dim, heads, depth or DEPTH, **kw)


@ENCODERS.register("vit_tiny")
def vit_tiny(**kw) -> VisionTransformer:
    """ViT-Ti (DeiT): dim 192·width, 12 blocks, 3 heads; ~5.5M parameters at 224 px, patch 16."""
    return build_vit("vit_tiny", **kw)


@ENCODERS.register("vit_small")
def vit_small(**kw) -> VisionTransformer:
    """ViT-S (DeiT): dim 384·width, 12 blocks, 6 heads; ~21.7M parameters at 224 px, patch 16."""
    return build_vit("vit_small", **kw)


# kontrast (torchvision) ViT name -> timm name, in order; the block index is kept
_TO_TIMM = [
    (r"^class_token$", "cls_token"),
    (r"^conv_proj\.", "patch_embed.proj."),
    (r"^encoder\.pos_embedding$", "pos_embed"),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.ln_1\.", r"blocks.\1.norm1."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.ln_2\.", r"blocks.\1.norm2."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.in_proj_(weight|bias)$", r"blocks.\1.attn.qkv.\2"),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.out_proj\.", r"blocks.\1.attn.proj."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.mlp\.0\.", r"blocks.\1.mlp.fc1."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.mlp\.3\.", r"blocks.\1.mlp.fc2."),
    (r"^encoder\.ln\.", "norm."),
]
_FROM_TIMM = [  # timm name -> kontrast (torchvision) name
    (r"^cls_token$", "class_token"),
    (r"^patch_embed\.proj\.", "conv_proj."),
    (r"^pos_embed$", "encoder.pos_embedding"),
    (r"^blocks\.(\d+)\.norm1\.", r"encoder.layers.encoder_layer_\1.ln_1."),
    (r"^blocks\.(\d+)\.norm2\.", r"encoder.layers.encoder_layer_\1.ln_2."),
    (r"^blocks\.(\d+)\.attn\.qkv\.(weight|bias)$", r"encoder.layers.encoder_layer_\1.self_attention.in_proj_\2"),
    (r"^blocks\.(\d+)\.attn\.proj\.", r"encoder.layers.encoder_layer_\1.self_attention.out_proj."),
    (r"^blocks\.(\d+)\.mlp\.fc1\.", r"encoder.layers.encoder_layer_\1.mlp.0."),
    (r"^blocks\.(\d+)\.mlp\.fc2\.", r"encoder.layers.encoder_layer_\1.mlp.3."),
    (r"^norm\.", "encoder.ln."),
]



def timm_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A kontrast ViT's state_dict (torchvision's names) in timm's ``VisionTransformer`` names: the same tensors
    (q/k/v stacked alike, LayerNorm eps 1e-6, GELU MLP of ratio 4; the fixed positions into timm's ``pos_embed``)."""
    return _renamed(state, _TO_TIMM)


def torchvision_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`timm_names`: a timm ViT state_dict in the names kontrast's ViT carries."""
    return _renamed(state, _FROM_TIMM)


def _renamed(state: dict[str, torch.Tensor], rules: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        for pattern, new in rules:
            if re.match(pattern, key):
                key = re.sub(pattern, new, key)
                break
        out[key] = value
    return out
