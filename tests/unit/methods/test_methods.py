"""Every registered method: a smoke step on CPU (the learning runs are in tests/learning)."""

import pytest
import torch
from safetensors.torch import save

from kontrast.augment import make_views
from kontrast.decisions import view_specs
from kontrast.methods.base import Progress
from kontrast.methods.build import create_method, resolve
from support.args import TINY_ENCODER, tiny_encoder
from support.steps import IMAGE_METHODS, method_and_views

TINY = {"encoder": TINY_ENCODER}
# IMAGE_METHODS: sequence methods (recipe None: CPC v1) have their own tests in test_local_methods.py.


@pytest.mark.parametrize("name", IMAGE_METHODS)
def test_smoke_step(name):
    cfg = resolve({"method": {"name": name}, "encoder": tiny_encoder(name)})
    method, views = method_and_views(cfg)  # a dataset of 8 images, bound as the loop binds it
    assert method.description and method.recipe
    before = [p.detach().clone() for p in method.parameters()]
    out = method.training_step(views, torch.arange(8), Progress(step=0, epoch=0, total_steps=2, steps_per_epoch=1))
    assert out["loss"].ndim == 0 and torch.isfinite(out["loss"])
    out["loss"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in method.encoder.parameters())
    with torch.no_grad():
        for p in method.parameters():
            if p.grad is not None:
                p.sub_(0.1 * p.grad)
    method.after_step(out, Progress(step=1, epoch=0, total_steps=2, steps_per_epoch=1))  # half of the run done
    assert any(not torch.equal(a, b) for a, b in zip(before, method.parameters()))
    save(dict(method.state_dict()))  # checkpointable: no shared tensors


@pytest.mark.parametrize("name", IMAGE_METHODS)
def test_a_float64_step_stays_in_float64(name):
    """``train.precision=fp64`` (the suite's equality tests): the float32 islands that keep bf16 scores in float32
    (``precision.at_least_float32``) leave float64 as it is, so the loss, every gradient and every buffer the step
    writes (queues, banks, centres) stay float64. A ``.float()`` anywhere on the way would round the step to float32,
    where splitting a batch rounds apart again (7 digits: docs/lab/tolerances.md)."""
    cfg = resolve({"method": {"name": name}, "encoder": tiny_encoder(name)})
    method, views = method_and_views(cfg)
    method, views = method.double(), [v.double() for v in views]
    out = method.training_step(views, torch.arange(8), Progress(step=0, epoch=0, total_steps=2, steps_per_epoch=1))
    assert out["loss"].dtype == torch.float64
    out["loss"].backward()
    method.after_step(out, Progress(step=1, epoch=0, total_steps=2, steps_per_epoch=1))
    grads = {n: p.grad.dtype for n, p in method.named_parameters() if p.grad is not None}
    state = {n: t.dtype for n, t in method.state_dict().items() if t.is_floating_point()}
    assert grads and set(grads.values()) == {torch.float64}, grads
    assert set(state.values()) == {torch.float64}, {n: d for n, d in state.items() if d != torch.float64}


def test_byol_views_go_through_batchnorm_separately():
    """BYOL's code (and solo-learn's) forward each view on its own, online and target network alike, so every
    BatchNorm normalises the B samples of one view with that view's statistics, never one 2B batch of both."""
    cfg = resolve({"method": {"name": "byol"}, **TINY})
    method = create_method(cfg, num_samples=8).train()
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    views = make_views(images, view_specs(cfg), torch.Generator().manual_seed(0))
    seen: dict[str, list[int]] = {}
    hooks = [m.register_forward_pre_hook(lambda _m, args, name=name: seen.setdefault(name, []).append(args[0].shape[0]))
             for name, m in method.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    method.training_step(views, torch.arange(8), Progress(step=0, epoch=0, total_steps=2, steps_per_epoch=1))
    for h in hooks:
        h.remove()
    assert len(seen) == len(hooks) and any(n.startswith("target.") for n in seen)  # online, predictor and target BNs
    assert all(sizes == [8, 8] for sizes in seen.values()), {n: s for n, s in seen.items() if s != [8, 8]}


def test_byol_states_the_cited_warmup():
    """solo-learn's BYOL CIFAR recipe warms up for 10 epochs (its scheduler's default, warmup_cosine)."""
    assert resolve({"method": {"name": "byol"}}).optim.warmup_epochs == 10
