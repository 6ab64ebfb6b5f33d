"""Sharded training (``train.shard``): each rank holds 1/W of the parameters, gradients and optimizer state.

PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``; Zhao et al. 2023, https://arxiv.org/abs/2304.11277):
every parameter becomes a DTensor sharded along its first dimension over the ranks. A sharded unit all-gathers its
parameters just before its forward and frees them after, gathers them again for its backward, and reduce-scatters
the gradients so each rank keeps the average of its own shard; the optimizer then steps on shards. The units here
are each ViT block and each ResNet stage, in the online networks and in an EMA target alike (the target's blocks
are copies of the online ones, so target and online shards line up and the EMA update stays element-wise on each
rank's shard); everything else (stems, heads, prototypes) is one more unit, the root, around the method's
``training_step``: the root gathers its parameters when a step starts and releases them after the backward.

What a step computes is what the unsharded run computes: the same gradient average over ranks (reduce-scatter
then the shard's own, where DDP all-reduces the whole), the same global BatchNorm and gathers
(tests/integration/test_sharding.py compares the two runs weight by weight).

Checkpoints keep kontrast's one format (``checkpoint.py``): every rank gathers the full tensors
(:func:`full_tensors`), rank 0 writes them, and a resume at any world size, sharded or not, cuts them again
(:func:`place_like`). The gathered form costs one full copy of the state on each rank while it is written;
``torch.distributed.checkpoint`` would write shards in parallel and avoid it, at the price of a second format.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from kontrast.encoders.resnet import ResNet
from kontrast.encoders.vit import Block
from kontrast.train.distributed import TrainingStep


def shard_units(method: nn.Module) -> list[nn.Module]:
    """The modules each sharded on their own: every ViT block and every ResNet stage of the method (EMA target
    included), in module order."""
    units: list[nn.Module] = []
    for m in method.modules():
        if isinstance(m, Block):
            units.append(m)
        elif isinstance(m, ResNet):
            units += [m.layer1, m.layer2, m.layer3, m.layer4]
    return units


def sharded(method: nn.Module) -> tuple[Callable, str]:
    """``method.training_step`` with the method's parameters sharded over the default process group (in place: the
    method's parameters are DTensors from here on; build the optimizer after this), and a line saying how."""
    units = shard_units(method)
    for unit in units:
        fully_shard(unit)
    step = fully_shard(TrainingStep(method))
    world = torch.distributed.get_world_size()
    count = sum(p.numel() for p in method.parameters())
    return step, (f"shard: {count:,} parameters in {len(units)} blocks or stages and the rest, each process holding "
                  f"1/{world} of them, of their gradients and of the optimizer state (FSDP2)")


def full_tensors(state: dict) -> dict:
    """``state`` (a state dict, or an optimizer state's entry) with every DTensor gathered whole. A collective:
    every rank calls it, in the same order."""
    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """``optimizer.state_dict()`` with every state tensor gathered whole (every rank calls it)."""
    sd = optimizer.state_dict()
    return {**sd, "state": {pid: full_tensors(entry) for pid, entry in sd["state"].items()}}


def place_like(tensors: dict[str, torch.Tensor], current: dict) -> dict[str, torch.Tensor]:
    """Full tensors (from a checkpoint) cut as ``current``'s DTensors are, each rank keeping its shard
    (``checkpoint.load_checkpoint``'s ``place``; for the weights and the optimizer's parameter-shaped state)."""
    return {k: distribute_tensor(v.to(c.device), c.device_mesh, c.placements) if isinstance(c := current.get(k),
                                                                                             DTensor) else v
            for k, v in tensors.items()}
