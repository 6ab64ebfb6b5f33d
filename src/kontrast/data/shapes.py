"""The built-in ``shapes`` dataset: procedurally drawn shapes, the project's demo data.

Each image shows one of ten shapes at a random position, scale and (small) rotation, on a
gradient-shaded background with pixel noise. Foreground and background start from one fixed
colour pair, and each image gets its own random brightness, contrast, saturation and hue
change of that pair, drawn from the same ranges as SimCLR's CIFAR colour jitter.

Why this design (measured, see docs/results.md): every nuisance is one the SimCLR augmentations
can undo, position and scale by crops, colour by jitter, so crops of two different squares
can look alike and the augmentation graph links each class into one component, which is
what contrastive learning recovers (HaoChen et al. 2021, https://arxiv.org/abs/2106.04156).
Raw pixel distances are dominated by position and colour, so kNN on pixels stays poor. Earlier
designs with colours from a palette, or random, made colour an instance cue that the jitter
cannot remove: SimCLR then learned colour first and the encoder's kNN accuracy on shapes
*fell* below the untrained encoder's in a CPU budget.

Everything is vectorised in torch (one pass per class over a chunk of images, never a Python
loop over single images). Shapes are drawn as implicit functions of rotated, scaled
coordinates on a supersampled grid and average-pooled down, which anti-aliases the edges.
The same ``seed`` always gives the same images.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

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
_MAX_ANGLE = math.radians(15)  # rotation in [-15, 15] degrees: SimCLR's views do not rotate
_BASE_FG = torch.tensor([0.95, 0.75, 0.20])  # amber shape ...
_BASE_BG = torch.tensor([0.15, 0.25, 0.55])  # ... on blue
_JITTER = (0.4, 0.4, 0.4, 0.1)  # brightness, contrast, saturation, hue: SimCLR's CIFAR colour jitter (s = 0.5)
_MAX_GRADIENT = 0.05  # background gradient amplitude (per channel, per unit of distance)
_NOISE_STD = 0.03  # the same for every image: a per-image level would be an instance shortcut

_ShapeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class _Fields:
    def __getitem__(self, index):
        """The same parameters for a subset of the images."""
        return type(self)(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


@dataclass
class _Geometry(_Fields):
    """Per-shape random geometry; every field's first dim is the shape."""

    cx: torch.Tensor  # [n] centre x in [0, 1]
    cy: torch.Tensor  # [n] centre y in [0, 1]
    radius: torch.Tensor  # [n] circumradius as a fraction of the image side
    angle: torch.Tensor  # [n] rotation in radians
    variant: torch.Tensor  # [n] in [0, 1): per-class shape variation (ring width, ...)


@dataclass
class _Colours(_Fields):
    """Per-image colours; every field's first dim is the image."""

    fg: torch.Tensor  # [n, 3] foreground RGB in [0, 1]
    bg: torch.Tensor  # [n, 3] background RGB in [0, 1]
    grad_angle: torch.Tensor  # [n] direction of the background gradient
    grad_amp: torch.Tensor  # [n, 3] gradient amplitude per channel


