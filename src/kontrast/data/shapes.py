"""The built-in ``shapes`` dataset: procedurally drawn shapes, the project's demo data.

Each image shows one of ten shapes at a random position, scale and rotation, in a random
foreground colour on a random, gradient-shaded background, with optional stripes on the shape
and pixel noise. Colour and position dominate raw pixel distances, so a kNN classifier on
pixels does poorly, while the shape class stays obvious to a person and to an encoder trained
to be invariant to crops and colour jitter: a self-supervised method has to *learn* something
to beat the pixel baseline.

Everything is vectorised in torch (one pass per class over a chunk of images, never a Python
loop over single images). Shapes are drawn as implicit functions of rotated, scaled
coordinates on a supersampled grid and average-pooled down, which anti-aliases the edges.
The same ``seed`` always gives the same images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Callable

import torch
import torch.nn.functional as F

SHAPE_CLASSES: tuple[str, ...] = (
    "circle",
    "ring",
    "square",
    "triangle",
    "star",
    "cross",
    "crescent",
    "semicircle",
    "bowtie",
    "bar",
)

_SUPERSAMPLE = 2  # the mask is drawn at 2x resolution, then average-pooled (anti-aliasing)
_CHUNK = 1024  # images rendered at once; bounds memory (16 MB per float grid at 32 px)
_MIN_DIAMETER, _MAX_DIAMETER = 0.35, 0.80  # shape diameter as a fraction of the image side
_MAX_OUTSIDE = 0.25  # at most this fraction of the shape's radius may leave the image
_MIN_LUMA_CONTRAST = 0.35  # |luma(fg) - luma(bg)| in [0, 1]; visible even in grayscale
_MAX_GRADIENT = 0.05  # background gradient amplitude (per channel, per unit of distance)
_STRIPE_PROB = 0.0
_MAX_STRIPE_AMP = 0.15
_NOISE_STD = 0.03  # the same for every image: a per-image level would be an instance shortcut
_LUMA = torch.tensor([0.299, 0.587, 0.114])
_PALETTE = torch.tensor([  # [6, 3] RGB in [0, 1]: few colours, so hundreds of images share each pair
    [0.90, 0.10, 0.10], [0.10, 0.70, 0.20], [0.15, 0.25, 0.90], [0.95, 0.90, 0.15], [0.95, 0.95, 0.95],
    [0.05, 0.05, 0.05],
])
_SHADE = 0.08  # per-channel perturbation of a palette colour

_ShapeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class _Params:
    """Per-image random parameters; every field is a tensor whose first dim is the image."""

    cx: torch.Tensor  # [n] centre x in [0, 1]
    cy: torch.Tensor  # [n] centre y in [0, 1]
    radius: torch.Tensor  # [n] circumradius as a fraction of the image side
    angle: torch.Tensor  # [n] rotation in radians
    variant: torch.Tensor  # [n] in [0, 1): per-class shape variation (ring width, ...)
    fg: torch.Tensor  # [n, 3] foreground RGB in [0, 1]
    bg: torch.Tensor  # [n, 3] background RGB in [0, 1]
    grad_angle: torch.Tensor  # [n] direction of the background gradient
    grad_amp: torch.Tensor  # [n, 3] gradient amplitude per channel
    stripe_angle: torch.Tensor  # [n]
    stripe_freq: torch.Tensor  # [n] cycles per image side
    stripe_phase: torch.Tensor  # [n]
    stripe_amp: torch.Tensor  # [n, 3] (zero for images without stripes)
    noise_std: torch.Tensor  # [n]

    def __getitem__(self, index: slice | torch.Tensor) -> "_Params":
        return _Params(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


def make_shapes(n: int, seed: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``n`` shape images, deterministic in ``seed``.

    Returns ``(images, labels)``: uint8 ``[n, 3, size, size]`` and int64 ``[n]`` indices into
    :data:`SHAPE_CLASSES`. Classes are balanced (counts differ by at most one).
    """
    g = torch.Generator().manual_seed(seed)
    labels = torch.randperm(n, generator=g) % len(SHAPE_CLASSES)  # int64 [n], balanced
    params = _draw_params(n, g)
    alpha = _coverage(labels, params, size)  # [n, 1, size, size] in [0, 1]
    images = torch.empty(n, 3, size, size, dtype=torch.uint8)  # [n, 3, size, size]
    for start in range(0, n, _CHUNK):
        part = slice(start, start + _CHUNK)
        images[part] = _paint(alpha[part], params[part], g)
    return images, labels


