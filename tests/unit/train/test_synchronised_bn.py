"""Which BatchNorm a run on several processes gets (kontrast.train.distributed.synchronised_batch_norm): PyTorch's
SyncBatchNorm where it runs, kontrast's GlobalBatchNorm on CPU; either way the same parameters and checkpoint keys.
The statistics themselves are checked on several processes in tests/support/collectives.py (GlobalBatchNorm against
BatchNorm on the global batch); SyncBatchNorm's need a GPU (benchmarks/gpu.sh)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from kontrast.encoders.resnet import resnet18
from kontrast.train.distributed import GlobalBatchNorm, synchronised_batch_norm


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(resnet18(width=0.125), nn.Linear(64, 8), nn.BatchNorm1d(8))
    for bn in (m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)):
        nn.init.uniform_(bn.weight)  # not the default ones: the copy must carry them
        bn.running_mean.uniform_()
    return model


@pytest.mark.parametrize("device, kind", [("cuda", nn.SyncBatchNorm), ("xpu", nn.SyncBatchNorm),
                                          ("cpu", GlobalBatchNorm)])
def test_each_device_gets_its_synchronised_batch_norm_with_the_same_state(device, kind):
    before = _model()
    state = {k: v.clone() for k, v in before.state_dict().items()}
    count = sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in before.modules())
    after = synchronised_batch_norm(before, torch.device(device))  # converted on the host, moved later
    norms = [m for m in after.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert len(norms) == count and all(type(m) is kind for m in norms)
    assert after.state_dict().keys() == state.keys()
    assert all(torch.equal(after.state_dict()[k], v) for k, v in state.items())


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_conversion_keeps_the_parameter_objects_so_a_frozen_target_stays_frozen(device):
    """An EMA target's BatchNorm (requires_grad False) converted stays out of the gradients: a fresh BN's parameters
    would require them, and on several processes DDP would wait for gradients that never come."""
    model = _model()
    model[0].requires_grad_(False)  # the target's part
    before = [(name, p) for name, p in model.named_parameters()]
    after = synchronised_batch_norm(model, torch.device(device))
    assert [(name, id(p), p.requires_grad) for name, p in after.named_parameters()] == \
        [(name, id(p), p.requires_grad) for name, p in before]
