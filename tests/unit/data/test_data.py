"""Data sources, decoding, the content-keyed cache, CIFAR pickles and batch order."""

import io
import os
import pickle
import struct
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from kontrast.data import Samples, batch_indices, decode, epoch_permutation, load_images
from kontrast.data import folder as folder_source
from kontrast.errors import UserError

SIZE = 16


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Never touch ~/.cache: the default cache folder is per test."""
    monkeypatch.setenv("KONTRAST_CACHE", str(tmp_path / "default-cache"))


# ---------------------------------------------------------------------------- helpers


def _colour(i: int) -> tuple[int, int, int]:
    return (37 * i % 256, 91 * i % 256, 151 * i % 256)


def _save(path: Path, colour=(200, 30, 60), size=(20, 20), mode="RGB", fmt=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).convert(mode).save(path, fmt)
    return path


def _make_classes(folder: Path, classes: dict[str, int], start: int = 0) -> None:
    """``count`` PNGs per class, each a distinct solid colour."""
    for c, (name, count) in enumerate(classes.items()):
        for i in range(count):
            _save(folder / name / f"{i:03d}.png", _colour(start + 100 * c + i))


def _make_tar(src: Path, dest: Path, mode: str, arcname: str) -> Path:
    with tarfile.open(dest, mode) as tf:
        tf.add(src, arcname=arcname)
    return dest


def _load(source, split="train", **kw) -> Samples:
    kw.setdefault("size", SIZE)
    return load_images(str(source), split, **kw)


def _check(result: Samples, n: int, labelled: bool = True) -> None:
    assert result.x.dtype == torch.uint8 and result.x.shape == (n, 3, SIZE, SIZE)
    assert result.x.is_contiguous()
    if labelled:
        assert result.labels.dtype == torch.int64 and result.labels.shape == (n,)
    else:
        assert result.labels is None and result.classes == []


@pytest.fixture
def split_tree(tmp_path) -> Path:
    """train/ and test/ with class folders; test lacks class 'c' (labels must still agree)."""
    root = tmp_path / "split"
    _make_classes(root / "train", {"a": 3, "b": 2, "c": 2})
    _make_classes(root / "test", {"a": 1, "b": 2}, start=50)
    (root / "README.txt").write_text("not an image")
    return root


# ---------------------------------------------------------------------------- layouts


def test_train_test_folders(split_tree):
    train, test = _load(split_tree, "train"), _load(split_tree, "test")
    _check(train, 7)
    _check(test, 3)
    assert train.classes == test.classes == ["a", "b", "c"]
    assert train.labels.tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert test.labels.tolist() == [0, 1, 1]
    assert train.x[0, :, 0, 0].tolist() == list(_colour(0))  # sorted path order
    assert "split" in train.name and "train" in train.name


def test_dataset_root_one_level_down(split_tree, tmp_path):
    wrapper = tmp_path / "wrapper"
    wrapper.mkdir()
    split_tree.rename(wrapper / "cifar")
    test = _load(wrapper, "test")
    assert test.classes == ["a", "b", "c"] and test.labels.tolist() == [0, 1, 1]


def test_class_folders_hold_out_every_tenth(tmp_path):
    _make_classes(tmp_path / "cls", {"x": 12, "y": 21})
    train, test = _load(tmp_path / "cls", "train"), _load(tmp_path / "cls", "test")
    _check(train, 12 - 1 + 21 - 2)
    _check(test, 1 + 2)
    assert test.labels.tolist() == [0, 1, 1]
    # the 10th (index 9) image of class x, the 10th and 20th of y
    expected = [_colour(9), _colour(109), _colour(119)]
    assert [tuple(px) for px in test.x[:, :, 0, 0].tolist()] == expected


def test_holdout_with_too_few_images_explains(tmp_path):
    _make_classes(tmp_path / "few", {"x": 3, "y": 3})
    assert len(_load(tmp_path / "few", "train")) == 6
    with pytest.raises(UserError, match="at least 10 images"):
        _load(tmp_path / "few", "test")


def test_flat_folder_is_unlabelled(tmp_path):
    for i in range(4):
        _save(tmp_path / "flat" / f"{i}.jpg", _colour(i))
    _check(_load(tmp_path / "flat"), 4, labelled=False)
    with pytest.raises(UserError, match="labelled"):
        _load(tmp_path / "flat", "test")


def test_train_without_test_folder_is_an_error(tmp_path):
    _make_classes(tmp_path / "d" / "train", {"a": 2})
    _make_classes(tmp_path / "d" / "other", {"a": 2})
    with pytest.raises(UserError, match="no test/"):
        _load(tmp_path / "d")


@pytest.mark.parametrize(
    ("mode", "name"), [("w", "t.tar"), ("w:gz", "t.tar.gz"), ("w:gz", "t.tgz")]
)
def test_tar_archives_match_the_folder(split_tree, tmp_path, mode, name):
    archive = _make_tar(split_tree, tmp_path / name, mode, arcname="data")
    for split in ("train", "test"):
        from_tar, from_dir = _load(archive, split), _load(split_tree, split)
        assert torch.equal(from_tar.x, from_dir.x)
        assert torch.equal(from_tar.labels, from_dir.labels)
        assert from_tar.classes == from_dir.classes


def test_corrupt_archive_is_a_user_error(split_tree, tmp_path):
    archive = _make_tar(split_tree, tmp_path / "t.tar.gz", "w:gz", arcname="data")
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="t.tar.gz"):
        _load(archive)


# ---------------------------------------------------------------------------- decoding


def test_any_mode_and_size_becomes_rgb(tmp_path):
    d = tmp_path / "modes" / "all"
    _save(d / "l.png", (100, 100, 100), (30, 17), "L")
    _save(d / "la.png", (90, 90, 90), (5, 9), "LA")
    _save(d / "p.gif", (0, 0, 255), (16, 16), "P")
    _save(d / "rgba.png", (0, 255, 0), (41, 23), "RGBA")
    _save(d / "cmyk.jpg", (255, 0, 0), (19, 33), "CMYK")
    _save(d / "odd.bmp", (10, 20, 30), (3, 70))
    Image.fromarray(np.full((12, 20), 0x8000, np.uint16)).save(d / "i16.png")
    result = _load(tmp_path / "modes")
    _check(result, 7)
    by_name = dict(zip(sorted(p.name for p in d.iterdir()), result.x))
    assert by_name["l.png"][:, 5, 5].tolist() == [100, 100, 100]
    assert by_name["rgba.png"][:, 5, 5].tolist() == [0, 255, 0]
    assert by_name["p.gif"][:, 5, 5].tolist() == [0, 0, 255]
    assert by_name["i16.png"][:, 5, 5].tolist() == [128, 128, 128]  # top 8 of 16 bits
    red = by_name["cmyk.jpg"][:, 8, 8].int()
    assert red[0] > 200 and red[1] < 60 and red[2] < 60


def test_resize_shorter_side_then_centre_crop():
    image = torch.zeros(3, 32, 64, dtype=torch.uint8)  # [3, 32, 64]
    image[:, :, 32:] = 255  # right half white
    out = decode.fit_image(image, 16)  # keeps columns 16..48 of the original
    assert out.shape == (3, 16, 16)
    assert out[:, :, :7].max() == 0 and out[:, :, 9:].min() == 255
    same = torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8)
    assert decode.fit_image(same, 16) is same  # already the size: no-op


@pytest.fixture
def bad_tree(tmp_path) -> Path:
    root = tmp_path / "bad"
    _make_classes(root, {"a": 3, "b": 3})
    (root / "a" / "corrupt.png").write_bytes(b"this is not a png at all")
    good = io.BytesIO()
    Image.new("RGB", (64, 64), (1, 2, 3)).save(good, "JPEG")
    (root / "b" / "truncated.jpg").write_bytes(good.getvalue()[:300])
    for i in range(2):  # good JPEGs decoded in the same batch as the truncated one
        (root / "b" / f"good{i}.jpg").write_bytes(good.getvalue())
    return root


def test_bad_images_are_listed_and_refused(bad_tree):
    with pytest.raises(UserError) as info:
        _load(bad_tree)
    message = str(info.value)
    assert "2 unreadable" in message and "--skip-bad-images" in message
    assert "corrupt.png" in message and "truncated.jpg" in message
    assert "\n" not in message


def test_bad_images_skipped_with_a_warning(bad_tree):
    with pytest.warns(UserWarning, match="skipped 2 unreadable"):
        result = _load(bad_tree, skip_bad_images=True)
    _check(result, 8)
    assert result.labels.tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    with pytest.warns(UserWarning, match="skipped 2"):  # again from the cache
        _load(bad_tree, skip_bad_images=True)


def test_missing_path(tmp_path):
    with pytest.raises(UserError, match="nowhere"):
        _load(tmp_path / "nowhere")


def test_empty_folder(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "notes.txt").write_text("hi")
    with pytest.raises(UserError, match="no images found in .*empty"):
        _load(tmp_path / "empty")


def test_unknown_format(tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(UserError, match="data.csv"):
        _load(tmp_path / "data.csv")


def test_bad_split_name(split_tree):
    with pytest.raises(UserError, match="split"):
        _load(split_tree, "val")


# ---------------------------------------------------------------------------- cache


def _refuse_decoding(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("decoded although the cache should hit")

    monkeypatch.setattr(folder_source, "decode_blobs", fail)


def test_second_load_is_a_cache_hit(split_tree, tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    first = _load(split_tree, cache_dir=cache_dir)
    assert len(list(cache_dir.glob("*.safetensors"))) == 2  # both splits built at once
    _refuse_decoding(monkeypatch)
    for split in ("train", "test"):
        again = _load(split_tree, split, cache_dir=cache_dir)
        assert again.classes == first.classes
    assert torch.equal(_load(split_tree, cache_dir=cache_dir).x, first.x)


def test_cache_dir_from_environment(split_tree, tmp_path, monkeypatch):
    monkeypatch.setenv("KONTRAST_CACHE", str(tmp_path / "env-cache"))
    _load(split_tree)
    assert len(list((tmp_path / "env-cache").glob("*.json"))) == 2


def test_changed_content_misses_the_cache(split_tree, tmp_path):
    cache_dir = tmp_path / "cache"
    before = _load(split_tree, cache_dir=cache_dir)
    _save(split_tree / "train" / "a" / "000.png", (1, 2, 3))
    after = _load(split_tree, cache_dir=cache_dir)
    assert after.x[0, :, 0, 0].tolist() == [1, 2, 3]
    assert torch.equal(after.x[1:], before.x[1:])


@pytest.mark.parametrize("damage", ["truncate_tensors", "garbage_json", "flip_a_byte"])
def test_corrupt_cache_is_rebuilt(split_tree, tmp_path, damage):
    cache_dir = tmp_path / "cache"
    first = _load(split_tree, cache_dir=cache_dir)
    first.x = first.x.clone()  # the loaded tensors map the cache file, which this test damages in place
    for tensors in cache_dir.glob("*.safetensors"):
        data = bytearray(tensors.read_bytes())
        if damage == "truncate_tensors":
            tensors.write_bytes(data[: len(data) // 2])
        elif damage == "flip_a_byte":
            data[-1] ^= 0xFF
            tensors.write_bytes(bytes(data))
        else:
            tensors.with_suffix(".json").write_text("{not json")
    with pytest.warns(UserWarning, match="rebuilding"):
        again = _load(split_tree, cache_dir=cache_dir)
    assert torch.equal(again.x, first.x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt entry reads cleanly
        _load(split_tree, cache_dir=cache_dir)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps (Linux)")
def test_cached_images_map_the_cache_file(split_tree, tmp_path):
    """Loads map the entry's file instead of copying it, so processes reading it share its pages."""
    cache_dir = tmp_path / "cache"
    built, cached = _load(split_tree, cache_dir=cache_dir), _load(split_tree, cache_dir=cache_dir)
    assert torch.equal(built.x, cached.x)
    maps = [line.split() for line in Path("/proc/self/maps").read_text().splitlines()]
    for samples in (built, cached):  # the first load decoded, cached and read its entry back
        ptr = samples.x.data_ptr()
        files = [m[5] for m in maps if len(m) > 5 and int(m[0].split("-")[0], 16) <= ptr < int(m[0].split("-")[1], 16)]
        assert len(files) == 1 and files[0].startswith(str(cache_dir)) and files[0].endswith(".safetensors"), files


