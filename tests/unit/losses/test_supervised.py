"""SupCon's L_out against the paper's formula (float64, value and gradient)."""

import torch
import torch.nn.functional as F

from kontrast.losses.supervised import supervised_contrastive
from support.reference import naive_supcon


def test_supervised_contrastive_equals_the_papers_formula_in_value_and_gradient():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(12, 5, generator=g, dtype=torch.float64)  # 2 views of 6 images: rows i and 6 + i a pair
    labels = torch.tensor([0, 1, 0, 2, 1, 0]).repeat(2)  # [12] classes 0 and 1 share images, class 2 has one
    ours, ref = z.clone().requires_grad_(), z.clone().requires_grad_()
    zn = F.normalize(ours, dim=1)
    loss = supervised_contrastive(zn @ zn.T / 0.1, labels, labels)
    expected = naive_supcon(ref, labels, 0.1)
    assert torch.allclose(loss.double(), expected, rtol=1e-6)
    loss.backward()
    expected.backward()
    assert torch.allclose(ours.grad, ref.grad, rtol=1e-5, atol=1e-7)


def test_an_anchors_own_rows_among_more_candidates_and_unique_labels_give_simclrs_loss():
    """Anchors as rows offset..offset+n of the candidates (one rank of several); with every image its own class
    the positives are the other views only: NT-Xent."""
    from kontrast.losses import nt_xent

    g = torch.Generator().manual_seed(1)
    z = F.normalize(torch.randn(8, 4, generator=g, dtype=torch.float64), dim=1)
    labels = torch.arange(4).repeat(2)
    whole = supervised_contrastive(z @ z.T / 0.5, labels, labels)
    assert torch.allclose(whole.double(), nt_xent(z[:4], z[4:], 0.5).double(), rtol=1e-6)
    halves = [supervised_contrastive(z[r * 4:(r + 1) * 4] @ z.T / 0.5, labels[r * 4:(r + 1) * 4], labels, r * 4)
              for r in range(2)]
    assert torch.allclose((halves[0] + halves[1]) / 2, whole, rtol=1e-6)
