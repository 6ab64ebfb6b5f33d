"""What ``train.shard`` shards and what it refuses (kontrast/train/sharding.py, kontrast/decisions.py::check_shard);
the sharded runs themselves: tests/integration/test_sharding.py."""

from __future__ import annotations

import pytest

from kontrast.decisions import decide
from kontrast.encoders.vit import Block
from kontrast.errors import Refusal
from kontrast.methods.build import create_method, resolve
from kontrast.train.sharding import shard_units


def test_the_units_are_every_block_and_stage_of_the_online_networks_and_the_ema_target():
    byol = create_method(resolve({"method": {"name": "byol"}, "encoder": {"width": 0.0625}}))
    units = shard_units(byol)
    assert len(units) == 8  # 4 ResNet stages online, 4 in the target
    assert {id(u) for u in units} >= {id(getattr(byol.encoder, f"layer{i}")) for i in range(1, 5)}
    dino = create_method(resolve({"method": {"name": "dino"}, "encoder": {"name": "vit_tiny", "depth": 2}}))
    assert len(shard_units(dino)) == 4 and all(isinstance(u, Block) for u in shard_units(dino))  # student, teacher


@pytest.mark.parametrize("setting, advice", [({"knn_every": 1}, {"train.knn_every": 0}),
                                             ({"compile": True}, {"train.compile": False}),
                                             ({"channels_last": True}, {"train.channels_last": "auto"})])
def test_what_sharding_cannot_take_is_refused_on_several_processes_only(setting, advice):
    cfg = resolve({"train": {"shard": True, "batch_size": 32, **setting}})
    with pytest.raises(Refusal) as refused:
        decide(cfg, world=2)
    assert refused.value.advice == advice and str(refused.value).startswith("train.shard")
    decide(cfg, world=1)  # one process: nothing is sharded, nothing refused