def test_unwritable_cache_only_warns(split_tree, tmp_path):
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("x")
    with pytest.warns(UserWarning, match="continuing without it"):
        _check(_load(split_tree, cache_dir=blocker), 7)


# ---------------------------------------------------------------------------- row paths


def _rows_match_files(data: Samples, root: Path) -> None:
    """Each row's pixels are those of the file its path names (solid colours: one pixel tells)."""
    for path, image in zip(data.paths, data.x):
        with Image.open(root / path) as im:
            assert tuple(image[:, 0, 0].tolist()) == im.convert("RGB").getpixel((0, 0)), path


def test_paths_of_train_test_folders(split_tree):
    train, test = _load(split_tree, "train"), _load(split_tree, "test")
    assert train.paths == ["train/a/000.png", "train/a/001.png", "train/a/002.png", "train/b/000.png",
                           "train/b/001.png", "train/c/000.png", "train/c/001.png"]
    assert test.paths == ["test/a/000.png", "test/b/000.png", "test/b/001.png"]
    _rows_match_files(train, split_tree)
    _rows_match_files(test, split_tree)


def test_paths_are_relative_to_the_given_root(split_tree, tmp_path):
    wrapper = tmp_path / "wrapper"
    wrapper.mkdir()
    split_tree.rename(wrapper / "cifar")
    assert _load(wrapper, "test").paths == ["cifar/test/a/000.png", "cifar/test/b/000.png", "cifar/test/b/001.png"]


