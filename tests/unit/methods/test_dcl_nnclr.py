"""DCL / DCLW (Yeh et al. 2022) and NNCLR (Dwibedi et al. 2021): losses against naive float64 loops, the
nearest-neighbour lookup against brute force, NNCLR's support queue (FIFO, what a step pushes, checkpoints)."""

import math

import pytest
import torch
import torch.nn.functional as F

from kontrast.checkpoint import load_checkpoint, save_checkpoint
from kontrast.extract import nearest_neighbours
from kontrast.losses import decoupled_info_nce, two_view_info_nce, von_mises_fisher_weights
from kontrast.methods.base import Progress
from kontrast.methods.build import create_method, resolve
from support.reference import cosine64, naive_dcl


def _scores(anchors, candidates, tau):
    """cosine / tau in float64 (``kontrast.similarity.cosine`` computes in float32)."""
    return F.normalize(anchors, dim=1) @ F.normalize(candidates, dim=1).T / tau


def _pair(b=5, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2)]


def _dcl(z1, z2, tau, sigma=None, weight_gradient=False):
    b = z1.shape[0]
    weights = None
    if sigma:
        cos = F.cosine_similarity(z1, z2, dim=1)  # [B]
        w = von_mises_fisher_weights(cos if weight_gradient else cos.detach(), sigma)  # [B]
        weights = torch.cat([w, w])
    return decoupled_info_nce(_scores(torch.cat([z1, z2]), torch.cat([z1, z2]), tau), b, 0, weights)


@pytest.mark.parametrize("tau", [0.1, 0.5])
@pytest.mark.parametrize("sigma,weight_gradient", [(None, False), (0.5, False), (0.5, True)])  # DCL, DCLW both forms
def test_decoupled_loss_and_gradient_match_the_paper_formula(tau, sigma, weight_gradient):
    z1, z2 = _pair()
    got = _dcl(z1, z2, tau, sigma, weight_gradient)
    want = naive_dcl(z1, z2, tau, sigma, weight_gradient)
    assert got.item() == pytest.approx(want.item(), abs=1e-6)
    g_got = torch.autograd.grad(got, [z1, z2])
    g_want = torch.autograd.grad(want, [z1, z2])
    for a, b in zip(g_got, g_want):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_dclw_weights_average_one_and_favour_hard_positives():
    cos = torch.tensor([0.9, 0.1, -0.5, 0.5], dtype=torch.float64)
    w = von_mises_fisher_weights(cos, 0.5)
    assert w.mean().item() == pytest.approx(1.0, abs=1e-12)
    assert torch.equal(w.argsort(), cos.argsort(descending=True))  # the least similar pair weighs most
    assert torch.allclose(von_mises_fisher_weights(torch.full((3,), 0.3), 0.5), torch.ones(3))


def test_dcl_is_nt_xent_without_the_positive_term():
    """NT-Xent_i - DCL_i = log(1 + exp(s_ii') / sum_negatives exp(s_ik)): exactly the positive removed from the
    denominator (one process and, with gathered candidates, one rank of two)."""
    z1, z2 = _pair(b=6, d=8, seed=3)
    other = torch.randn(12, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)  # rank 0's views
    for candidates, offset in ((torch.cat([z1, z2]), 0), (torch.cat([other, z1, z2]), 12)):
        scores = _scores(torch.cat([z1, z2]), candidates, 0.2).detach()  # [12, M]
        rows = torch.arange(12)
        pos = scores[rows, offset + (rows + 6) % 12]
        masked = scores.clone()
        masked[rows, offset + rows] = -math.inf
        masked[rows, offset + (rows + 6) % 12] = -math.inf
        removed = torch.log1p(torch.exp(pos - torch.logsumexp(masked, 1))).mean()
        gap = two_view_info_nce(scores, 6, offset) - decoupled_info_nce(scores, 6, offset)
        assert gap.item() == pytest.approx(removed.item(), abs=1e-6)
        assert gap.item() > 0


def test_decoupled_loss_with_candidates_from_other_ranks():
    """A rank's loss over gathered candidates equals the formula over the global batch restricted to its rows."""
    z1, z2 = _pair(b=4, d=3, seed=5)
    o1, o2 = _pair(b=4, d=3, seed=6)  # rank 0's two views; this is rank 1
    candidates = torch.cat([o1, o2, z1, z2])
    got = decoupled_info_nce(_scores(torch.cat([z1, z2]), candidates, 0.3), 4, 8)
    g1, g2 = torch.cat([o1, z1]), torch.cat([o2, z2])  # the global batch of 8 images
    z = F.normalize(torch.cat([g1, g2]), dim=1)  # [16, 3] view 1 of all 8, then view 2
    losses = []
    for i in [4, 5, 6, 7, 12, 13, 14, 15]:  # rank 1's images in both views
        s = z[i] @ z.T / 0.3
        keep = [k for k in range(16) if k not in (i, (i + 8) % 16)]
        losses.append(torch.logsumexp(s[keep], 0) - s[(i + 8) % 16])
    assert got.item() == pytest.approx(torch.stack(losses).mean().item(), abs=1e-9)


# ------------------------------------------------------------------------------------------------------ NNCLR


