"""Gradient caching's mechanism (kontrast.micro_batches): per-micro-batch forwards under a checkpoint give the
gradients, outputs and BatchNorm running statistics of the same micro-batches forwarded with their activations."""

import pytest
import torch
import torch.nn as nn

from kontrast.micro_batches import batch_norms, in_micro_batches


def _net(bn: bool = True, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    norm = nn.BatchNorm1d(16) if bn else nn.LayerNorm(16)
    return nn.Sequential(nn.Linear(8, 16), norm, nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 4)).double()


def _loss(z: torch.Tensor) -> torch.Tensor:
    """A loss of the whole batch: every row against every other (as in-batch negatives are)."""
    z = nn.functional.normalize(z, dim=1)
    return torch.logsumexp(z @ z.T / 0.1, dim=1).mean()


def _grads(net: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in net.parameters()]


def _views(b: int = 12) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(b, 8, generator=g, dtype=torch.float64) for _ in range(2)]


@pytest.mark.parametrize("count", [2, 3, 6])
def test_cached_gradients_and_running_statistics_equal_the_micro_batches_forwarded_with_activations(count):
    views, b = _views(), 12 // count
    cached, direct = _net(dropout=0.2), _net(dropout=0.2)
    torch.manual_seed(5)
    z = in_micro_batches(cached, views, count, batch_norms(cached))
    _loss(z).backward()
    torch.manual_seed(5)  # the same draws: the reference forwards micro-batch k's rows of both views, k = 0, 1, ..
    parts = [direct(torch.cat([v[k * b:(k + 1) * b] for v in views])) for k in range(count)]  # [2b, 4] each
    ref = torch.cat([p[j * b:(j + 1) * b] for j in range(2) for p in parts])  # view 1 of every micro, then view 2
    _loss(ref).backward()
    assert torch.allclose(z, ref, rtol=0, atol=1e-12)
    for g, h in zip(_grads(cached), _grads(direct)):
        assert torch.allclose(g, h, rtol=0, atol=1e-12)
    bn, bn_ref = cached[1], direct[1]  # updated once per micro-batch, not again by the re-forward
    assert int(bn.num_batches_tracked) == count == int(bn_ref.num_batches_tracked)
    assert torch.equal(bn.running_mean, bn_ref.running_mean) and torch.equal(bn.running_var, bn_ref.running_var)


def test_without_batch_norm_the_micro_batches_equal_the_plain_batch():
    views = _views()
    cached, plain = _net(bn=False), _net(bn=False)
    _loss(in_micro_batches(cached, views, 4)).backward()
    _loss(plain(torch.cat(views))).backward()
    for g, h in zip(_grads(cached), _grads(plain)):
        assert torch.allclose(g, h, rtol=0, atol=1e-12)


def test_tuple_outputs_keep_their_rows_in_view_order_and_no_grad_runs_without_a_checkpoint():
    views = _views()
    two = lambda x: (x * 2, x.sum(1, keepdim=True))  # noqa: E731
    with torch.no_grad():
        a, s = in_micro_batches(two, views, 3)
    assert torch.equal(a, torch.cat(views) * 2) and torch.equal(s, torch.cat(views).sum(1, keepdim=True))
    with pytest.raises(ValueError, match="keep its rows"):
        in_micro_batches(lambda x: x[:1], views, 2)
    with pytest.raises(ValueError, match="do not divide into 5 micro-batches"):
        in_micro_batches(lambda x: x, views, 5)