def test_paths_of_the_holdout_split(tmp_path):
    _make_classes(tmp_path / "cls", {"x": 12, "y": 21})
    train, test = _load(tmp_path / "cls", "train"), _load(tmp_path / "cls", "test")
    assert test.paths == ["x/009.png", "y/009.png", "y/019.png"]
    assert len(train.paths) == 30 and not set(train.paths) & set(test.paths)
    assert train.paths[:10] == [f"x/{i:03d}.png" for i in (0, 1, 2, 3, 4, 5, 6, 7, 8, 10)]
    _rows_match_files(train, tmp_path / "cls")
    _rows_match_files(test, tmp_path / "cls")


def test_paths_of_a_flat_folder(tmp_path):
    for i in range(4):
        _save(tmp_path / "flat" / f"{i}.png", _colour(i))
    data = _load(tmp_path / "flat")
    assert data.paths == ["0.png", "1.png", "2.png", "3.png"]
    _rows_match_files(data, tmp_path / "flat")


def test_paths_of_a_tar_are_member_names(split_tree, tmp_path):
    archive = _make_tar(split_tree, tmp_path / "t.tar.gz", "w:gz", arcname="data")
    for split in ("train", "test"):
        assert _load(archive, split).paths == ["data/" + p for p in _load(split_tree, split).paths]


