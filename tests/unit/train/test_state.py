"""Stateful parts on tiny hand-checked cases: queue, EMA target, schedules, LARS."""

import math

import pytest
import torch
import torch.nn as nn

from kontrast.config import OptimConfig
from kontrast.encoders.target import MomentumTarget, cosine_momentum
from kontrast.errors import UserError
from kontrast.losses import Queue
from kontrast.train.optim import (
    LARS,
    clip_per_parameter,
    create_optimizer,
    lr_schedule,
    param_groups,
    weight_decay_schedule,
)
from kontrast.train.step import train_step


def test_queue_is_fifo_and_wraps():
    q = Queue(size=5, dim=2)
    assert torch.allclose(q.items.norm(dim=1), torch.ones(5))
    q.push(torch.tensor([[1.0, 0], [2, 0], [3, 0]]))
    assert q.ptr.item() == 3
    q.push(torch.tensor([[4.0, 0], [5, 0], [6, 0]]))  # 4, 5 fill the end; 6 overwrites row 0
    assert q.items[:, 0].tolist() == [6, 2, 3, 4, 5]
    assert q.ptr.item() == 1
    q.push(torch.arange(14.0).view(7, 2))  # more than size: the newest 5 win
    assert sorted(q.items[:, 0].tolist()) == [4, 6, 8, 10, 12]


def test_queue_counts_the_rows_written():
    q = Queue(size=5, dim=2)
    q.push(torch.ones(3, 2))
    assert q.filled.item() == q.count == 3 and not q.full  # the device's count and the host's agree
    q.push(torch.ones(4, 2))  # wraps: every row written, the count stops at the size
    assert q.filled.item() == q.count == 5 and q.full


def test_queue_in_state_dict():
    q = Queue(4, 3)
    q.push(torch.ones(2, 3))
    sd = q.state_dict()
    r = Queue(4, 3)
    r.load_state_dict(sd)
    assert torch.equal(r.items, q.items) and r.ptr.item() == 2 and r.filled.item() == 2
    assert r.count == 2  # the host's count, read from the checkpoint's
    r.push(torch.ones(2, 3))
    assert r.full


def test_ema_update_is_exact():
    online = nn.Linear(2, 1)
    target = MomentumTarget(online)
    assert all(not p.requires_grad for p in target.parameters())
    before = [p.clone() for p in target.parameters()]
    with torch.no_grad():
        for p in online.parameters():
            p.add_(1.0)
    target.update(online, 0.9)
    for t, b, o in zip(target.parameters(), before, online.parameters()):
        assert torch.allclose(t, 0.9 * b + 0.1 * o, atol=1e-7)


def test_cosine_momentum_schedule():
    assert cosine_momentum(0.99, 0.0) == pytest.approx(0.99)
    assert cosine_momentum(0.99, 0.5) == pytest.approx(0.995)
    assert cosine_momentum(0.99, 1.0) == pytest.approx(1.0)


def test_lr_schedule_warmup_then_cosine():
    lrs = lr_schedule(1.0, total_steps=10, warmup_steps=4, min_lr=0.1)  # min_lr absolute (here = 0.1 x peak)
    assert lrs[:4].tolist() == pytest.approx([0.25, 0.5, 0.75, 1.0])
    # step 4 starts the cosine at the peak, decaying towards 0.1
    expect = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 4) / 6)) for s in range(4, 10)]
    assert lrs[4:].tolist() == pytest.approx(expect)
    assert lr_schedule(0.5, 3, 0).tolist() == pytest.approx([0.5, 0.5 * 0.5 * (1 + math.cos(math.pi / 3)),
                                                            0.5 * 0.5 * (1 + math.cos(2 * math.pi / 3))])


def test_no_weight_decay_on_norms_and_biases():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    decay, no_decay = param_groups(model, 0.1)
    assert [p.shape for p in decay["params"]] == [torch.Size([4, 3])]
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0
    for name in ("sgd", "lars", "adamw"):
        opt = create_optimizer(model, OptimConfig(name=name, lr=0.1, lr_batch=256), batch_size=512)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.2)  # linear scaling


