"""SimCLR v2: SimCLR with a 3-layer projection head (Chen et al. 2020, https://arxiv.org/abs/2006.10029).

augment: SimCLR's CIFAR recipe -> encoder -> mlp(dim, dim, dim, 128) with BN -> cosine / tau
-> NT-Xent (the SimCLR composition, ``simclr.py``; only the head differs). SimCLR v2 fine-tunes
"from the middle layer of the projection head" (section 2): with ``keep_head_layers = 1`` (default)
the head's first layer (Linear-BN-ReLU) becomes part of ``method.encoder``, so kNN, the linear
probe and ``kontrast eval`` all read its output; 0 evaluates the plain encoder as other methods do.
CIFAR settings as SimCLR's (tau 0.5; SGD lr 0.06 per 256 images, weight decay 5e-4).
"""

from __future__ import annotations

from dataclasses import dataclass

from kontrast.config import checked
from kontrast.errors import UserError
from kontrast.extract import EncoderWithHead, mlp, split_mlp
from kontrast.methods.base import Method, Ranks
from kontrast.methods.simclr import VIEW_BN, SimCLR
from kontrast.registry import METHODS


@dataclass(frozen=True)
class SimCLRV2Params:
    temperature: float = 0.5  # tau of NT-Xent's scores cosine / tau
    proj_hidden: int = 0  # 0 = the encoder's feature dim, as in the paper
    proj_dim: int = 128  # output width of the projection head
    proj_layers: int = 3  # layers of the projection head (SimCLR v2: 3)
    keep_head_layers: int = 1  # head layers evaluated as part of the encoder (0 = none)
    view_bn: str = checked("per_view", choices=VIEW_BN)  # as SimCLR's

    def __post_init__(self):
        if not 0 <= self.keep_head_layers < self.proj_layers:
            raise UserError(f"method.keep_head_layers must be in [0, proj_layers - 1 = {self.proj_layers - 1}], "
                            f"got {self.keep_head_layers}")


@METHODS.register("simclr_v2")
class SimCLRV2(SimCLR):
    description = "SimCLR v2: SimCLR with a 3-layer head, evaluated from its first layer (Chen et al. 2020)"
    Params = SimCLRV2Params

    def __init__(self, encoder, params: SimCLRV2Params, num_samples: int = 0, ranks: Ranks = Ranks()):
        Method.__init__(self, encoder, params, num_samples, ranks)  # SimCLR's training_step, this head
        hidden = params.proj_hidden or encoder.dim
        head = mlp([encoder.dim, *[hidden] * (params.proj_layers - 1), params.proj_dim])
        kept, self.projector = split_mlp(head, params.keep_head_layers)
        if params.keep_head_layers:
            self.encoder = EncoderWithHead(encoder, kept, hidden)
