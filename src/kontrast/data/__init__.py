"""Data room: sources (built-in shapes and sequences, ImageFolder trees, tar archives, CIFAR
pickles, paired image-caption files), a content-keyed on-disk cache, and deterministic batch order;
and tar shards in the WebDataset convention: written from a folder (:mod:`~kontrast.data.shard_writer`),
indexed for reading by sample number (:mod:`~kontrast.data.shard_index`), on disk or at a URL (``s3://``,
``gs://``, ``https://``: :mod:`~kontrast.data.remote`; read through a bounded local cache,
:mod:`~kontrast.data.shard_cache`); and the shapes written as files at any resolution
(:mod:`~kontrast.data.shapes_files`); and the streaming path's pieces: a folder or
shards addressed by sample number (:func:`open_stream`), decoded at the views' crops
(:mod:`~kontrast.data.stream_decode`) by a DataLoader Dataset (:mod:`~kontrast.data.stream_dataset`).

Every source loads into :class:`Samples`: one tensor (uint8 images ``[N, 3, size, size]``, or
float32 sequences ``[N, C, L]``) plus labels and each row's path, which the rest of kontrast
moves to the device whole and augments in batches. The kinds of source are registered in
:data:`SOURCES` by the modules imported here; :func:`load_images` dispatches through it.
"""

# registering shapes, sequences, cifar, folder, tar, pairs, shards:
from kontrast.data import builtin, cifar, folder, pairs, shard_memory  # noqa: F401
from kontrast.data.batches import batch_indices, epoch_permutation
from kontrast.data.cache import cache_root
from kontrast.data.samples import Samples, SourceKind, split_validation
from kontrast.data.shapes import SHAPE_CLASSES, make_shapes
from kontrast.data.shapes_files import write_shapes_files
from kontrast.data.shard_index import ShardIndex, open_shards, read_sample
from kontrast.data.shard_writer import write_folder_shards
from kontrast.data.sources import load_images
from kontrast.data.stream_source import StreamSource, open_stream
from kontrast.registry import SOURCES

__all__ = [
    "SHAPE_CLASSES",
    "SOURCES",
    "Samples",
    "ShardIndex",
    "StreamSource",
    "SourceKind",
    "batch_indices",
    "cache_root",
    "epoch_permutation",
    "load_images",
    "make_shapes",
    "open_shards",
    "open_stream",
    "read_sample",
    "split_validation",
    "write_folder_shards",
    "write_shapes_files",
]
