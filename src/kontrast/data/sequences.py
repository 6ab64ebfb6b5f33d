"""The built-in ``sequences`` dataset: class-dependent mixtures of oscillations with noise.

CPC v1 (van den Oord et al. 2018, https://arxiv.org/abs/1807.03748) learns by predicting the
future of a sequence from its past; it needs data whose future *is* predictable from its context
and whose slowly varying content carries the label. Each sequence here is

    x(t) = sum_k a_k sin(2 pi f_k (1 + d) t + phi_k)  +  b sin(2 pi g t + psi)  +  noise(t)

with the two frequencies ``f_k`` fixed by the class (10 classes: the 10 pairs of 5 periods),
a per-sequence detuning ``d`` (±3 %), random amplitudes and phases, one distractor oscillation at
a random class-independent frequency ``g``, and white noise (σ = 0.4). Random phases make raw
samples useless for kNN (near chance), while the class is read off the spectrum, which a context
network that has learned to predict the next steps must track.

Sequences are float32 ``[N, 1, LENGTH]``, labels int64 ``[N]``; the same ``seed`` always gives
the same data (train: seed 0, test: seed 1, as ``shapes``).
"""

from __future__ import annotations

import math
from itertools import combinations

import torch

LENGTH = 1024  # samples per sequence
PERIODS = (20.0, 28.0, 40.0, 56.0, 80.0)  # samples per cycle; a class is a pair of them
SEQUENCE_CLASSES: tuple[str, ...] = tuple(f"periods {int(a)}+{int(b)}" for a, b in combinations(PERIODS, 2))
NOISE_STD = 0.4
DETUNE = 0.03  # per-sequence relative frequency offset, uniform in ±3 %
DISTRACTOR_PERIODS = (12.0, 120.0)  # the class-independent oscillation's period range


def make_sequences(n: int, seed: int = 0, length: int = LENGTH) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` labelled sequences: (float32 ``[n, 1, length]``, int64 ``[n]``), balanced classes."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % len(SEQUENCE_CLASSES)  # int64 [n]
    labels = labels[torch.randperm(n, generator=g)]
    pairs = torch.tensor(list(combinations(PERIODS, 2)), dtype=torch.float64)  # [10, 2] periods
    freqs = 1.0 / pairs[labels]  # [n, 2] cycles per sample
    freqs = freqs * (1 + DETUNE * (2 * torch.rand(n, 1, generator=g, dtype=torch.float64) - 1))  # [n, 2]
    lo, hi = (math.log(1 / p) for p in reversed(DISTRACTOR_PERIODS))
    distractor = torch.exp(lo + (hi - lo) * torch.rand(n, 1, generator=g, dtype=torch.float64))  # [n, 1]
    freqs = torch.cat([freqs, distractor], dim=1)  # [n, 3]
    amps = torch.cat([0.5 + torch.rand(n, 2, generator=g, dtype=torch.float64),  # [n, 2] in [0.5, 1.5)
                      0.5 * torch.rand(n, 1, generator=g, dtype=torch.float64)], dim=1)  # [n, 3]
    phases = 2 * math.pi * torch.rand(n, 3, generator=g, dtype=torch.float64)  # [n, 3]
    t = torch.arange(length, dtype=torch.float64)  # [length]
    waves = amps[:, :, None] * torch.sin(2 * math.pi * freqs[:, :, None] * t + phases[:, :, None])  # [n, 3, L]
    noise = NOISE_STD * torch.randn(n, length, generator=g, dtype=torch.float64)  # [n, L]
    x = waves.sum(dim=1) + noise  # [n, L]
    return x.float()[:, None, :].contiguous(), labels  # [n, 1, L], [n]
