"""Every method under gradient caching (``train.accumulate``): with no BatchNorm anywhere in the network, a step
in micro-batches has the plain step's loss, gradients and state for after_step (the distributed equalities with
BatchNorm are in tests/integration/test_distributed.py).

In float64. In float32 a row computed in another grouping rounds differently, and on this toy network one rounding
can carry a ReLU or a max-pool across its kink at the second step: the gradients then jump by 1e-2 of their size (SimCLR
v2 under AVX2 kernels: 7e-5 against a floor of 8e-8), on one CPU and not another. In float64 the same splits agree to
1e-15 of the values' scale for every method, so the comparison stays a test of the logic on every CPU. The float32
equalities, with floors, are the integration tests'."""

import pytest
import torch
import torch.nn as nn

from kontrast.augment import make_views
from kontrast.data import Samples
from kontrast.data.sequences import make_sequences
from kontrast.decisions import view_specs
from kontrast.methods import METHODS
from kontrast.methods.base import Progress
from kontrast.methods.build import create_method, resolve
from kontrast.train.faults import nudge_weights
from support.args import tiny_encoder
from support.floors import FACTOR
from support.sizes import micro_batch_params

pytestmark = pytest.mark.usefixtures("one_thread")

def _without_batch_norm(module: nn.Module) -> nn.Module:
    """Every BatchNorm replaced by a per-sample norm (GroupNorm of one group, a LayerNorm over channels): a network
    whose rows never mix, as a ViT's with BN-free heads."""
    for child_name, child in module.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            setattr(module, child_name, nn.GroupNorm(1, child.num_features))
        else:
            _without_batch_norm(child)
    return module


def _method(name: str, accumulate: int, nudged: bool = False):
    # small heads, and queues of 16 keys (MoCo, NNCLR, SwAV): full after the first step, so the second step reads them
    cfg = resolve({"method": {"name": name, **micro_batch_params(name)},
                   "encoder": {"width": 1 / 16} if name == "cpc" else tiny_encoder(name), "train": {"batch_size": 8}})
    torch.manual_seed(0)
    method = _without_batch_norm(create_method(cfg, num_samples=32)).train().double()
    method.accumulate = accumulate
    if nudged:
        nudge_weights(method, 1)
    if method.recipe is None:
        return method, lambda images, gen: [make_sequences(8, seed=int(gen.initial_seed()))[0].double()]
    specs = view_specs(cfg)
    method.bind_data(Samples(torch.randint(0, 256, (32, 3, 32, 32), dtype=torch.uint8), torch.arange(32) % 4,
                             list("abcd"), "micro"))
    return method, lambda images, gen: [v.double() if v.is_floating_point() else v
                                        for v in make_views(images, specs, gen)]


def _two_steps(name: str, accumulate: int, nudged: bool = False) -> dict[str, dict[str, torch.Tensor]]:
    """Two steps of ``name`` in ``accumulate`` micro-batches: each step's outputs and gradients, then the state
    (weights, targets, queues, banks, centres) after both, keyed by what they are."""
    method, views_of = _method(name, accumulate, nudged)
    trace = {"outputs": {}, "gradients": {}}
    for step in range(2):  # the second step reads what the first's after_step left (queues, EMA, bank)
        gen = torch.Generator().manual_seed(step)
        images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=gen)
        indices = torch.arange(8) + 8 * step
        torch.manual_seed(10 + step)  # the loss's own draws (AMDIM's locations) from the same state
        progress = Progress(step=step, epoch=0, total_steps=4, steps_per_epoch=4)
        out = method.training_step(views_of(images, gen), indices, progress)
        method.zero_grad()
        out["loss"].backward()
        trace["outputs"] |= {f"{step}.{k}": v.detach().clone() for k, v in out.items() if torch.is_tensor(v)}
        trace["gradients"] |= {f"{step}.{k}": p.grad.clone() for k, p in method.named_parameters()
                               if p.grad is not None}
        # a step of at most 1e-3 per weight whatever the gradient's size (Barlow Twins' reach 17 here); at 1e-2
        # this toy network amplifies rounding: MoCo v3's second gradients 1.4e-5 apart (3e-3 of the largest)
        with torch.no_grad():
            scale = max(float(p.grad.abs().max()) for p in method.parameters() if p.grad is not None)
            for p in method.parameters():
                if p.grad is not None:
                    p.sub_(1e-3 / scale * p.grad)
        method.after_step(out, Progress(step=step + 1, epoch=0, total_steps=4, steps_per_epoch=4))
    trace["state"] = {k: v.clone() for k, v in method.state_dict().items() if v.is_floating_point()}
    return trace


EPS64 = float(torch.finfo(torch.float64).eps)


def _largest(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()), default=0.0)


@pytest.mark.parametrize("name", METHODS.names())
def test_micro_batches_without_batch_norm_equal_the_plain_step(name):
    plain, micro = _two_steps(name, 1), _two_steps(name, 4)
    # the floor (tests/support/floors.py): the plain step again with every weight one float64 ulp away
    nudged = _two_steps(name, 1, nudged=True)
    for part in ("outputs", "gradients", "state"):
        scale = max((float(v.abs().max()) for v in plain[part].values() if v.numel()), default=0.0)
        floor = max(_largest(plain[part], nudged[part]), EPS64 * scale)
        diff = _largest(plain[part], micro[part])
        assert diff <= FACTOR * floor, f"{name} {part}: differ by {diff:.3g} > {FACTOR:g} x floor {floor:.3g}"