def test_subset_keeps_each_rows_path(split_tree):
    train = _load(split_tree)
    sub = train.subset(4, seed=1)
    assert len(sub.paths) == 4 and len(set(sub.paths)) == 4
    for path, image, label in zip(sub.paths, sub.x, sub.labels):
        row = train.paths.index(path)
        assert torch.equal(image, train.x[row]) and label == train.labels[row]
    assert sub.paths == train.subset(4, seed=1).paths  # the same rows for the same seed
    assert train.subset(7) is train and train.subset(0) is train


def test_paths_survive_the_cache(split_tree, tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    first = {split: _load(split_tree, split, cache_dir=cache_dir) for split in ("train", "test")}
    _refuse_decoding(monkeypatch)
    for split, data in first.items():
        again = _load(split_tree, split, cache_dir=cache_dir)
        assert again.paths == data.paths and torch.equal(again.x, data.x)
    archive = _make_tar(split_tree, tmp_path / "t.tar", "w", arcname="data")
    monkeypatch.undo()
    from_tar = _load(archive, "test", cache_dir=cache_dir)
    _refuse_decoding(monkeypatch)
    assert (_load(archive, "test", cache_dir=cache_dir).paths == from_tar.paths
            == ["data/" + p for p in first["test"].paths])


def test_paths_of_skipped_bad_images_are_left_out(bad_tree):
    with pytest.warns(UserWarning, match="skipped 2"):
        data = _load(bad_tree, skip_bad_images=True)
    assert "a/corrupt.png" not in data.paths and "b/truncated.jpg" not in data.paths
    assert data.paths == ["a/000.png", "a/001.png", "a/002.png", "b/000.png", "b/001.png", "b/002.png",
                          "b/good0.jpg", "b/good1.jpg"]


def test_paths_of_built_in_and_paired_sources(split_tree):
    shapes = load_images("shapes:10", "test", size=SIZE)
    assert shapes.paths == ["shapes/test/000000", "shapes/test/000001"]
    assert load_images("sequences:5").paths == [f"sequences/train/{i:06d}" for i in range(5)]
    pairs = split_tree / "pairs.jsonl"
    pairs.write_text('{"image": "train/b/001.png", "caption": "b"}\n{"image": "./train/a/000.png", "caption": "a"}\n')
    assert load_images(pairs, size=SIZE).paths == ["train/b/001.png", "./train/a/000.png"]  # as written


def test_samples_made_by_hand_number_their_rows():
    data = Samples(torch.zeros(3, 3, 4, 4, dtype=torch.uint8), None, [], "toy")
    assert data.paths == ["0", "1", "2"] and data.subset(2, seed=0).paths == ["2", "0"]
    with pytest.raises(ValueError, match="2 paths for 3 rows"):
        Samples(data.x, None, [], "toy", ["a", "b"])


# ---------------------------------------------------------------------------- CIFAR pickles


def _cifar_batch(n: int, seed: int, labels_key: str, classes: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        b"batch_label": b"made in a test",
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        labels_key.encode(): [int(x) for x in rng.integers(0, classes, n)],
    }


def _py2_pickle(pixels: np.ndarray, labels: list[int]) -> bytes:
    """A CIFAR batch laid out as Python 2's cPickle writes it (the real files): protocol 2,
    ``numpy.core`` paths, and Python 2 ``str`` (SHORT_BINSTRING) that loads as bytes."""

    def text(value: bytes) -> bytes:
        return b"U" + bytes([len(value)]) + value

    raw = pixels.tobytes()
    dtype = b"cnumpy\ndtype\n" + text(b"u1") + b"K\x00K\x01\x87R(K\x03" + text(b"|")
    dtype += b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    array = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + text(b"b")
    array += b"\x87R(K\x01M" + struct.pack("<H", len(pixels))
    array += b"M" + struct.pack("<H", 3072) + b"\x86" + dtype
    array += b"\x89T" + struct.pack("<i", len(raw)) + raw + b"tb"
    label_list = b"](" + b"".join(b"K" + bytes([label]) for label in labels) + b"e"
    return b"\x80\x02}(" + text(b"data") + array + text(b"labels") + label_list + b"u."


def _write_pickle(path: Path, obj, protocol=2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj, protocol=protocol))


