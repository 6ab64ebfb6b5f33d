"""SIGReg and LeJEPA's loss against the paper's formulas (float64, value and gradient)."""

import torch

from kontrast.losses.gaussian import lejepa_loss, sigreg, unit_directions
from support.reference import naive_lejepa, naive_sigreg


def test_lejepa_loss_equals_the_papers_formula_in_value_and_gradient():
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(4, 12, 6, generator=g, dtype=torch.float64)  # 4 views (2 global) of 12 images, D = 6
    directions = unit_directions(6, 5, torch.Generator().manual_seed(1)).double()  # [6, 5]
    ours, ref = raw.clone().requires_grad_(), raw.clone().requires_grad_()
    loss, invariance, regulariser = lejepa_loss(ours, 2, directions, 0.05, t_max=3.0, knots=17)
    expected = naive_lejepa(ref, 2, directions, 0.05, t_max=3.0, knots=17)
    assert torch.allclose(loss, expected, rtol=1e-10)
    assert torch.allclose(regulariser, sum(naive_sigreg(v, directions) for v in raw) / 4, rtol=1e-10)
    loss.backward()
    expected.backward()
    assert torch.allclose(ours.grad, ref.grad, rtol=1e-8, atol=1e-12)


def test_sigreg_is_small_for_gaussian_embeddings_and_large_for_collapsed_ones():
    g = torch.Generator().manual_seed(2)
    directions = unit_directions(16, 64, g)
    gaussian = torch.randn(2000, 16, generator=g)
    squeezed = gaussian * torch.tensor([1.0] * 4 + [0.05] * 12)  # 12 of 16 dimensions nearly collapsed
    point = torch.zeros(2000, 16)  # every embedding the same
    assert sigreg(gaussian, directions) < 3  # the statistic's null scale (an O(1) number whatever N)
    assert sigreg(squeezed, directions) > 20 * sigreg(gaussian, directions)
    assert sigreg(point, directions) > 100 * sigreg(gaussian, directions)  # grows with N: a test, not a distance


def test_directions_are_unit_and_follow_the_generator():
    a = unit_directions(8, 3, torch.Generator().manual_seed(5))
    assert torch.allclose(a.norm(dim=0), torch.ones(3))
    assert torch.equal(a, unit_directions(8, 3, torch.Generator().manual_seed(5)))
