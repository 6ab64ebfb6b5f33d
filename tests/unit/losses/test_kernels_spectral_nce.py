"""Kernels (Kernel-InfoNCE), the spectral contrastive loss, the memory bank and NCE (InstDisc): each against a naive
float64 reference written from its paper's formula, and the stateful parts on hand-checked cases."""

import math

import pytest
import torch
import torch.nn.functional as F

from kontrast.losses import (
    MemoryBank,
    estimate_log_z,
    info_nce,
    moco_loss,
    nce_loss,
    nt_xent,
    spectral_contrastive_loss,
)
from kontrast.similarity import (
    concat_sum_scores,
    kernel_scores,
    paired_kernel_scores,
    simple_sum_scores,
)
from support.reference import naive_nce, naive_spectral


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _dist(x, y):
    return math.sqrt(sum((float(u) - float(v)) ** 2 for u, v in zip(x, y)))


# ---------------------------------------------------------------- kernels (Tan et al. 2023)


@pytest.mark.parametrize("gamma", [2.0, 1.0, 0.5, 1.5])
@pytest.mark.parametrize("tau", [0.1, 1.0])
def test_kernel_scores_match_formula(gamma, tau):
    a, b = _randn(4, 5, seed=1), _randn(6, 5, seed=2)
    got = kernel_scores(a, b, gamma, tau)
    want = torch.tensor([[-_dist(x, y) ** gamma / tau for y in b] for x in a], dtype=torch.float64)
    assert got.dtype == torch.float64
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-9)
    paired = paired_kernel_scores(a, b[:4], gamma, tau)
    assert torch.allclose(paired, torch.tensor([-_dist(a[i], b[i]) ** gamma / tau for i in range(4)],
                                               dtype=torch.float64), rtol=1e-6, atol=1e-9)


def test_kernel_scores_fp32_under_bf16_inputs():
    a = _randn(3, 4).to(torch.bfloat16)
    assert kernel_scores(a, a, 1.0, 0.5).dtype == torch.float32


@pytest.mark.parametrize("gamma", [2.0, 1.0, 0.5])
def test_kernel_gradient_finite_at_zero_distance(gamma):
    """a_i = b_j (an anchor against itself) must not send NaN back, masked or not."""
    z = _randn(5, 3, seed=3).float().requires_grad_(True)
    scores = kernel_scores(z, z, gamma, 0.5)  # diagonal at distance 0
    assert torch.all(scores.diagonal() == 0)
    mask = torch.eye(5, dtype=torch.bool)
    loss = info_nce(scores, torch.tensor([1, 0, 3, 2, 1]), mask) + scores.sum()
    loss.backward()
    assert torch.isfinite(z.grad).all()
    w = z.detach().clone().requires_grad_(True)
    paired_kernel_scores(w, w.detach().clone(), gamma).sum().backward()
    assert torch.isfinite(w.grad).all()


def test_kernel_rejects_gamma_outside_0_2():
    with pytest.raises(ValueError, match="gamma"):
        kernel_scores(_randn(2, 2), _randn(2, 2), gamma=3.0)


def test_simple_sum_matches_formula():
    a, b = _randn(3, 6, seed=4), _randn(5, 6, seed=5)
    kernels, weights = ((2.0, 0.5), (1.0, 0.3)), (1.0, 0.25)
    got = simple_sum_scores(a, b, kernels)
    want = torch.tensor([[math.log(sum(math.exp(-_dist(x, y) ** g / t) for g, t in kernels)) for y in b] for x in a],
                        dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-6)
    got_w = simple_sum_scores(a, b, kernels, weights)
    want_w = torch.tensor(
        [[math.log(sum(w * math.exp(-_dist(x, y) ** g / t) for (g, t), w in zip(kernels, weights))) for y in b]
         for x in a], dtype=torch.float64)
    assert torch.allclose(got_w, want_w, rtol=1e-6)


def test_concat_sum_matches_formula():
    a, b = _randn(3, 6, seed=6), _randn(4, 6, seed=7)
    kernels = ((2.0, 0.5), (1.0, 0.3))
    got = concat_sum_scores(a, b, kernels)
    want = torch.tensor(
        [[math.log(math.exp(-_dist(x[:3], y[:3]) ** 2 / 0.5) + math.exp(-_dist(x[3:], y[3:]) / 0.3)) for y in b]
         for x in a], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-6)
    with pytest.raises(ValueError, match="split"):
        concat_sum_scores(_randn(2, 5), _randn(2, 5), kernels)


def test_one_kernel_mixture_is_the_kernel():
    a, b = _randn(3, 4, seed=8), _randn(3, 4, seed=9)
    assert torch.allclose(simple_sum_scores(a, b, ((1.0, 0.7),)), kernel_scores(a, b, 1.0, 0.7))


