"""Every method under gradient caching (``train.accumulate``): with no BatchNorm anywhere in the network, a step
in micro-batches has the plain step's loss, gradients and state for after_step (the distributed equalities with
BatchNorm are in tests/integration/test_distributed.py)."""

import pytest
import torch
import torch.nn as nn

from kontrast.augment import make_views
from kontrast.data import Samples
from kontrast.data.sequences import make_sequences
from kontrast.methods import METHODS
from kontrast.methods.base import Progress
from kontrast.methods.build import create_method, resolve, view_specs
from support.args import HEADS, tiny_encoder

pytestmark = pytest.mark.usefixtures("one_thread")

# a queue of 16 keys (MoCo, NNCLR, SwAV): full after the first step, so the second step reads it
QUEUES = {"moco_v1": {"queue_size": 16, "bn_groups": 2}, "moco_v2": {"queue_size": 16, "bn_groups": 2},
          "infomin": {"queue_size": 16, "bn_groups": 2}, "nnclr": {"queue_size": 16},
          "swav": {"queue_size": 16, "queue_start_epochs": 0, "freeze_prototypes_epochs": 0},
          "dino": {"freeze_last_layer_epochs": 0}, "cpc": {"steps": 3, "negative_pool": 4},
          "cpc_v2": {"patch_size": 8, "patch_stride": 4, "negative_pool": 2}}


def _params(name: str) -> dict:
    small = {item.split("=")[0].removeprefix("method."): float(item.split("=")[1]) for item in HEADS.get(name, [])}
    return {k: int(v) for k, v in small.items()} | QUEUES.get(name, {})


def _without_batch_norm(module: nn.Module) -> nn.Module:
    """Every BatchNorm replaced by a per-sample norm (GroupNorm of one group, a LayerNorm over channels): a network
    whose rows never mix, as a ViT's with BN-free heads."""
    for child_name, child in module.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            setattr(module, child_name, nn.GroupNorm(1, child.num_features))
        else:
            _without_batch_norm(child)
    return module


def _method(name: str, accumulate: int):
    cfg = resolve({"method": {"name": name, **_params(name)},
                   "encoder": {"width": 1 / 16} if name == "cpc" else tiny_encoder(name), "train": {"batch_size": 8}})
    torch.manual_seed(0)
    method = _without_batch_norm(create_method(cfg, num_samples=32)).train()
    method.accumulate = accumulate
    if method.recipe is None:
        return method, lambda images, gen: [make_sequences(8, seed=int(gen.initial_seed()))[0]]
    specs = view_specs(cfg, method)
    method.bind_data(Samples(torch.randint(0, 256, (32, 3, 32, 32), dtype=torch.uint8), torch.arange(32) % 4,
                             list("abcd"), "micro"))
    return method, lambda images, gen: make_views(images, specs, gen)


@pytest.mark.parametrize("name", METHODS.names())
def test_micro_batches_without_batch_norm_equal_the_plain_step(name):
    runs = []
    for accumulate in (1, 4):
        method, views_of = _method(name, accumulate)
        trace = []
        for step in range(2):  # the second step reads what the first's after_step left (queues, EMA, bank)
            gen = torch.Generator().manual_seed(step)
            images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=gen)
            indices = torch.arange(8) + 8 * step
            torch.manual_seed(10 + step)  # the loss's own draws (AMDIM's locations) from the same state
            progress = Progress(step=step, epoch=0, total_steps=4, steps_per_epoch=4)
            out = method.training_step(views_of(images, gen), indices, progress)
            method.zero_grad()
            out["loss"].backward()
            trace.append(({k: v.detach().clone() for k, v in out.items() if torch.is_tensor(v)},
                          {k: p.grad.clone() for k, p in method.named_parameters() if p.grad is not None}))
            # a step of at most 1e-3 per weight whatever the gradient's size (Barlow Twins' reach 17 here); at 1e-2
            # this toy network amplifies rounding: MoCo v3's second gradients 1.4e-5 apart (3e-3 of the largest)
            with torch.no_grad():
                scale = max(float(p.grad.abs().max()) for p in method.parameters() if p.grad is not None)
                for p in method.parameters():
                    if p.grad is not None:
                        p.sub_(1e-3 / scale * p.grad)
            method.after_step(out, Progress(step=step + 1, epoch=0, total_steps=4, steps_per_epoch=4))
        runs.append((trace, {k: v.clone() for k, v in method.state_dict().items()}))
    (plain, plain_state), (micro, micro_state) = runs
    # float32: rows computed in other groupings round differently; gradients within 1e-4 of the largest one
    for (out_a, grads_a), (out_b, grads_b) in zip(plain, micro):
        assert out_a.keys() == out_b.keys() and grads_a.keys() == grads_b.keys()
        for k in out_a:
            assert torch.allclose(out_a[k], out_b[k], rtol=1e-5, atol=1e-5), k
        scale = max(float(g.abs().max()) for g in grads_a.values())
        for k in grads_a:
            assert torch.allclose(grads_a[k], grads_b[k], rtol=1e-3, atol=1e-4 * scale), k
    for k in plain_state:  # weights, targets, queues, banks, centres after two steps
        if plain_state[k].is_floating_point():
            assert torch.allclose(plain_state[k], micro_state[k], rtol=1e-5, atol=1e-6), k