@pytest.fixture
def cifar10_dir(tmp_path) -> Path:
    folder = tmp_path / "dl" / "cifar-10-batches-py"
    for i in range(1, 6):
        _write_pickle(folder / f"data_batch_{i}", _cifar_batch(4, i, "labels", 10), protocol=5)
    test = _cifar_batch(3, 9, "labels", 10)
    (folder / "test_batch").write_bytes(_py2_pickle(test[b"data"], test[b"labels"]))
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer"]
    names += [b"dog", b"frog", b"horse", b"ship", b"truck"]
    _write_pickle(folder / "batches.meta", {b"label_names": names, b"num_vis": 3072})
    return folder


def test_cifar10_pickle_folder(cifar10_dir):
    train = load_images(str(cifar10_dir), "train")
    test = load_images(str(cifar10_dir.parent), "test")  # the parent works too
    assert train.x.shape == (20, 3, 32, 32) and test.x.shape == (3, 3, 32, 32)
    assert train.classes[0] == "airplane" and len(train.classes) == 10
    first = _cifar_batch(4, 1, "labels", 10)
    assert torch.equal(train.x[:4].flatten(1), torch.from_numpy(first[b"data"]))
    assert train.labels[:4].tolist() == first[b"labels"]
    py2 = _cifar_batch(3, 9, "labels", 10)  # test_batch is a Python 2 style pickle
    assert torch.equal(test.x.flatten(1), torch.from_numpy(py2[b"data"]))
    assert test.labels.tolist() == py2[b"labels"]
    assert load_images(str(cifar10_dir), "test", size=SIZE).x.shape == (3, 3, SIZE, SIZE)