@pytest.mark.parametrize("tau", [0.07, 0.2, 0.5])
def test_gaussian_kernel_infonce_equals_cosine_infonce_on_the_sphere(tau):
    """||a-b||^2 = 2 - 2 a.b on the unit sphere: Gaussian scores with temperature 2 tau are the
    cosine scores / tau minus the per-row constant 1/tau, which softmax ignores."""
    z1, z2 = F.normalize(_randn(6, 8, seed=10), dim=1), F.normalize(_randn(6, 8, seed=11), dim=1)
    b = 6
    z = torch.cat([z1, z2])  # [2B, D]
    scores = kernel_scores(z, z, gamma=2.0, tau=2 * tau)  # [2B, 2B]
    assert torch.allclose(scores, z @ z.T / tau - 1 / tau, rtol=0, atol=1e-12)  # the identity, in float64
    rows = torch.arange(2 * b)
    positives, self_mask = (rows + b) % (2 * b), torch.eye(2 * b, dtype=torch.bool)
    gauss = info_nce(scores, positives, self_mask)
    cos = info_nce(z @ z.T / tau, positives, self_mask)  # cosine InfoNCE from float64 scores
    assert gauss.item() == pytest.approx(cos.item(), rel=1e-6)  # info_nce runs in fp32
    assert gauss.item() == pytest.approx(nt_xent(z1, z2, tau).item(), rel=1e-5)  # nt_xent runs in fp32
    # and with MoCo's candidates (key + queue): the same identity
    queue = F.normalize(_randn(10, 8, seed=12), dim=1)
    pos = paired_kernel_scores(z1, z2, 2.0, 2 * tau)[:, None]  # [B, 1] the key
    kscores = torch.cat([pos, kernel_scores(z1, queue, 2.0, 2 * tau)], 1)  # [B, 1 + K]
    cscores = torch.cat([(z1 * z2).sum(1, keepdim=True), z1 @ queue.T], 1) / tau
    kmoco = info_nce(kscores, torch.zeros(b, dtype=torch.long))
    assert kmoco.item() == pytest.approx(info_nce(cscores, torch.zeros(b, dtype=torch.long)).item(), rel=1e-6)
    assert kmoco.item() == pytest.approx(moco_loss(z1, z2, queue, tau).item(), rel=1e-5)


# ---------------------------------------------------------------- spectral contrastive loss


@pytest.mark.parametrize("mu", [1.0, 10.0])
@pytest.mark.parametrize("scale", [0.1, 3.0])  # rows inside and outside the sqrt(mu) ball
def test_spectral_loss_matches_formula(mu, scale):
    z1, z2 = scale * _randn(5, 7, seed=13), scale * _randn(5, 7, seed=14)
    got = spectral_contrastive_loss(z1, z2, mu=mu).item()
    assert got == pytest.approx(naive_spectral(z1, z2, mu), rel=1e-6)


def test_spectral_loss_prefers_aligned_pairs_and_needs_two():
    z = _randn(8, 16, seed=15) * 0.2
    assert spectral_contrastive_loss(z, z) < spectral_contrastive_loss(z, _randn(8, 16, seed=16) * 0.2)
    with pytest.raises(ValueError):
        spectral_contrastive_loss(z[:1], z[:1])


# ---------------------------------------------------------------- memory bank and NCE (Wu et al. 2018)

def test_memory_bank_starts_as_unit_vectors_and_samples_in_range():
    bank = MemoryBank(10, 4, generator=torch.Generator().manual_seed(0))
    assert bank.items.shape == (10, 4)
    assert torch.allclose(bank.items.norm(dim=1), torch.ones(10))
    idx = bank.sample(1000, generator=torch.Generator().manual_seed(1))
    assert idx.shape == (1000,) and idx.min() >= 0 and idx.max() <= 9 and len(idx.unique()) == 10


def test_memory_bank_update_by_hand():
    bank = MemoryBank(4, 2, momentum=0.5)
    bank.items.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.6, 0.8]]))
    bank.update(torch.tensor([2, 0]), torch.tensor([[0.0, 1.0], [0.0, 1.0]]))
    r = 1 / math.sqrt(2)
    # row 2: normalize(0.5 (1, 0) + 0.5 (0, 1)) = (r, r); row 0: normalize((0, 1)) = (0, 1); rows 1, 3 untouched
    want = torch.tensor([[0.0, 1.0], [1.0, 0.0], [r, r], [0.6, 0.8]])
    assert torch.allclose(bank.items, want, atol=1e-7)
    bank = MemoryBank(3, 2, momentum=0.0)  # momentum 0: the bank holds the latest features
    bank.update(torch.tensor([1]), torch.tensor([[0.6, -0.8]]))
    assert torch.allclose(bank.items[1], torch.tensor([0.6, -0.8]))
    with pytest.raises(ValueError):
        MemoryBank(3, 2, momentum=1.0)


@pytest.mark.parametrize("n", [50, 50000])
def test_nce_loss_matches_formula(n):
    pos, noise = _randn(4, seed=20) * 3, _randn(4, 6, seed=21) * 3
    log_z = estimate_log_z(noise, n)
    z = n * sum(math.exp(float(s)) for row in noise for s in row) / noise.numel()  # Monte Carlo Z (eq. 5)
    assert log_z.item() == pytest.approx(math.log(z), rel=1e-6)
    assert nce_loss(pos, noise, log_z, n).item() == pytest.approx(naive_nce(pos, noise, z, n), rel=1e-5)
