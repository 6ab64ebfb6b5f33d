"""Blocked (linear-memory) InfoNCE: same value and gradient as the dense form, never the whole [N, M]."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kontrast.losses.chunked as chunked
import kontrast.losses.infonce as infonce
from kontrast.losses import info_nce, info_nce_chunked, nt_xent
from kontrast.similarity import CosineScores, cosine
from support.reference import naive_info_nce


def gen(seed):
    return torch.Generator().manual_seed(seed)


def nt_xent_targets(b, offset=0):
    rows = torch.arange(2 * b)
    return offset + (rows + b) % (2 * b), offset + rows  # positives, excluded (self) columns


@pytest.mark.parametrize("chunk", [1, 3, 7, 16, 1000])
def test_matches_naive_float64_nt_xent(chunk):
    b, d, tau = 5, 6, 0.3
    z = torch.randn(2 * b, d, dtype=torch.float64, generator=gen(chunk))
    pos, excl = nt_xent_targets(b)
    got = info_nce_chunked(z, z, pos, tau, exclude=excl, chunk=chunk)
    assert got.dtype == torch.float64
    assert abs(float(got) - naive_info_nce(z, z, pos, tau, excl)) < 1e-12


@pytest.mark.parametrize("chunk", [2, 5, 64])
def test_matches_naive_float64_without_exclusion(chunk):
    n, m, d, tau = 6, 9, 4, 0.7  # MoCo-like: anchors against other candidates
    a = torch.randn(n, d, dtype=torch.float64, generator=gen(1))
    c = torch.randn(m, d, dtype=torch.float64, generator=gen(2))
    pos = torch.randint(0, m, (n,), generator=gen(3))
    assert abs(float(info_nce_chunked(a, c, pos, tau, chunk=chunk)) - naive_info_nce(a, c, pos, tau)) < 1e-12


def test_gradcheck_float64():
    b, d = 3, 4
    z = torch.randn(2 * b, d, dtype=torch.float64, generator=gen(4), requires_grad=True)
    c = torch.randn(2 * b + 3, d, dtype=torch.float64, generator=gen(5), requires_grad=True)
    pos, excl = nt_xent_targets(b, offset=2)
    assert torch.autograd.gradcheck(lambda a, c: info_nce_chunked(a, c, pos, 0.5, exclude=excl, chunk=4), (z, c))


@pytest.mark.parametrize("chunk", [8, 33, 4096])
def test_equals_dense_fp32_value_and_gradient(chunk):
    """Within 1e-5 of ``info_nce(cosine(...))`` in value and in the gradient of both inputs."""
    b, d, tau, offset = 40, 32, 0.2, 16
    z1 = torch.randn(b, d, generator=gen(6), requires_grad=True)
    z2 = torch.randn(b, d, generator=gen(7), requires_grad=True)
    others = torch.randn(3 * b, d, generator=gen(8), requires_grad=True)  # other ranks' views
    anchors = torch.cat([z1, z2])
    candidates = torch.cat([others[:offset], anchors, others[offset:]])  # this rank's views at `offset`
    pos, excl = nt_xent_targets(b, offset)
    mask = torch.zeros(2 * b, candidates.shape[0], dtype=torch.bool)
    mask[torch.arange(2 * b), excl] = True
    dense = info_nce(cosine(anchors, candidates, tau), pos, mask)
    blocked = info_nce_chunked(anchors, candidates, pos, tau, exclude=excl, chunk=chunk)
    g_dense = torch.autograd.grad(dense, [z1, z2, others])
    g_blocked = torch.autograd.grad(blocked, [z1, z2, others])
    assert abs(float(dense.detach()) - float(blocked.detach())) < 1e-5
    for gd, gb in zip(g_dense, g_blocked):
        torch.testing.assert_close(gb, gd, atol=1e-5, rtol=0)


def test_bf16_autocast_scores_in_fp32():
    z = torch.randn(16, 8, generator=gen(9))
    pos, excl = nt_xent_targets(8)
    ref = info_nce_chunked(z, z, pos, 0.1, exclude=excl, chunk=5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = info_nce_chunked(z.bfloat16(), z.bfloat16(), pos, 0.1, exclude=excl, chunk=5)
    assert got.dtype == torch.float32
    assert abs(float(got) - float(info_nce_chunked(z.bfloat16(), z.bfloat16(), pos, 0.1, exclude=excl))) < 1e-6
    assert abs(float(got) - float(ref)) < 0.05  # only the bf16 rounding of the inputs differs


class LargestOutput(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operator returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def largest_tensor(fn, *inputs):
    with LargestOutput() as mode:
        fn(*inputs).backward()
    return mode.largest


def test_memory_is_linear_in_the_batch():
    """No tensor of the blocked loss (forward or backward) exceeds chunk x M; the dense one holds N x M."""
    d, chunk = 16, 32
    for b in (128, 256):
        n = 2 * b
        z = torch.randn(n, d, generator=gen(b), requires_grad=True)
        pos, excl = nt_xent_targets(b)
        blocked = largest_tensor(lambda z: info_nce_chunked(z, z, pos, 0.5, exclude=excl, chunk=chunk), z)
        dense = largest_tensor(lambda z: nt_xent(z[:b], z[b:], 0.5), z)
        assert blocked == chunk * n  # one block of scores: linear in the batch
        assert dense == n * n


def test_nt_xent_switches_above_the_threshold(monkeypatch):
    b, d = 24, 8
    z1 = torch.randn(b, d, generator=gen(10), requires_grad=True)
    z2 = torch.randn(b, d, generator=gen(11), requires_grad=True)
    dense = nt_xent(z1, z2, 0.5)
    assert largest_tensor(lambda: nt_xent(z1, z2, 0.5)) == (2 * b) ** 2
    monkeypatch.setattr(infonce, "CHUNKED_ABOVE", (2 * b) ** 2 - 1)
    monkeypatch.setattr(chunked, "CHUNK_ROWS", 16)
    assert largest_tensor(lambda: nt_xent(z1, z2, 0.5)) == 16 * 2 * b
    assert abs(float(nt_xent(z1, z2, 0.5).detach()) - float(dense.detach())) < 1e-6


def test_exclusion_never_drops_the_positive_by_default():
    """Without ``exclude`` every column counts: equal to F.cross_entropy on the full cosine matrix."""
    a, c = torch.randn(5, 3, generator=gen(12)), torch.randn(7, 3, generator=gen(13))
    pos = torch.tensor([0, 6, 2, 3, 1])
    ref = F.cross_entropy(cosine(a, c, 0.4), pos)
    assert abs(float(info_nce_chunked(a, c, pos, 0.4, chunk=2)) - float(ref)) < 1e-6


@pytest.mark.parametrize("b", [511, 512, 513])
def test_nt_xent_at_its_switch_point_equals_the_dense_form(b):
    """At the real threshold (2B x 2B > 2^20 scores: B > 512) and one either side: the value and the gradient
    equal the dense scores' NT-Xent, and the form switches exactly there (SimCLR's large batches take it)."""
    d = 8
    z1 = torch.randn(b, d, generator=gen(20), requires_grad=True)
    z2 = torch.randn(b, d, generator=gen(21), requires_grad=True)
    z = torch.cat([z1, z2])
    positives, itself = nt_xent_targets(b)
    mask = torch.zeros(2 * b, 2 * b, dtype=torch.bool)
    mask[torch.arange(2 * b), itself] = True
    dense = info_nce(cosine(z, z, 0.5), positives, mask)  # [2B, 2B] scores, the paper's form
    want = torch.autograd.grad(dense, (z1, z2))
    got_loss = nt_xent(z1, z2, 0.5)
    got = torch.autograd.grad(got_loss, (z1, z2))
    assert abs(float(got_loss) - float(dense)) < 1e-5
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-8)
    blocked = largest_tensor(lambda: nt_xent(z1, z2, 0.5)) < (2 * b) ** 2
    assert blocked == (b > 512) == infonce.use_blocks(2 * b, 2 * b)


@pytest.mark.parametrize("m", [511, 512, 513])
def test_info_nce_of_cosine_scores_switches_at_its_threshold_and_equals_the_dense_form(m):
    """MoCo v3's and NNCLR's form (every column counts, the positive at ``offset + i``): ``info_nce`` over
    :class:`CosineScores` [2048, M] equals it over the formed matrix in value and gradient at 2^20 entries and
    one column either side, and forms the scores in row blocks exactly above it."""
    n, d = 2048, 8
    q = torch.randn(n, d, generator=gen(30), requires_grad=True)
    k = torch.randn(m, d, generator=gen(31), requires_grad=True)
    positives = torch.arange(n) % m
    dense = info_nce(cosine(q, k, 0.2), positives)  # [N, M] formed whole
    want = torch.autograd.grad(dense, (q, k))
    got_loss = info_nce(CosineScores(q, k, 0.2), positives)
    got = torch.autograd.grad(got_loss, (q, k))
    assert abs(float(got_loss) - float(dense)) < 1e-5
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-8)
    blocked = largest_tensor(lambda: info_nce(CosineScores(q, k, 0.2), positives)) < n * m
    assert blocked == (m > 512) == infonce.use_blocks(n, m)