def _draw_params(n: int, g: torch.Generator) -> _Params:
    """All per-image random choices, drawn up front so chunking cannot change them."""

    def uniform(lo: float, hi: float, *shape: int) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(n, *shape, generator=g)

    radius = uniform(_MIN_DIAMETER / 2, _MAX_DIAMETER / 2)  # [n]
    margin = radius * (1 - _MAX_OUTSIDE)  # [n] centre keeps this far from the border
    fg, bg = _contrasting_colours(n, g)
    striped = torch.rand(n, generator=g) < _STRIPE_PROB  # bool [n]
    return _Params(
        cx=margin + (1 - 2 * margin) * torch.rand(n, generator=g),
        cy=margin + (1 - 2 * margin) * torch.rand(n, generator=g),
        radius=radius,
        angle=uniform(0, 2 * math.pi),
        variant=torch.rand(n, generator=g),
        fg=fg,
        bg=bg,
        grad_angle=uniform(0, 2 * math.pi),
        grad_amp=uniform(-_MAX_GRADIENT, _MAX_GRADIENT, 3),
        stripe_angle=uniform(0, math.pi),
        stripe_freq=uniform(2.0, 5.0),
        stripe_phase=uniform(0, 2 * math.pi),
        stripe_amp=uniform(-_MAX_STRIPE_AMP, _MAX_STRIPE_AMP, 3) * striped[:, None],
        noise_std=torch.full((n,), _NOISE_STD),
    )