def test_fixed_lr_modules_get_their_own_groups():
    model = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.Linear(4, 2), nn.BatchNorm1d(2)))
    groups = param_groups(model, 0.1, fixed_lr=("1",))  # the second child keeps the peak lr
    fixed = [g for g in groups if g.get("fixed_lr")]
    assert [len(g["params"]) for g in groups] == [1, 1, 1, 3]  # decay, no decay; fixed: decay, no decay
    assert {id(p) for g in fixed for p in g["params"]} == {id(p) for p in model[1].parameters()}
    assert [g["weight_decay"] for g in fixed] == [0.1, 0.0]


def test_lars_step_matches_formula():
    w = nn.Parameter(torch.tensor([3.0, 4.0]))  # |w| = 5
    b = nn.Parameter(torch.tensor([1.0]))
    opt = LARS([{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0, "lars": False}],
               lr=0.5, momentum=0.9, eta=0.02)
    w.grad, b.grad = torch.tensor([1.0, 0.0]), torch.tensor([2.0])
    opt.step()
    d = torch.tensor([1.0, 0.0]) + 0.1 * torch.tensor([3.0, 4.0])
    trust = 0.02 * 5.0 / d.norm()
    assert torch.allclose(w.detach(), torch.tensor([3.0, 4.0]) - 0.5 * trust * d)
    assert torch.allclose(b.detach(), torch.tensor([0.0]))  # 1 - 0.5 * 2, no trust ratio


@pytest.mark.parametrize("lr, clipped", [(0.5, False), (0.01, True)])
def test_clipped_lars_step_matches_solo_learn_formula(lr, clipped):
    """``lars_clip``: solo-learn's LARS (its CIFAR recipes' ``clip_lr: True``): the adaptive rate
    ``eta ||w|| / (||g|| + wd ||w||)`` caps the step, effective lr = min(adaptive, lr); norms and biases plain SGD."""
    w = nn.Parameter(torch.tensor([3.0, 4.0]))  # |w| = 5
    b = nn.Parameter(torch.tensor([1.0]))
    opt = LARS([{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0, "lars": False}],
               lr=lr, momentum=0.9, eta=0.02, clip=True)
    for _ in range(2):  # the second step goes through the momentum buffer
        w.grad, b.grad = torch.tensor([1.0, 0.0]), torch.tensor([2.0])
        opt.step()
    # by hand: adaptive = 0.02 * 5 / (1 + 0.1 * 5) = 1/15 at step 1; lr 0.5 -> effective 1/15, lr 0.01 -> 0.01
    w1 = torch.tensor([3.0, 4.0]) - (0.01 if clipped else 1 / 15) * torch.tensor([1.3, 0.4])
    d1 = (0.01 if clipped else 1 / 15) / lr * torch.tensor([1.3, 0.4])  # d * min(adaptive / lr, 1)
    g2 = torch.tensor([1.0, 0.0]) + 0.1 * w1
    adaptive = 0.02 * w1.norm() / (1.0 + 0.1 * w1.norm())
    d2 = g2 * min(adaptive / lr, 1.0)
    assert torch.allclose(w.detach(), w1 - lr * (0.9 * d1 + d2))
    assert torch.allclose(b.detach(), torch.tensor([1.0 - lr * 2 - lr * (0.9 * 2 + 2)]))  # no adaptation, no clip


def test_lars_variant_is_selected_by_config():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    for clip in (False, True):
        opt = create_optimizer(model, OptimConfig(name="lars", lars_clip=clip), batch_size=256)
        assert [g["clip"] for g in opt.param_groups] == [clip, clip]


def test_grouped_and_shuffled_forward():
    from kontrast.encoders.batchnorm import grouped_forward, shuffled_forward

    x = torch.randn(12, 3)
    lin = nn.Linear(3, 2)
    assert torch.allclose(shuffled_forward(lin, x, 4), lin(x), atol=1e-6)  # order restored
    bn = nn.BatchNorm1d(3)
    out = grouped_forward(bn, x, 3)
    for chunk, y in zip(x.chunk(3), out.chunk(3)):  # each group normalised by its own statistics
        expect = (chunk - chunk.mean(0)) / torch.sqrt(chunk.var(0, unbiased=False) + bn.eps)
        assert torch.allclose(y, expect, atol=1e-5)
    torch.manual_seed(0)
    shuffled = shuffled_forward(bn, x, 3)
    assert shuffled.shape == x.shape and not torch.allclose(shuffled, out)


