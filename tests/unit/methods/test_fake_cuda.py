"""Every image method's step on CUDA without a GPU: the method moved to fake CUDA tensors
(``torch._subclasses.fake_tensor.FakeTensorMode``), a tensor made on the host inside ``training_step`` or
``after_step`` and mixed with the device's raises ``FakeTensorDeviceMismatchError`` here, before a user's first GPU
run finds it. Fake tensors carry shapes, dtypes and devices and compute nothing, so two steps of each method take
less than a second.

What runs on the host in a real run runs on the host here: the draws from the step's CPU generator (iBOT's, MAE's,
I-JEPA's masks, LeJEPA's directions) are made outside the fake mode, as real CPU tensors, and the method must
move them itself. It found iBOT's masks drawn on the host and used on the device as they were.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import kontrast.methods.ibot
import kontrast.methods.ijepa
import kontrast.methods.lejepa
import kontrast.methods.mae
from kontrast.methods.base import Progress, Ranks
from kontrast.methods.build import resolve
from support.args import tiny_encoder
from support.steps import IMAGE_METHODS, method_and_views

HOST_DRAWS = [(kontrast.methods.ibot.IBOT, "_masks"), (kontrast.methods.lejepa, "unit_directions"),
              (kontrast.methods.mae.MAE, "_masks"), (kontrast.methods.ijepa.IJEPA, "_masks")]
# SwAV with a queue that its first step fills, so that it joins the second step's transport
SETTINGS = {"swav": {"queue_size": 8, "queue_start_epochs": 0.0}}


def on_the_host(draw):
    def real(*args, **kwargs):
        with unset_fake_temporarily():
            return draw(*args, **kwargs)
    return real


@pytest.mark.parametrize("name", IMAGE_METHODS)
def test_a_step_on_fake_cuda_makes_no_tensor_on_the_host(name, monkeypatch):
    for module, draw in HOST_DRAWS:
        monkeypatch.setattr(module, draw, on_the_host(getattr(module, draw)))
    cfg = resolve({"method": {"name": name, **SETTINGS.get(name, {})}, "encoder": tiny_encoder(name)})
    method, views = method_and_views(cfg)  # on the host, data bound
    with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()):
        method = method.to("cuda")  # what the training room does with the device
        assert {t.device.type for t in [*method.parameters(), *method.buffers()]} == {"cuda"}
        for step in range(2):  # the second step reads what the first one's after_step left (queues, banks)
            out = method.training_step([v.to("cuda") for v in views], torch.arange(8, device="cuda"),
                                       Progress(step=step, epoch=step, total_steps=4, steps_per_epoch=1))
            method.after_step(out, Progress(step=step + 1, epoch=step, total_steps=4, steps_per_epoch=1))
            assert out["loss"].device.type == "cuda" and out["loss"].ndim == 0
    if name == "swav":
        assert all(queue.full for queue in method.queues)  # the second step's transport had the queue in it


def test_a_tensor_made_on_the_host_inside_a_step_is_found():
    """The check itself: a step that builds its mask on the host, as iBOT's did, raises under the fake mode."""
    from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(4, 8, device="cuda")
        with pytest.raises(FakeTensorDeviceMismatchError):
            torch.where(torch.rand(4, 8) > 0.5, x, 0.0)  # [4, 8] host mask against device tokens


class _TwoRanksInOne(Ranks):
    """Two ranks as rank 0 of them sees them, with no second process: every gather returns this rank's rows twice,
    so a step has the shapes it has on two processes."""

    world = 2

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x])


def test_ibot_on_two_ranks_reads_nothing_back_from_the_device(monkeypatch):
    """iBOT's Sinkhorn codes span every rank's masked patches, whose counts differ by rank: every rank knows them on
    the host (the global batch's masks are drawn on each), so a step exchanges no count and reads none back from the
    device, which would stall each step on a GPU (under the fake mode, a count read from the device has no value)."""
    for module, draw in HOST_DRAWS:
        monkeypatch.setattr(module, draw, on_the_host(getattr(module, draw)))
    cfg = resolve({"method": {"name": "ibot"}, "encoder": tiny_encoder("ibot")})
    method, views = method_and_views(cfg)
    method.ranks = _TwoRanksInOne()
    with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()):
        method = method.to("cuda")
        out = method.training_step([v.to("cuda") for v in views], torch.arange(8, device="cuda"),
                                   Progress(step=0, epoch=0, total_steps=4, steps_per_epoch=1))
        assert out["loss"].device.type == "cuda" and out["loss"].ndim == 0
