"""Each loss against a naive float64 loop written from its paper's formula."""

import math

import pytest
import torch
import torch.nn.functional as F

from kontrast.losses import info_nce, moco_loss, negative_cosine, normalized_mse, nt_xent
from kontrast.similarity import cosine, dot, paired_cosine
from support.reference import cosine64, naive_moco, naive_nt_xent


@pytest.mark.parametrize("tau", [0.07, 0.5, 1.0])
def test_nt_xent_matches_paper_formula(tau):
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randn(6, 5, generator=g, dtype=torch.float64)
    got = nt_xent(z1, z2, tau).item()
    assert got == pytest.approx(naive_nt_xent(z1, z2, tau), rel=1e-5)


def test_nt_xent_with_candidates_from_other_ranks():
    """A rank's loss over gathered candidates equals the full-batch formula restricted to its rows."""
    g = torch.Generator().manual_seed(1)
    z1, z2 = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    other = torch.randn(8, 3, generator=g)  # the other rank's cat(z1, z2)
    candidates = torch.cat([other, torch.cat([z1, z2])])  # rank order: other rank first
    got = nt_xent(z1, z2, 0.5, candidates=candidates, offset=8)
    # naive: scores over all 16 candidates, self excluded, positive = the other view
    a = F.normalize(torch.cat([z1, z2]).double(), dim=1)
    c = F.normalize(candidates.double(), dim=1)
    losses = []
    for i in range(8):
        s = (a[i] @ c.T) / 0.5
        s[8 + i] = -float("inf")
        losses.append(-torch.log_softmax(s, 0)[8 + (i + 4) % 8])
    assert got.item() == pytest.approx(torch.stack(losses).mean().item(), rel=1e-5)


@pytest.mark.parametrize("tau", [0.07, 0.2])
def test_moco_loss_matches_paper_formula(tau):
    g = torch.Generator().manual_seed(2)
    q, k, queue = (torch.randn(n, 4, generator=g, dtype=torch.float64) for n in (5, 5, 7))
    assert moco_loss(q, k, F.normalize(queue, dim=1), tau).item() == pytest.approx(
        naive_moco(q, k, queue, tau), rel=1e-5
    )


def test_info_nce_mask_and_positives():
    scores = torch.tensor([[2.0, 1.0, 0.0], [0.5, 3.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[False, False, True], [False, False, False]])
    got = info_nce(scores, torch.tensor([1, 2]), mask)
    r0 = -math.log(math.exp(1.0) / (math.exp(2.0) + math.exp(1.0)))
    r1 = -math.log(math.exp(1.0) / (math.exp(0.5) + math.exp(3.0) + math.exp(1.0)))
    assert got.item() == pytest.approx((r0 + r1) / 2, rel=1e-6)


def test_byol_and_simsiam_losses_match_formulas():
    g = torch.Generator().manual_seed(3)
    p, z = torch.randn(6, 8, generator=g, dtype=torch.float64), torch.randn(6, 8, generator=g, dtype=torch.float64)
    naive_mse = sum(float(((p[i] / p[i].norm() - z[i] / z[i].norm()) ** 2).sum()) for i in range(6)) / 6
    assert normalized_mse(p, z).item() == pytest.approx(naive_mse, rel=1e-6)
    naive_cos = -sum(float(cosine64(p[i], z[i])) for i in range(6)) / 6
    assert negative_cosine(p, z).item() == pytest.approx(naive_cos, rel=1e-6)


def test_similarities():
    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    assert torch.allclose(dot(a, b), torch.tensor([[float(x @ y) for y in b] for x in a], dtype=torch.float64))
    expect = torch.tensor([[float(cosine64(x, y)) / 0.1 for y in b] for x in a], dtype=torch.float64)
    assert torch.allclose(cosine(a, b, 0.1).double(), expect, atol=1e-4)
    assert torch.allclose(paired_cosine(a, a[[1, 0, 2]]).double(),
                          torch.tensor([float(cosine64(a[i], a[j])) for i, j in [(0, 1), (1, 0), (2, 2)]],
                                       dtype=torch.float64),
                          atol=1e-6)


def test_nt_xent_gradient_flows_and_perfect_pairs_score_low():
    z = torch.randn(8, 16, requires_grad=True)
    loss = nt_xent(z, z + 0.01 * torch.randn(8, 16), 0.1)
    loss.backward()
    assert z.grad is not None and torch.isfinite(z.grad).all()
    assert nt_xent(z.detach(), z.detach(), 0.1) < nt_xent(z.detach(), torch.randn(8, 16), 0.1)
