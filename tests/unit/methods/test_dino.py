"""DINO (Caron et al. 2021): the loss against a naive float64 loop from the paper, the centre and the teacher
temperature against their formulas, the head against weight normalisation, the method's wiring (teacher on the
global crops only, centre from the teacher's outputs, last layer frozen in the first epoch), and the paper's
collapse ablation (no centring)."""

import math

import pytest
import torch

from kontrast.extract import DINOHead
from kontrast.losses import dino_loss, mean_entropy, teacher_distribution, teacher_temperature, update_centre
from kontrast.methods.base import Progress
from kontrast.methods.build import create_method, resolve
from kontrast.train.guards import CollapseMonitor
from support.reference import naive_dino


def _logits(seed, views=4, batch=5, k=7):
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(views, batch, k, generator=g, dtype=torch.float64).requires_grad_()
    teacher = torch.randn(2, batch, k, generator=g, dtype=torch.float64).requires_grad_()
    centre = 0.3 * torch.randn(k, generator=g, dtype=torch.float64)
    return student, teacher, centre


@pytest.mark.parametrize("views", [2, 4])  # 2 global crops alone; 2 global + 2 local
@pytest.mark.parametrize("tau_t", [0.04, 0.07])
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_and_gradient_match_the_paper_formula(views, tau_t, seed):
    student, teacher, centre = _logits(seed, views)
    got = dino_loss(student, teacher, centre, 0.1, tau_t)
    want = naive_dino(student, teacher, centre, 0.1, tau_t)
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(want.item(), abs=1e-6)
    (g_got,) = torch.autograd.grad(got, student)
    (g_want,) = torch.autograd.grad(want, student)
    assert torch.allclose(g_got, g_want, atol=1e-6, rtol=0)
    assert dino_loss(student, teacher, centre, 0.1, tau_t).grad_fn is not None
    assert torch.autograd.grad(dino_loss(student, teacher, centre, 0.1, tau_t), teacher, allow_unused=True)[0] is None


def test_teacher_distribution_is_centred_and_sharpened():
    t = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    q = teacher_distribution(t, torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), 0.5)  # centred: all equal
    assert torch.allclose(q, torch.full((1, 3), 1 / 3, dtype=torch.float64))
    cold, warm = teacher_distribution(t, torch.zeros(3), 0.04), teacher_distribution(t, torch.zeros(3), 1.0)
    assert mean_entropy(cold) < mean_entropy(warm) < math.log(3)  # a lower temperature sharpens
    assert mean_entropy(torch.full((4, 8), 1 / 8)).item() == pytest.approx(math.log(8))


def test_centre_update_and_teacher_temperature_follow_their_formulas():
    centre, mean = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([3.0, 0.0, 0.5])
    update_centre(centre, mean, 0.9)
    assert torch.allclose(centre, torch.tensor([0.9 * 1 + 0.1 * 3, 0.9 * -2 + 0.1 * 0, 0.5]))
    frozen = torch.zeros(3)
    update_centre(frozen, mean, 1.0)  # m = 1: no centring, the centre stays 0
    assert torch.equal(frozen, torch.zeros(3))
    # linear 0.04 -> 0.07 over 30 epochs, then flat (the paper's defaults)
    for epochs, want in [(0, 0.04), (15, 0.055), (7.5, 0.0475), (30, 0.07), (100, 0.07)]:
        assert teacher_temperature(epochs, 0.04, 0.07, 30) == pytest.approx(want, abs=1e-12)
    assert teacher_temperature(0, 0.04, 0.07, 0) == 0.07  # no warm-up: tau_t from the start


def test_head_is_a_weight_normalised_layer_with_its_gain_fixed_at_one():
    """``prototypes`` equals ``nn.utils.parametrizations.weight_norm`` with g = 1 frozen (the authors' last layer),
    in value and in V's gradient; the bottleneck is L2-normalised."""
    torch.manual_seed(0)
    head = DINOHead(16, 32, 8, 10).double()
    x = torch.randn(6, 16, dtype=torch.float64)
    z = head.embed(x)
    assert torch.allclose(z.norm(dim=1), torch.ones(6, dtype=torch.float64))
    ref = torch.nn.Linear(8, 10, bias=False).double()
    ref.weight.data.copy_(head.last.weight.data)
    ref = torch.nn.utils.parametrizations.weight_norm(ref)
    ref.parametrizations.weight.original0.data.fill_(1.0)  # g = 1
    ref.parametrizations.weight.original0.requires_grad_(False)
    zd = z.detach()
    got, want = head.prototypes(zd), ref(zd)
    assert torch.allclose(got, want, atol=1e-12)
    got.square().sum().backward()
    want.square().sum().backward()
    assert torch.allclose(head.last.weight.grad, ref.parametrizations.weight.original1.grad, atol=1e-12)
    assert head.prototypes(zd, frozen=True).requires_grad is False


def _dino(**method):
    cfg = resolve({"method": {"name": "dino", "proj_hidden": 32, "bottleneck_dim": 16, "num_prototypes": 20, **method},
                   "encoder": {"name": "resnet18", "width": 0.0625}, "train": {"batch_size": 4}})
    return create_method(cfg, num_samples=16)


def _views(seed=0, b=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, 3, 16, 16, generator=g) for _ in range(2)] + \
           [torch.randn(b, 3, 8, 8, generator=g) for _ in range(4)]


