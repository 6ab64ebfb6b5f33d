"""MMCR's manifold-capacity loss against the paper's formula (float64, value and gradient)."""

import torch
import torch.nn.functional as F

from kontrast.losses.capacity import manifold_capacity
from support.reference import naive_mmcr


def test_manifold_capacity_equals_the_papers_formula_in_value_and_gradient():
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(6, 4, 5, generator=g, dtype=torch.float64)  # 6 images, 4 views, D = 5
    for local_weight in (0.0, 5e-3):
        ours, ref = raw.clone().requires_grad_(), raw.clone().requires_grad_()
        loss = manifold_capacity(F.normalize(ours, dim=-1), local_weight)
        expected = naive_mmcr(F.normalize(ref, dim=-1), local_weight)
        assert torch.allclose(loss, expected, rtol=1e-9), local_weight
        loss.backward()
        expected.backward()
        assert torch.allclose(ours.grad, ref.grad, rtol=1e-6, atol=1e-10), local_weight


def test_agreeing_views_of_orthogonal_images_reach_the_bound():
    """Views that agree and images along orthogonal axes: every centroid has norm 1 and ||C||_* = N, the largest
    the nuclear norm of N unit rows can be (N <= D)."""
    z = torch.eye(4, 6, dtype=torch.float64)[:, None].expand(4, 3, 6)  # [4, 3, 6]
    assert abs(manifold_capacity(z).item() + 4.0) < 1e-12
    collapsed = torch.eye(4, 6, dtype=torch.float64)[:1, None].expand(4, 3, 6)  # every image the same point
    assert abs(manifold_capacity(collapsed).item() + 2.0) < 1e-12  # one direction: ||C||_* = sqrt(N)
