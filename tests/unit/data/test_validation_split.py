"""``data.validation`` (kontrast.data.split_validation): the held-out rows are the same in every run of a source,
never among the training rows, the same on the memory and streaming paths, and too many is one line."""

import pytest
import torch

from kontrast.data import Samples, open_stream, split_validation, write_shapes_files
from kontrast.errors import UserError


def _samples(n: int) -> Samples:
    return Samples(torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 3, 2, 2).contiguous(),
                   torch.arange(n) % 3, ["a", "b", "c"], "rows")


def test_the_held_out_rows_are_fixed_disjoint_and_complete():
    data = _samples(50)
    train, held = split_validation(data, 10)
    again_train, again_held = split_validation(data, 10)
    assert held.paths == again_held.paths and train.paths == again_train.paths  # no seed: the same in every run
    assert len(held) == 10 and len(train) == 40
    assert sorted(map(int, held.paths + train.paths)) == list(range(50))  # every row once
    assert [int(p) for p in held.paths] == sorted(int(p) for p in held.paths)  # in the source's order
    assert held.paths != [str(i) for i in range(10)]  # drawn, not the first rows (sources are sorted by class)
    assert torch.equal(held.labels, torch.tensor([int(p) % 3 for p in held.paths]))
    assert train.subset(5, seed=1).paths[0] not in held.paths  # data.limit draws from the training rows only


def test_none_held_out_and_too_many_refused():
    data = _samples(8)
    assert split_validation(data, 0) == (data, None)
    with pytest.raises(UserError, match="data.validation 8 would hold out all 8 training images"):
        split_validation(data, 8)


def test_the_streaming_path_holds_out_the_same_files(tmp_path):
    root = tmp_path / "shapes"
    write_shapes_files(root, 30, size=16, seed=1)
    from kontrast.data import load_images

    memory = split_validation(load_images(str(root), "train", size=16), 6)[1]
    stream = split_validation(open_stream(str(root), "train"), 6)[1]
    assert memory.paths == stream.paths