def make_shapes(n: int, seed: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``n`` shape images, deterministic in ``seed``.

    Returns ``(images, labels)``: uint8 ``[n, 3, size, size]`` and int64 ``[n]`` indices into
    :data:`SHAPE_CLASSES`. Classes are balanced (counts differ by at most one).
    """
    g = torch.Generator().manual_seed(seed)
    labels = torch.randperm(n, generator=g) % len(SHAPE_CLASSES)  # int64 [n], balanced
    geometry, colours = _draw_geometry(n, g), _draw_colours(n, g)
    alpha = _coverage(labels, geometry, size)  # [n, 1, size, size] in [0, 1]
    images = torch.empty(n, 3, size, size, dtype=torch.uint8)  # [n, 3, size, size]
    for start in range(0, n, _CHUNK):
        part = slice(start, start + _CHUNK)
        images[part] = _paint(alpha[part], colours[part], g)
    return images, labels


def _draw_geometry(n: int, g: torch.Generator) -> _Geometry:
    """Position, size, rotation and variation of ``n`` shapes, drawn up front so chunking cannot change them."""
    radius = (_MIN_DIAMETER + (_MAX_DIAMETER - _MIN_DIAMETER) * torch.rand(n, generator=g)) / 2  # [n]
    margin = radius * (1 - _MAX_OUTSIDE)  # [n] centre keeps this far from the border
    return _Geometry(
        cx=margin + (1 - 2 * margin) * torch.rand(n, generator=g),
        cy=margin + (1 - 2 * margin) * torch.rand(n, generator=g),
        radius=radius,
        angle=_MAX_ANGLE * (2 * torch.rand(n, generator=g) - 1),
        variant=torch.rand(n, generator=g),
    )


def _draw_colours(n: int, g: torch.Generator) -> _Colours:
    """Each image's colour pair: the base pair through one random colour jitter, plus a background gradient."""
    fg, bg = _jittered_pair(n, g)
    return _Colours(fg=fg, bg=bg, grad_angle=2 * math.pi * torch.rand(n, generator=g),
                    grad_amp=_MAX_GRADIENT * (2 * torch.rand(n, 3, generator=g) - 1))


def _jittered_pair(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The base (foreground, background) pair after brightness, contrast, saturation and hue
    factors drawn uniformly from :data:`_JITTER`'s ranges (torchvision's ColorJitter semantics,
    fixed order): two ``[n, 3]`` tensors in [0, 1]."""
    from kontrast.augment import color  # the augment room's batched colour ops, reused

    pair = torch.stack([_BASE_FG, _BASE_BG], dim=1).expand(n, 3, 2)[:, :, None, :]  # [n, 3, 1, 2] a 1x2 "image"
    u = 2 * torch.rand(n, 4, generator=g) - 1  # [n, 4] in [-1, 1)
    brightness, contrast, saturation, hue = _JITTER
    pair = color.adjust_brightness(pair, 1 + brightness * u[:, 0]).clamp(0, 1)
    pair = color.adjust_contrast(pair, 1 + contrast * u[:, 1]).clamp(0, 1)
    pair = color.adjust_saturation(pair, 1 + saturation * u[:, 2]).clamp(0, 1)
    pair = color.adjust_hue(pair, hue * u[:, 3])  # [n, 3, 1, 2]
    return pair[:, :, 0, 0], pair[:, :, 0, 1]


def _paint(alpha: torch.Tensor, p: _Colours, g: torch.Generator) -> torch.Tensor:
    """Compose coverage, colours and noise into uint8 ``[m, 3, size, size]``."""
    m, _, size, _ = alpha.shape
    x, y = _grid(size)  # [1, 1, 1, size], [1, 1, size, 1]
    bg = p.bg[:, :, None, None] + _gradient(p, x, y)  # [m, 3, size, size]
    noise = torch.randn(m, 3, size, size, generator=g)  # [m, 3, size, size]
    image = alpha * p.fg[:, :, None, None] + (1 - alpha) * bg + _NOISE_STD * noise
    return (image.clamp(0, 1) * 255).round().to(torch.uint8)


def _grid(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel-centre coordinates in [0, 1]: x as ``[1, 1, 1, size]``, y as ``[1, 1, size, 1]``."""
    c = (torch.arange(size, dtype=torch.float32) + 0.5) / size  # [size]
    return c.view(1, 1, 1, size), c.view(1, 1, size, 1)


def _gradient(p: _Colours, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Linear background shading in a random direction, ``[m, 3, size, size]``."""
    cos, sin = p.grad_angle.cos()[:, None, None, None], p.grad_angle.sin()[:, None, None, None]
    along = (x - 0.5) * cos + (y - 0.5) * sin  # [m, 1, size, size] in about [-0.7, 0.7]
    return along * p.grad_amp[:, :, None, None]


def _coverage(labels: torch.Tensor, p: _Geometry, size: int) -> torch.Tensor:
    """Fraction of each pixel covered by its image's shape, ``[n, 1, size, size]``.

    Images are grouped by class so each implicit function runs once per chunk of its own
    images (no masked scatter over the whole batch).
    """
    alpha = torch.empty(len(labels), 1, size, size)  # [n, 1, size, size]
    for k, shape_fn in enumerate(_SHAPE_FNS):
        for part in (labels == k).nonzero().squeeze(1).split(_CHUNK):
            alpha[part] = _class_coverage(shape_fn, p[part], size)
    return alpha


def _class_coverage(shape_fn: _ShapeFn, p: _Geometry, size: int) -> torch.Tensor:
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
