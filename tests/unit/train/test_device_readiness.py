"""GPU-readiness, checked on CPU: no host synchronisation, a step's kernel count independent of the batch,
no graph breaks under ``torch.compile``.

tests/unit/augment/test_augment.py already checks the apply ops on the meta device and the operator count of
``make_views`` with a ``torch.Generator``; here: the whole pipeline as training runs it (per-sample
``SampleRNG`` draws included) and the losses on the meta device, the operator count of a full
training step, and dynamo's view of augmentation + loss.
"""

from collections import Counter

import pytest
import torch

from kontrast.augment import RECIPES, SampleRNG, derive_key, key_tensor, make_views
from kontrast.bench.augment import resolved_recipe
from kontrast.data import Samples
from kontrast.losses import info_nce_chunked, moco_loss, nt_xent
from kontrast.methods.base import Progress
from kontrast.methods.build import resolve
from kontrast.train.data_path import TrainData
from kontrast.train.plan import build_run, plan_run
from kontrast.train.step import train_step

HOST_READS = {"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::is_nonzero"}


def meta(*shape, dtype=torch.float32, grad=False):
    return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=grad)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_views_with_per_sample_rng_run_on_meta(name):
    """Sampling included: on the meta device any value read on the host (.item(), a data-dependent
    shape, a Python branch on a tensor) raises, so passing means the pipeline never synchronises."""
    specs = resolved_recipe(name, 32)
    views = make_views(meta(8, 3, 32, 32, dtype=torch.uint8), specs, SampleRNG(7, meta(8, dtype=torch.int64)))
    assert [tuple(v.shape) for v in views] == [(8, 3, s.size, s.size) for s in specs]
    assert all(v.device.type == "meta" for v in views)


def test_losses_forward_and_backward_on_meta():
    z1, z2 = meta(8, 16, grad=True), meta(8, 16, grad=True)
    nt_xent(z1, z2, 0.5).backward()
    moco_loss(z1, z2.detach(), meta(32, 16), 0.2).backward()
    rows = torch.arange(16, device="meta")
    z = meta(16, 16, grad=True)
    loss = info_nce_chunked(z, z, rows, 0.5, exclude=rows, chunk=5)
    loss.backward()
    assert loss.shape == () and z.grad.shape == (16, 16) and z1.grad.shape == (8, 16)


def _step_counts(method_name: str, batch: int) -> Counter:
    """Operator calls (by name) of one training step as the loop runs it (``train_step``: views,
    forward + loss, backward, guard, optimizer, after_step); the second step is counted (the first warms up)."""
    cfg = resolve({"method": {"name": method_name}, "encoder": {"width": 0.0625},
                   "train": {"batch_size": batch, "device": "cpu", "precision": "fp32", "channels_last": False}})
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    ctx, _, _ = build_run(plan_run(cfg), train=TrainData(Samples(images, None, [], "random"), line=""))
    ctx.lrs = [0.1, 0.1]
    key = key_tensor(derive_key("augment", 0, 0))

    def step(i: int) -> None:
        idx = torch.arange(i, i + batch) % 64
        train_step(ctx, idx, key, Progress(step=i, epoch=0, total_steps=2, steps_per_epoch=2))

    step(0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step(1)
    return Counter(e.name for e in prof.events())


@pytest.mark.parametrize("method_name", ["simclr", "moco_v2"])
def test_operator_calls_per_step_do_not_grow_with_batch(method_name):
    # 24, not 16: moco_v2's 8 BN groups per view would hold 2 samples each, and BatchNorm1d on CPU
    # takes another kernel path (no aten::zeros) for 2 samples than for 3 or more
    small, large = _step_counts(method_name, 24), _step_counts(method_name, 48)
    assert small == large, {k: (small[k], large[k]) for k in small.keys() | large.keys() if small[k] != large[k]}
    assert not HOST_READS & set(large), HOST_READS & set(large)
    assert sum(large.values()) > 100  # the profiler saw the step


def test_compile_of_augmentation_and_loss_has_no_graph_break():
    """torch._dynamo.explain over views (per-sample RNG) + NT-Xent: one graph, no break (~5 s on one core)."""
    specs = resolved_recipe("byol", 32)  # every op: crop, flip, jitter with hue, grayscale, blur, solarize

    def views_and_loss(x, ids):
        v1, v2 = make_views(x, specs, SampleRNG(123, ids))
        return nt_xent(v1.flatten(1)[:, :24], v2.flatten(1)[:, :24], 0.5)

    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    explained = torch._dynamo.explain(views_and_loss)(x, torch.arange(8))
    assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
    assert explained.graph_count == 1


def test_train_compile_compiles_the_encoder_in_place_and_the_views(tmp_path, monkeypatch):
    """``train.compile`` calls ``nn.Module.compile`` on the encoder and ``torch.compile`` on the view
    pipeline (both stubbed here: a real compile takes minutes on CPU); the encoder in place, so parameter
    names and checkpoints do not change."""
    from kontrast.train.loop import fit

    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: compiled.append(type(self).__name__))
    monkeypatch.setattr(torch, "compile", lambda fn, **k: compiled.append(fn.__name__) or fn)
    cfg = resolve({"data": {"source": "shapes:32"}, "encoder": {"width": 0.0625},
                   "train": {"epochs": 1, "batch_size": 16, "compile": True}})
    summary = fit(cfg, tmp_path / "run", progress=False)
    assert compiled == ["ResNet", "views"] and summary["steps"] == 2


def test_randaugment_views_are_not_compiled():
    """Compiled, InfoMin's RandAugment views ran at half the eager speed (docs/lab/performance.md §6)."""
    from kontrast.augment import get_recipe, view_maker

    assert not hasattr(view_maker(get_recipe("infomin"), compile=True), "_torchdynamo_orig_callable")
    assert hasattr(view_maker(get_recipe("simclr_cifar"), compile=True), "_torchdynamo_orig_callable")


@pytest.mark.slow
def test_compiled_views_equal_eager_views_and_compile_once():
    """view_maker(compile=True) gives make_views' views (to float rounding), and a new epoch's key (a
    tensor) reuses the graph: no recompilation (~30 s on one core, most of it the first compile)."""
    from kontrast.augment import key_tensor, view_maker

    specs = resolved_recipe("simclr_cifar", 32)
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    ids = torch.arange(16)
    eager, compiled = view_maker(specs), view_maker(specs, compile=True)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for epoch in range(2):
            key = key_tensor(derive_key("augment", 0, epoch))
            for a, b in zip(eager(x, ids, key), compiled(x, ids, key)):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