def test_teacher_sees_the_global_crops_and_the_centre_follows_its_mean_output():
    torch.manual_seed(0)
    method = _dino()
    seen = []
    method.target.net.register_forward_hook(lambda m, i, o: seen.append((i[0].shape, o.detach().clone())))
    views = _views()
    out = method.training_step(views, progress=Progress(step=0, epoch=0, total_steps=8, steps_per_epoch=4))
    (shape, t), = seen
    assert shape == (8, 3, 16, 16)  # the 2 global crops of 4 images, nothing of the local ones
    assert torch.allclose(out["teacher_mean"], t.mean(0), atol=1e-6)
    out["loss"].backward()
    method.after_step(out, Progress(step=1, epoch=0, total_steps=8, steps_per_epoch=4))
    assert torch.allclose(method.centre, 0.1 * t.mean(0), atol=1e-6)  # c = 0.9 * 0 + 0.1 * mean
    assert out["teacher_temp"].item() == pytest.approx(0.04)  # epoch 0 of the warm-up


def test_last_layer_gets_no_gradient_in_the_first_epoch():
    torch.manual_seed(0)
    method = _dino()
    first = method.training_step(_views(), progress=Progress(step=3, epoch=0, total_steps=8, steps_per_epoch=4))
    first["loss"].backward()
    assert method.head.last.weight.grad is None and first["last_layer_frozen"].item() == 1.0
    assert method.head.mlp[0].weight.grad is not None
    later = method.training_step(_views(1), progress=Progress(step=4, epoch=1, total_steps=8, steps_per_epoch=4))
    later["loss"].backward()
    assert method.head.last.weight.grad is not None and later["last_layer_frozen"].item() == 0.0


def _distil_gaussians(centre_momentum: float, steps: int = 120, seed: int = 0) -> list[dict[str, float]]:
    """DINO (a small MLP as its encoder, the method's default head) on 16-d Gaussian inputs whose two views differ by
    noise of std 0.3; K = 32, tau_t = 0.04 throughout, teacher momentum 0.99, nothing frozen, Adam lr 2e-3, batch 64.
    Returns the logged metrics of every step."""
    from kontrast.methods.dino import DINO, DINOParams

    class Encoder(torch.nn.Sequential):
        dim = 32

    torch.manual_seed(seed)
    encoder = Encoder(torch.nn.Linear(16, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    method = DINO(encoder, DINOParams(proj_hidden=64, bottleneck_dim=16, num_prototypes=32, teacher_temp=0.04,
                                      warmup_teacher_temp_epochs=0.0, freeze_last_layer_epochs=0.0, base_momentum=0.99,
                                      centre_momentum=centre_momentum))
    opt = torch.optim.Adam([p for p in method.parameters() if p.requires_grad], lr=2e-3)
    g = torch.Generator().manual_seed(seed)
    logged = []
    for step in range(steps):
        x = torch.randn(64, 16, generator=g)
        views = [x + 0.3 * torch.randn(64, 16, generator=g) for _ in range(2)]
        progress = Progress(step=step, epoch=0, total_steps=steps, steps_per_epoch=steps)
        out = method.training_step(views, progress=progress)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        method.after_step(out, Progress(step=step + 1, epoch=0, total_steps=steps, steps_per_epoch=steps))
        logged.append({k: float(v.detach()) for k, v in out.items() if v.dim() == 0})
    return logged


def test_without_centring_one_prototype_dominates():
    """Caron et al. 2021, section 5.3 / figure 7: sharpening without centring makes one prototype dominate every
    image's target. Seen in the entropy of the teacher's batch-mean distribution (``teacher_batch_entropy``, log K
    when the batch uses every prototype, 0 when all use one) and the most-used prototype's share
    (``teacher_top_share``), not in the per-sample ``teacher_entropy`` alone (also near 0 for healthy, confident
    targets) nor in ``embedding_std`` (it stays well above train.collapse_std = 0.01 while one prototype takes
    ~80 % of the batch): the collapse monitor warns on the top share (train.collapse_share). Measurements:
    docs/lab/method-tests.md, "DINO"."""
    log_k = math.log(32)
    centred, ablated = _distil_gaussians(0.9), _distil_gaussians(1.0)
    last = lambda rows, key: sum(r[key] for r in rows[-10:]) / 10  # noqa: E731
    assert ablated[0]["teacher_top_share"] < 0.3  # both start spread over the prototypes
    assert last(ablated, "teacher_top_share") > 0.6 and last(ablated, "teacher_batch_entropy") < 0.3 * log_k
    assert last(centred, "teacher_top_share") < 0.2 and last(centred, "teacher_batch_entropy") > 0.85 * log_k
    assert min(r["embedding_std"] for r in ablated) > 0.01  # invisible to the embedding_std signal ...
    flagged = _collapse_warnings(ablated)  # ... but the loop's monitor also reads teacher_top_share
    assert len(flagged) == 1 and "targets are collapsing" in flagged[0] and "teacher_top_share 0." in flagged[0]
    assert _collapse_warnings(centred) == []


def _collapse_warnings(rows: list[dict[str, float]]) -> list[str]:
    """The warnings the training loop's collapse monitor gives on these logged steps (the defaults' thresholds,
    std 0.01 and share 0.5, over a 20-step window: the loop's default 100 is most of this 120-step run)."""
    monitor = CollapseMonitor(0.01, 20, share=0.5)
    messages = (monitor.update(step, r["embedding_std"], r["teacher_top_share"]) for step, r in enumerate(rows))
    return [m for m in messages if m]
