"""SigLIP's sigmoid loss against the paper's formula (float64, value and gradient), and its ring form."""

import torch
import torch.nn.functional as F

from kontrast.losses.sigmoid import sigmoid_pair_loss
from support.reference import naive_siglip


def _inputs(n=6, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, d, generator=g, dtype=torch.float64)
    log_t, b = torch.tensor(2.0, dtype=torch.float64), torch.tensor(-3.0, dtype=torch.float64)
    return [t.requires_grad_() for t in (x, y, log_t, b)]


def test_sigmoid_loss_equals_the_papers_formula_in_value_and_gradient():
    ours, ref = _inputs(), _inputs()
    x, y, log_t, b = ours
    loss = sigmoid_pair_loss(F.normalize(x, dim=1), F.normalize(y, dim=1), log_t.exp(), b) / x.shape[0]
    expected = naive_siglip(*ref)
    assert torch.allclose(loss, expected, rtol=1e-12, atol=0)
    loss.backward()
    expected.backward()
    for a, r in zip(ours, ref):
        assert torch.allclose(a.grad, r.grad, rtol=1e-10, atol=1e-12)


def test_chunks_of_negatives_sum_to_the_whole_batch():
    """The ring form: own chunk with its diagonal, the other chunks all negatives, summed = the whole matrix."""
    x, y, log_t, b = (t.detach() for t in _inputs(n=8, seed=1))
    x, y = F.normalize(x, dim=1), F.normalize(y, dim=1)
    whole = sigmoid_pair_loss(x, y, log_t.exp(), b)
    chunks = sum(sigmoid_pair_loss(x[r * 4:(r + 1) * 4], y[s * 4:(s + 1) * 4], log_t.exp(), b, positives=r == s)
                 for r in range(2) for s in range(2))
    assert torch.allclose(whole, chunks, rtol=1e-12)