def test_min_lr_is_an_absolute_rate_and_may_not_exceed_the_peak():
    """optim.min_lr is the last step's lr whatever the peak (DINO's 1e-6 ends at 1e-6, not 1e-6 x peak)."""
    lrs = lr_schedule(2.5e-4, total_steps=100, warmup_steps=10, min_lr=1e-6)
    assert lrs[-1].item() == pytest.approx(1e-6 + (2.5e-4 - 1e-6) * 0.5 * (1 + math.cos(math.pi * 89 / 90)))
    assert lr_schedule(2.5e-4, 101, 10, 1e-6)[-1].item() > 1e-6 and min(lr_schedule(2.5e-4, 101, 10, 1e-6)) >= 1e-6
    with pytest.raises(UserError, match="optim.min_lr 0.01 is above the peak lr 0.001"):
        lr_schedule(1e-3, 10, 0, 1e-2)


def test_weight_decay_schedule_is_the_authors_cosine():
    """DINO's cosine_scheduler(0.04, 0.4, epochs, niter): wd_t = end + (start - end)(1 + cos(pi t / T)) / 2."""
    cfg = OptimConfig(weight_decay=0.04, weight_decay_end=0.4)
    wds = weight_decay_schedule(cfg, 50)
    want = [0.4 + (0.04 - 0.4) * 0.5 * (1 + math.cos(math.pi * t / 50)) for t in range(50)]
    assert wds == pytest.approx(want) and wds[0] == pytest.approx(0.04)
    assert weight_decay_schedule(OptimConfig(weight_decay=0.04), 50) is None  # constant: nothing to set


def test_clipping_is_per_parameter_as_dino_clip_gradients():
    """The authors' clip_gradients: each parameter's gradient scaled by min(clip / (||g|| + 1e-6), 1), on its own."""
    torch.manual_seed(0)
    params = [torch.zeros(4, requires_grad=True), torch.zeros(3, 3, requires_grad=True),
              torch.zeros(2, requires_grad=True)]
    grads = [torch.full((4,), 5.0), 0.01 * torch.randn(3, 3), torch.tensor([30.0, -40.0])]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    clip_per_parameter(params, 3.0)
    for p, g in zip(params, grads):
        want = g * min(3.0 / (float(g.norm()) + 1e-6), 1.0)  # the reference, one parameter at a time
        assert torch.allclose(p.grad, want, atol=1e-6)
    assert float(params[1].grad.norm()) < 3 and float(params[2].grad.norm()) == pytest.approx(3.0, rel=1e-5)


def test_train_step_sets_the_scheduled_weight_decay_and_clips():
    """A run with weight_decay_end and clip_grad: each step's decayed groups carry that step's weight decay (norms
    and biases keep 0), and the gradient the optimizer sees is clipped per parameter."""
    from kontrast.augment import key_tensor
    from kontrast.methods.base import Progress
    from kontrast.methods.build import resolve
    from kontrast.train.plan import build_run, plan_run

    cfg = resolve({"method": {"name": "simclr", "proj_hidden": 16, "proj_dim": 8}, "encoder": {"width": 0.125},
                   "data": {"source": "shapes:16", "size": 16},
                   "train": {"batch_size": 8, "epochs": 2, "precision": "fp32"},
                   "optim": {"name": "adamw", "weight_decay": 0.04, "weight_decay_end": 0.4, "clip_grad": 1e-3}})
    ctx, schedule, _ = build_run(plan_run(cfg))
    seen = []
    ctx.optimizer.step = lambda: seen.append((
        [g["weight_decay"] for g in ctx.optimizer.param_groups],
        max(float(p.grad.norm()) for p in ctx.guard.params if p.grad is not None)))
    for step in range(schedule.total_steps):
        progress = Progress(step=step, epoch=0, total_steps=schedule.total_steps,
                            steps_per_epoch=schedule.steps_per_epoch)
        train_step(ctx, torch.arange(8), key_tensor(0), progress)
    assert len(seen) == schedule.total_steps == 4
    for step, (wds, largest) in enumerate(seen):
        assert sorted(set(wds)) == pytest.approx(sorted({0.0, ctx.wds[step]}))
        assert largest <= 1e-3 * (1 + 1e-4)
    assert ctx.wds == pytest.approx(weight_decay_schedule(cfg.optim, 4))