def test_cifar100_pickle_folder(tmp_path):
    folder = tmp_path / "cifar-100-python"
    _write_pickle(folder / "train", _cifar_batch(6, 1, "fine_labels", 100))
    _write_pickle(folder / "test", _cifar_batch(2, 2, "fine_labels", 100))
    names = [f"class{i}".encode() for i in range(100)]
    _write_pickle(folder / "meta", {b"fine_label_names": names, b"coarse_label_names": []})
    test = load_images(str(folder), "test")
    assert test.x.shape == (2, 3, 32, 32) and len(test.classes) == 100
    assert test.labels.tolist() == _cifar_batch(2, 2, "fine_labels", 100)[b"fine_labels"]


def test_official_cifar_tarball(cifar10_dir, tmp_path):
    archive = _make_tar(cifar10_dir, tmp_path / "cifar-10-python.tar.gz", "w:gz",
                        arcname="cifar-10-batches-py")  # fmt: skip
    assert torch.equal(load_images(str(archive)).x, load_images(str(cifar10_dir)).x)


class _Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused(cifar10_dir, tmp_path):
    marker = tmp_path / "pwned"
    batch = _cifar_batch(4, 1, "labels", 10)
    batch[b"extra"] = _Exploit(marker)
    _write_pickle(cifar10_dir / "data_batch_1", batch)
    with pytest.raises(UserError, match="refusing to load .*data_batch_1.*system"):
        load_images(str(cifar10_dir))
    assert not marker.exists()


def test_garbage_pickle_is_a_user_error(cifar10_dir):
    (cifar10_dir / "test_batch").write_bytes(b"\x80\x02garbage")
    with pytest.raises(UserError, match="test_batch"):
        load_images(str(cifar10_dir), "test")


def test_cifar_rows_are_named_by_batch_file_and_row(cifar10_dir, tmp_path):
    train, test = load_images(str(cifar10_dir), "train"), load_images(str(cifar10_dir), "test")
    assert train.paths == [f"data_batch_{b}/{i}" for b in range(1, 6) for i in range(4)]
    assert test.paths == ["test_batch/0", "test_batch/1", "test_batch/2"]
    archive = _make_tar(cifar10_dir, tmp_path / "cifar-10-python.tar.gz", "w:gz", arcname="cifar-10-batches-py")
    assert load_images(str(archive), "test").paths == test.paths


# ---------------------------------------------------------------------------- batches


def test_epoch_permutation_deterministic():
    a = epoch_permutation(100, epoch=3, seed=7)
    assert a.dtype == torch.int64 and sorted(a.tolist()) == list(range(100))
    assert torch.equal(a, epoch_permutation(100, epoch=3, seed=7))
    assert not torch.equal(a, epoch_permutation(100, epoch=4, seed=7))
    assert not torch.equal(a, epoch_permutation(100, epoch=3, seed=8))


def test_batch_indices():
    batches = batch_indices(10, 4, epoch=0, seed=0)
    assert [len(b) for b in batches] == [4, 4]
    kept = batch_indices(10, 4, epoch=0, seed=0, drop_last=False)
    assert [len(b) for b in kept] == [4, 4, 2]
    assert sorted(torch.cat(kept).tolist()) == list(range(10))
    assert torch.equal(torch.cat(batches), torch.cat(kept)[:8])


def test_batch_larger_than_dataset():
    with pytest.raises(UserError, match=r"batch size 64 is larger than the dataset \(10 images\)"):
        batch_indices(10, 64, epoch=0, seed=0)


# ---------------------------------------------------------------------------- shared data


@pytest.mark.slow
@pytest.mark.shared_data
def test_real_cifar10_jpeg_archive(shared_cifar_tar, tmp_path):
    test = load_images(str(shared_cifar_tar), "test", cache_dir=tmp_path)
    assert test.x.shape == (10000, 3, 32, 32) and test.x.dtype == torch.uint8
    assert len(test.classes) == 10 and test.classes[0] == "airplane"
    assert test.labels.bincount().tolist() == [1000] * 10