def _contrasting_colours(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Foreground/background pairs from a small palette, each shade slightly perturbed.

    A palette (not uniform RGB) keeps colour a poor *instance* identifier: hundreds of images
    share each colour pair, so instance discrimination cannot be solved by colour alone and a
    contrastive encoder must learn shape, while raw-pixel neighbours still match by colour.
    Pairs are redrawn (whole batch per round) until their luma differs enough.
    """
    fg, bg = _shaded_palette(n, g), _shaded_palette(n, g)  # [n, 3] each
    while True:
        weak = ((fg - bg) @ _LUMA).abs() < _MIN_LUMA_CONTRAST  # bool [n]
        count = int(weak.sum())
        if count == 0:
            return fg, bg
        fg[weak], bg[weak] = _shaded_palette(count, g), _shaded_palette(count, g)


def _shaded_palette(n: int, g: torch.Generator) -> torch.Tensor:
    """``n`` palette colours, each channel perturbed by up to ``_SHADE``: ``[n, 3]``."""
    base = _PALETTE[torch.randint(len(_PALETTE), (n,), generator=g)]  # [n, 3]
    return (base + _SHADE * (2 * torch.rand(n, 3, generator=g) - 1)).clamp(0, 1)


def _paint(alpha: torch.Tensor, p: _Params, g: torch.Generator) -> torch.Tensor:
    """Compose coverage, textured colours and noise into uint8 ``[m, 3, size, size]``."""
    m, _, size, _ = alpha.shape
    x, y = _grid(size)  # [1, 1, 1, size], [1, 1, size, 1]
    fg = p.fg[:, :, None, None] + _stripes(p, x, y)  # [m, 3, size, size]
    bg = p.bg[:, :, None, None] + _gradient(p, x, y)  # [m, 3, size, size]
    noise = torch.randn(m, 3, size, size, generator=g)  # [m, 3, size, size]
    image = alpha * fg + (1 - alpha) * bg + noise * p.noise_std[:, None, None, None]
    return (image.clamp(0, 1) * 255).round().to(torch.uint8)


def _grid(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel-centre coordinates in [0, 1]: x as ``[1, 1, 1, size]``, y as ``[1, 1, size, 1]``."""
    c = (torch.arange(size, dtype=torch.float32) + 0.5) / size  # [size]
    return c.view(1, 1, 1, size), c.view(1, 1, size, 1)


def _gradient(p: _Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Linear background shading in a random direction, ``[m, 3, size, size]``."""
    cos, sin = p.grad_angle.cos()[:, None, None, None], p.grad_angle.sin()[:, None, None, None]
    along = (x - 0.5) * cos + (y - 0.5) * sin  # [m, 1, size, size] in about [-0.7, 0.7]
    return along * p.grad_amp[:, :, None, None]


def _stripes(p: _Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sinusoidal stripes for the foreground (zero amplitude when unstriped)."""
    cos, sin = p.stripe_angle.cos()[:, None, None, None], p.stripe_angle.sin()[:, None, None, None]
    along = x * cos + y * sin  # [m, 1, size, size]
    freq, phase = p.stripe_freq[:, None, None, None], p.stripe_phase[:, None, None, None]
    wave = torch.sin(2 * math.pi * freq * along + phase)  # [m, 1, size, size]
    return wave * p.stripe_amp[:, :, None, None]


def _coverage(labels: torch.Tensor, p: _Params, size: int) -> torch.Tensor:
    """Fraction of each pixel covered by its image's shape, ``[n, 1, size, size]``.

    Images are grouped by class so each implicit function runs once per chunk of its own
    images (no masked scatter over the whole batch).
    """
    alpha = torch.empty(len(labels), 1, size, size)  # [n, 1, size, size]
    for k, shape_fn in enumerate(_SHAPE_FNS):
        for part in (labels == k).nonzero().squeeze(1).split(_CHUNK):
            alpha[part] = _class_coverage(shape_fn, p[part], size)
    return alpha


def _class_coverage(shape_fn: _ShapeFn, p: _Params, size: int) -> torch.Tensor:
    """Coverage ``[m, 1, size, size]`` of one shape drawn with the parameters ``p``.

    The implicit function is evaluated in the shape's own frame (u, v): centred, rotated and
    scaled so its circumradius is about 1, on a grid ``_SUPERSAMPLE`` times finer, then
    average-pooled to ``size``.
    """
    hi = size * _SUPERSAMPLE
    c = (torch.arange(hi, dtype=torch.float32) + 0.5) / hi  # [hi]
    dx = c.view(1, 1, hi) - p.cx[:, None, None]  # [m, 1, hi]
    dy = c.view(1, hi, 1) - p.cy[:, None, None]  # [m, hi, 1]
    cos = (p.angle.cos() / p.radius)[:, None, None]  # [m, 1, 1]
    sin = (p.angle.sin() / p.radius)[:, None, None]  # [m, 1, 1]
    u = dx * cos + dy * sin  # [m, hi, hi]; only the sum is full size
    v = dy * cos - dx * sin  # [m, hi, hi]
    inside = shape_fn(u, v, p.variant[:, None, None])  # bool [m, hi, hi]
    return F.avg_pool2d(inside[:, None].float(), _SUPERSAMPLE)  # [m, 1, size, size]


# Implicit shapes: (u, v, t) -> bool mask, with u, v in the shape's frame (circumradius about 1)
# and t in [0, 1) a per-image variation. No two are the same up to rotation and scale.


def _circle(u: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return u * u + v * v <= 0.85**2


def _ring(u: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    rho2 = u * u + v * v
    inner = 0.5 + 0.15 * t  # hole radius varies per image
    return (rho2 <= 1.0) & (rho2 >= inner * inner)


def _square(u: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return torch.maximum(u.abs(), v.abs()) <= 0.72


def _triangle(u: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Equilateral, circumradius 1: inside three half-planes at distance 0.5."""
    inside = torch.ones_like(u, dtype=torch.bool)
    for k in range(3):
        a = math.pi / 2 + 2 * math.pi * k / 3
        inside &= u * math.cos(a) + v * math.sin(a) <= 0.5
    return inside


def _star(u: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Five-pointed star as a polar function: radius zig-zags between 0.42 and 1."""
    phase = torch.atan2(v, u) * (5 / (2 * math.pi)) % 1.0  # position between two points
    tip = (2 * phase - 1).abs()  # 1 at a point, 0 between points
    return u * u + v * v <= (0.42 + 0.58 * tip) ** 2


def _cross(u: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    half_width = 0.24 + 0.08 * t
    au, av = u.abs(), v.abs()
    return ((au <= half_width) & (av <= 0.95)) | ((av <= half_width) & (au <= 0.95))


def _crescent(u: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """A disc minus an offset disc, shifted so the crescent is roughly centred."""
    uc = u - 0.3
    bite = 0.45 + 0.15 * t  # offset of the cut-out disc
    return (uc * uc + v * v <= 1.0) & ((uc - bite) ** 2 + v * v >= 0.8**2)


def _semicircle(u: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    w = v + 0.42  # centroid of a half disc sits 4/(3 pi) above its flat side
    return (w >= 0) & (u * u + w * w <= 1.0)


def _bowtie(u: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Two triangles meeting at their tips (an hourglass)."""
    return (v.abs() <= 0.05 + 0.8 * u.abs()) & (u.abs() <= 0.9)


def _bar(u: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    half_width = 0.17 + 0.08 * t
    return (u.abs() <= 0.95) & (v.abs() <= half_width)


_SHAPE_FNS: tuple[_ShapeFn, ...] = (
    _circle,
    _ring,
    _square,
    _triangle,
    _star,
    _cross,
    _crescent,
    _semicircle,
    _bowtie,
    _bar,
)
assert len(_SHAPE_FNS) == len(SHAPE_CLASSES)
