"""Data room: sources (built-in shapes, ImageFolder trees, tar archives, CIFAR pickles),
a content-keyed on-disk cache, and deterministic batch order.

Every source loads into an :class:`ImageSet`: one uint8 ``[N, 3, size, size]`` tensor (plus
labels), which the rest of kontrast moves to the device whole and augments in batches.
"""

from kontrast.data.batches import batch_indices, epoch_permutation
from kontrast.data.cache import cache_root
from kontrast.data.shapes import SHAPE_CLASSES, make_shapes
from kontrast.data.sources import ImageSet, load_images

__all__ = [
    "ImageSet",
    "SHAPE_CLASSES",
    "batch_indices",
    "cache_root",
    "epoch_permutation",
    "load_images",
    "make_shapes",
]
