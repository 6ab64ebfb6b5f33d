"""Each method's sizes in the tests, in one table: its heads, predictors, prototypes, queues and BN groups cut to
sizes that change nothing a test checks (the code path is the same) and cost a fraction of the paper's at CPU scale.

A row holds, per method, what three kinds of test set:

``heads``
    ``--set`` items for every tiny run: the CLI runs, the configuration space, the smallest sizes, the micro-batch
    unit test (none for a method whose heads are small already).
``ranks``
    ``--set`` items of the distributed runs (tests/integration/test_distributed.py, test_sharding.py) over ``heads``,
    the same on both sides of every comparison: queues and BN groups that several processes share, another encoder.
    (Until the runs compared trained in float64, Barlow Twins, VICReg, MMCR, LeJEPA and MoCo v2 kept their default
    heads there, as their float32 floors had been measured; the 2048-wide expanders in float64 made Barlow Twins' and
    VICReg's runs the longest of the file.)
``micro_batches``
    method settings of the micro-batch unit test (tests/unit/methods/test_micro_batched_methods.py), over ``heads``:
    queues of 16 keys (MoCo, NNCLR, SwAV), full after its first step, so that the second step reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from support.teacher import tiny_teacher


@dataclass(frozen=True)
class Sizes:
    heads: tuple[str, ...] = ()
    ranks: tuple[str, ...] = ()
    micro_batches: dict = field(default_factory=dict)


PREDICTOR = ("method.proj_hidden=64", "method.pred_hidden=64")  # BYOL's, MoCo v3's and NNCLR's projector and predictor
SIMSIAM = ("method.proj_hidden=64", "method.proj_dim=64", "method.pred_hidden=32")
SWAV = ("method.proj_hidden=64", "method.num_prototypes=30")
DINO_HEAD = ("method.proj_hidden=64", "method.bottleneck_dim=32", "method.num_prototypes=64")  # DINO's and iBOT's
SHUFFLED_QUEUE = {"queue_size": 16, "bn_groups": 2}  # MoCo v1, v2 and InfoMin in micro-batches
EXPANDER = ("method.proj_hidden=128", "method.proj_dim=128")  # Barlow Twins' and VICReg's
MAE_DECODER = ("method.decoder_dim=32", "method.decoder_depth=1", "method.decoder_heads=2")
# I-JEPA's predictor 32 wide, 1 block; contexts of at least 3 patches (the paper's 10 leave none on a 4x4 grid)
IJEPA_PREDICTOR = ("method.predictor_dim=32", "method.predictor_depth=1", "method.predictor_heads=2",
                   "method.min_context=2")

SIZES: dict[str, Sizes] = {
    "barlow_twins": Sizes(heads=EXPANDER),
    "vicreg": Sizes(heads=EXPANDER),
    "byol": Sizes(heads=PREDICTOR),
    "moco_v3": Sizes(heads=PREDICTOR),
    "simsiam": Sizes(heads=SIMSIAM),
    # on 2 ranks: 4 BN groups per view, 2 on each rank, shuffled across ranks for the keys; global batch 24
    # (test_distributed.py's BATCH)
    "moco_v1": Sizes(ranks=("method.bn_groups=4", "method.queue_size=48"), micro_batches=SHUFFLED_QUEUE),
    # MoCo v2's symmetric loss pushes 2 x 24 keys a step: a queue of 96 holds two steps, so a queue updated twice (or
    # not at all) shows at the second step instead of refilling the queue with the same keys
    "moco_v2": Sizes(heads=("method.proj_hidden=64",), ranks=("method.bn_groups=4", "method.queue_size=96"),
                     micro_batches=SHUFFLED_QUEUE),
    # InfoMin on 2 ranks: 2 groups per view, one per rank, still shuffled across ranks
    "infomin": Sizes(ranks=("method.bn_groups=2", "method.queue_size=48"), micro_batches=SHUFFLED_QUEUE),
    # SwAV on 2 ranks with its queue in the transport from step 3 (two steps of 12 keys fill 24)
    "swav": Sizes(heads=SWAV, ranks=("method.queue_size=24", "method.queue_start_epochs=0",
                                     "method.freeze_prototypes_epochs=0"),
                  micro_batches={"queue_size": 16, "queue_start_epochs": 0, "freeze_prototypes_epochs": 0}),
    # NNCLR on 2 ranks with a support queue of 24: two steps of 12 fill it, so step 3 looks up real embeddings
    "nnclr": Sizes(heads=("method.queue_size=2048", *PREDICTOR), ranks=("method.queue_size=24",),
                   micro_batches={"queue_size": 16}),
    # DINO on 2 ranks: multi-crop (2 x 16 px + 4 x 8 px; the centre takes both ranks' teacher outputs), the last layer
    # trained from step 1 (the run is one epoch)
    "dino": Sizes(heads=DINO_HEAD, ranks=("method.freeze_last_layer_epochs=0",),
                  micro_batches={"freeze_last_layer_epochs": 0}),
    # iBOT on 2 ranks on a 2-block ViT (16-px images: 4x4 tokens, local crops 2x2), no stochastic depth (its draws are
    # per process, so W processes draw other ones than one process: the same holds for DINO and MoCo v3 on a ViT)
    "ibot": Sizes(heads=DINO_HEAD, ranks=("encoder.name=vit_tiny", "encoder.depth=2", "encoder.drop_path=0",
                                          "method.freeze_last_layer_epochs=0")),
    # CPC v2: 8-px patches (the CIFAR stem's smallest input); on 2 ranks at stride 2 (a 5 x 5 grid of 16-px images)
    # with pools of 2 images, which divide 6 and 12
    "cpc_v2": Sizes(ranks=("method.patch_size=8", "method.patch_stride=2", "method.negative_pool=2"),
                    micro_batches={"patch_size": 8, "patch_stride": 4, "negative_pool": 2}),
    "cpc": Sizes(ranks=("method.context_dim=32", "method.steps=3", "method.negative_pool=3"),
                 micro_batches={"steps": 3, "negative_pool": 4}),
    # AMDIM and YADIM on 2 ranks on the ResNet-18 maps (the amdim encoder needs 32-px images; the cross-rank code is
    # the same)
    "amdim": Sizes(heads=("method.n_rkhs=32",), ranks=("encoder.name=resnet18",)),
    "yadim": Sizes(heads=("method.n_rkhs=32",), ranks=("encoder.name=resnet18",)),
    # MAE on 2 ranks on a 2-block ViT (16-px images: 16 patches, 4 kept), its decoder 32 wide, 1 block
    "mae": Sizes(heads=MAE_DECODER, ranks=("encoder.name=vit_tiny", "encoder.depth=2")),
    # I-JEPA on 2 ranks on a 2-block ViT (16-px images: a 4x4 grid, four 1- or 2-patch targets, a 3x3 context block)
    "ijepa": Sizes(heads=IJEPA_PREDICTOR, ranks=("encoder.name=vit_tiny", "encoder.depth=2")),
    "mmcr": Sizes(heads=("method.proj_hidden=64", "method.proj_dim=16")),
    "lejepa": Sizes(heads=("method.proj_hidden=64", "method.directions=64")),
    # distill: a tiny teacher written by this test process (support/teacher.py), the same on every side of a comparison
    "distill": Sizes(heads=(f"method.teacher={tiny_teacher()}",)),
}


def sizes(method: str) -> Sizes:
    """``method``'s row (an empty one for a method whose sizes are small already)."""
    return SIZES.get(method, Sizes())


def small_heads(method: str) -> list[str]:
    """``--set`` items that shrink ``method``'s heads, for every tiny run."""
    return list(sizes(method).heads)


def rank_settings(method: str) -> list[str]:
    """``--set`` items of ``method``'s distributed runs: its small heads, then what several processes share."""
    return [*sizes(method).heads, *sizes(method).ranks]


def micro_batch_params(method: str) -> dict:
    """``method``'s section for the micro-batch unit test: its small heads as values, then its queues over them."""
    heads = {item.split("=")[0].removeprefix("method."): yaml.safe_load(item.split("=", 1)[1])
             for item in small_heads(method)}
    return heads | sizes(method).micro_batches