def test_nearest_neighbours_match_brute_force():
    g = torch.Generator().manual_seed(7)
    z, support = torch.randn(9, 5, generator=g), torch.randn(40, 5, generator=g) * 3  # un-normalised: cosine decides
    got = nearest_neighbours(z, support)
    for i in range(9):
        sims = [float(cosine64(z[i].double(), support[k].double())) for k in range(40)]
        assert torch.equal(got[i], support[max(range(40), key=sims.__getitem__)])
    assert not got.requires_grad


def _nnclr(queue_size=16):
    cfg = resolve({"method": {"name": "nnclr", "queue_size": queue_size, "proj_hidden": 32, "proj_dim": 8,
                              "pred_hidden": 16},
                   "encoder": {"name": "resnet18", "width": 0.0625}, "train": {"batch_size": 4}})
    return create_method(cfg, num_samples=64)


def _step(method, step, b=4):
    g = torch.Generator().manual_seed(100 + step)
    views = [torch.randn(b, 3, 16, 16, generator=g) for _ in range(2)]
    out = method.training_step(views, progress=Progress(step=step, epoch=0, total_steps=10, steps_per_epoch=10))
    out["loss"].backward()
    method.after_step(out, Progress(step=step + 1, epoch=0, total_steps=10, steps_per_epoch=10))
    return out


def test_nnclr_loss_is_infonce_of_nearest_neighbours_against_predictions():
    torch.manual_seed(0)
    method = _nnclr()
    seen = {"projector": [], "predictor": []}
    for name in seen:
        getattr(method, name).register_forward_hook(lambda m, i, o, name=name: seen[name].append(o.detach()))
    queue = method.queue.items.clone()
    out = _step(method, 0)
    z, p = torch.cat(seen["projector"]).double(), torch.cat(seen["predictor"]).double()  # [8, 8] each, by view
    zn, qn, pn = F.normalize(z, dim=1), F.normalize(queue.double(), dim=1), F.normalize(p, dim=1)
    total = 0.0
    for i in range(8):
        nn_i = queue[int((zn[i] @ qn.T).argmax())].double()  # the support row closest to z_i
        other = pn[4:] if i < 4 else pn[:4]  # predictions of the other view
        s = F.normalize(nn_i, dim=0) @ other.T / 0.2
        total += float(torch.logsumexp(s, 0) - s[i % 4])
    assert out["loss"].item() == pytest.approx(total / 8, abs=1e-5)


def test_nnclr_support_queue_is_fifo_of_view_one_embeddings():
    torch.manual_seed(0)
    method = _nnclr(queue_size=10)
    pushed = []
    for step in range(4):  # 16 rows through a queue of 10: wraps after step 2
        out = _step(method, step)
        pushed.append(out["support"])
        assert torch.equal(method.queue.items[(step * 4 + torch.arange(4)) % 10], out["support"])
    assert out["support"].shape == (4, 8) and torch.allclose(out["support"].norm(dim=1), torch.ones(4))
    newest = torch.cat(pushed)[-10:]  # the last 10 pushed, oldest first
    start = int(method.queue.ptr)  # the oldest row
    assert torch.equal(method.queue.items[(start + torch.arange(10)) % 10], newest)
    assert (int(method.queue.ptr), int(method.queue.filled)) == (6, 10)


def test_nnclr_queue_survives_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    method = _nnclr()
    opt = torch.optim.SGD(method.parameters(), lr=0.1)
    _step(method, 0)
    _step(method, 1)
    save_checkpoint(tmp_path, method, opt, {"step": 2, "method": "nnclr"})
    torch.manual_seed(1)
    fresh = _nnclr()
    assert not torch.equal(fresh.queue.items, method.queue.items)
    load_checkpoint(tmp_path / "checkpoints/step-00000002", fresh, torch.optim.SGD(fresh.parameters(), lr=0.1), "nnclr")
    for name in ("items", "ptr", "filled"):
        assert torch.equal(getattr(fresh.queue, name), getattr(method.queue, name)), name
    assert int(fresh.queue.ptr) == 8


def test_dclw_follows_the_authors_weight_gradient_unless_told_to_detach():
    """The default (detach_weights false) is the authors' weight_fn: its gradient equals the reference with the
    gradient through the weights, and differs from lightly's detached form by tens of percent."""
    torch.manual_seed(0)
    grads = {}
    for detach in (False, True):
        cfg = resolve({"method": {"name": "dclw", "detach_weights": detach, "proj_dim": 8},
                       "encoder": {"width": 0.125}})
        method = create_method(cfg).double()
        z = torch.randn(16, 8, dtype=torch.float64, requires_grad=True)
        w = method.weights(z, 8)  # [16] both views' weights
        grads[detach] = torch.autograd.grad(w.sum() + (w * z[:, 0]).sum(), z)[0] if w.requires_grad else None
    assert grads[True] is None  # lightly's form: the weights are constants
    assert grads[False] is not None and grads[False].abs().sum() > 0
    z1, z2 = _pair(b=8, d=6, seed=3)
    authors = torch.autograd.grad(naive_dcl(z1, z2, 0.1, 0.5, True), z1)[0]
    lightly = torch.autograd.grad(naive_dcl(z1, z2, 0.1, 0.5, False), z1)[0]
    assert (authors - lightly).norm() / lightly.norm() > 0.05
