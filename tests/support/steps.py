"""One training step's inputs, as the method tests build them: the method on 8 random 32-px images (their labels
and captions bound), and the recipe's views of those images."""

from __future__ import annotations

import torch

from kontrast.augment import make_views
from kontrast.data import Samples
from kontrast.decisions import view_specs
from kontrast.methods import METHODS
from kontrast.methods.base import Ranks
from kontrast.methods.build import create_method
from support.teacher import with_teacher

IMAGE_METHODS = [name for name in METHODS.names() if METHODS.get(name).recipe is not None]  # CPC v1: sequences


def method_and_views(cfg) -> tuple:
    """``(method, views)`` for a resolved ``cfg``: a dataset of 8 images (sizes per-sample state), bound as the loop
    binds its data (CLIP's captions, SupCon's labels), and one step's views of them."""
    method = create_method(with_teacher(cfg), num_samples=8)  # distill: the tiny teacher where cfg names none
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    method.bind_data(Samples(images, torch.arange(8) % 2, ["cat", "dog"], "smoke"))
    return method, make_views(images, view_specs(cfg), torch.Generator().manual_seed(0))


class RankOfTwo(Ranks):
    """Rank ``rank`` of two, with no process group: for what every rank draws alike from the step's seed (MAE's and
    I-JEPA's masks), which needs none."""

    world = 2

    def __init__(self, rank: int):
        self.rank = rank
