"""The streaming data path's pieces, on CPU: decode-time crops keyed as the device's, the views' random stream,
the run's batch order (resume, ranks), the Dataset under DataLoader workers, folders and shards, the mode choice."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw
from torch.utils.data import DataLoader

from kontrast.augment import SampleRNG, derive_key, key_tensor, make_views, ops, recipe_views, to_float
from kontrast.augment.views import make_cropped_views
from kontrast.config import Config, DataConfig
from kontrast.data import batch_indices, stream_decode, write_folder_shards, write_shapes_files
from kontrast.data.stream_dataset import RunBatches, StreamViews, ViewCollate, replacement
from kontrast.data.stream_decode import batch_crop_boxes, crop_boxes, decode_views, draft_factor
from kontrast.data.stream_source import open_stream
from kontrast.errors import UserError
from kontrast.train.data_path import choose_mode, choose_workers

CPU = torch.device("cpu")


def _smooth_image(width: int, height: int, fmt: str, quality: int = 95) -> bytes:
    """A smooth RGB picture (gradients and a disc): resampling methods agree on it to within rounding."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], axis=2).astype(np.uint8)
    im = Image.fromarray(rgb)
    ImageDraw.Draw(im).ellipse((width // 4, height // 4, 3 * width // 4, 3 * height // 4), fill=(200, 40, 90))
    buf = io.BytesIO()
    im.save(buf, fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream") / "shapes"
    write_shapes_files(root, 24, size=40, seed=1)  # 24 train + 4 test JPEGs, 10 classes
    return root


def test_cropped_views_draw_what_the_memory_path_draws():
    """Crops made at decode time + the rest of the recipe on the device = the memory path's views, bit for bit,
    when the crop is the identity (full box at the view's size): every later op drew the same uniforms."""
    specs = recipe_views("byol", 16, {"crop_scale": [1.0, 1.0], "crop_ratio": [1.0, 1.0]})  # blur, solarize too
    images = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8)
    ids, key = torch.arange(8) + 5, derive_key("augment", 3, 1)
    memory = make_views(images, specs, SampleRNG(key, ids))
    stream = make_cropped_views([images, images], specs, SampleRNG(key, ids))
    assert all(torch.equal(a, b) for a, b in zip(memory, stream))


def test_decode_time_crop_is_the_box_the_device_draws_on_the_full_image():
    """Sample 7's crop of view v is drawn from (key, 7, v) on the full 48x32 image, as a batch on the device
    draws it; PIL's antialiased resize of that box matches the memory path's resize to within rounding."""
    specs = recipe_views("simclr_cifar", 12)
    key, data = derive_key("augment", 0, 2), _smooth_image(48, 32, "PNG")
    views = decode_views(data, key, 7, specs)
    full = to_float(torch.from_numpy(np.array(Image.open(io.BytesIO(data)))).permute(2, 0, 1)[None])  # [1, 3, 32, 48]
    # sample 7 in some batch, keyed as training keys the device (a 0-d tensor key): its draws are its own
    batch_rng = SampleRNG(key_tensor(key), torch.tensor([3, 7, 11]))
    for v, spec in enumerate(specs):
        boxes = ops.sample_resized_crop(3, 32, 48, spec.crop_scale, spec.crop_ratio, batch_rng.for_view(v))  # [3, 4]
        assert torch.equal(crop_boxes(key, 7, 32, 48, specs)[v], boxes[1])
        device_crop = ops.resized_crop(full, boxes[1:2], spec.size)[0]  # [3, 12, 12] in [0, 1]
        assert views[v].shape == (3, 12, 12) and views[v].dtype == torch.uint8
        assert (to_float(views[v]) - device_crop).abs().mean() < 1.5 / 255  # measured 0.3-0.4; a misplaced box: tens


@pytest.mark.parametrize("recipe", ["simclr_cifar", "swav_multicrop", "amdim_cifar", "clip"])
def test_a_batch_of_boxes_is_each_samples_own_boxes_bit_for_bit(recipe):
    """The workers draw a batch's boxes in one pass; each equals the sample's own (= the device's) draw, for any
    image size, including the central-crop fallback of images far outside the ratio range (1 px tall or wide)."""
    g = torch.Generator().manual_seed(0)
    specs = recipe_views(recipe, 32)
    samples = torch.randint(0, 10**6, (48,), generator=g)
    heights, widths = torch.randint(1, 3000, (48,), generator=g), torch.randint(1, 3000, (48,), generator=g)
    heights[:4], widths[4:8] = 1, 2
    key = derive_key("augment", 5, 1)
    batch = batch_crop_boxes(key, samples, heights, widths, specs)  # [48, V, 4]
    for b in range(48):
        assert torch.equal(batch[b], crop_boxes(key, int(samples[b]), int(heights[b]), int(widths[b]), specs))


def test_jpeg_draft_mode_decodes_small_crops_at_reduced_scale_with_the_same_picture(monkeypatch):
    specs = recipe_views("simclr_cifar", 16)
    data, key = _smooth_image(256, 256, "JPEG"), derive_key("augment", 0, 0)
    factors = [draft_factor(crop_boxes(key, i, 256, 256, specs), specs) for i in range(8)]
    assert max(factors) >= 4  # most crops of a 256-px image to 16 px decode at 1/4 or 1/8 scale
    drafted = [decode_views(data, key, i, specs) for i in range(8)]
    monkeypatch.setattr(stream_decode, "MAX_DRAFT", 1)  # full-scale decode
    full = [decode_views(data, key, i, specs) for i in range(8)]
    for a, b in zip(drafted, full):
        for va, vb in zip(a, b):
            assert (va.float() - vb.float()).abs().mean() < 1.5  # grey levels of 255 (measured 0.2-0.6)


def test_full_scale_jpegs_decode_through_torchvision_io_as_pil_would():
    """A JPEG no crop lets draft mode shrink is decoded by torchvision.io (measured faster at full scale); its
    crops are PIL's to within rounding. Other formats stay with PIL."""
    data, key, specs = _smooth_image(64, 48, "JPEG"), derive_key("augment", 0, 0), recipe_views("simclr_cifar", 32)
    boxes = crop_boxes(key, 3, 48, 64, specs)
    assert draft_factor(boxes, specs) == 1
    crops = stream_decode.decode_crops(data, boxes, specs)
    assert all(torch.equal(a, b) for a, b in zip(crops, stream_decode._full_scale_crops(data, boxes, specs)))
    with Image.open(io.BytesIO(data)) as im:
        pil = [stream_decode._crop(im.convert("RGB"), box, 1.0, 1.0, s.size) for box, s in zip(boxes.tolist(), specs)]
    assert all((a.float() - b.float()).abs().mean() < 1.0 for a, b in zip(crops, pil))  # grey levels of 255
    png = _smooth_image(64, 48, "PNG")
    with Image.open(io.BytesIO(png)) as im:
        pil = [stream_decode._crop(im.convert("RGB"), box, 1.0, 1.0, s.size) for box, s in zip(boxes.tolist(), specs)]
    assert all(torch.equal(a, b) for a, b in zip(stream_decode.decode_crops(png, boxes, specs), pil))


def test_bad_bytes_come_back_as_a_reason_not_an_exception():
    good = bytearray(_smooth_image(40, 40, "PNG"))
    at = good.find(b"IDAT")
    good[at + 20:at + 60] = bytes(b ^ 0x5A for b in good[at + 20:at + 60])  # garbled pixels, header intact
    specs = recipe_views("simclr_cifar", 8)
    assert decode_views(bytes(good), 1, 0, specs) == "OSError: broken data stream when reading image file"
    assert decode_views(b"", 1, 0, specs) == "empty file (0 bytes)"
    assert decode_views(b"not an image", 1, 0, specs) == "not a recognised image format"


def test_run_batches_follow_the_memory_order_from_any_step_and_split_by_rank():
    n, b, seed = 40, 8, 3
    everything = [[(e, s) for s in idx.tolist()] for e in range(2) for idx in batch_indices(n, b, e, seed)]
    assert list(RunBatches(n, b, seed, 2)) == everything and len(RunBatches(n, b, seed, 2)) == 10
    assert list(RunBatches(n, b, seed, 2, start=7)) == everything[7:]  # mid-epoch 2: its remaining steps
    ranks = [list(RunBatches(n, b, seed, 2, start=3, rank=r, world=2)) for r in range(2)]
    assert [r0 + r1 for r0, r1 in zip(*ranks)] == everything[3:]  # each rank only its own half
    assert all(len(batch) == 4 for batch in ranks[0])


def test_a_bad_samples_stand_in_is_a_pure_function_and_never_itself():
    picks = [replacement(0, 1, 5, attempt, 10) for attempt in range(50)]
    assert picks == [replacement(0, 1, 5, attempt, 10) for attempt in range(50)]
    assert 5 not in picks and set(picks) <= set(range(10)) and len(set(picks)) > 3


def test_batches_are_the_same_with_any_number_of_workers(folder):
    source = open_stream(folder)
    specs = recipe_views("simclr_cifar", 16)
    runs = []
    for workers in (0, 2):
        loader = DataLoader(StreamViews(source, specs, seed=4), batch_sampler=RunBatches(len(source), 8, 4, 2, start=1),
                            num_workers=workers, collate_fn=ViewCollate(specs))
        runs.append(list(loader))
    assert len(runs[0]) == 5
    for a, b in zip(*runs):
        assert torch.equal(a.indices, b.indices) and all(torch.equal(x, y) for x, y in zip(a.views, b.views))
        assert a.views[0].shape == (8, 3, 16, 16) and not torch.equal(a.views[0], a.views[1])


def test_a_folder_and_its_shards_stream_the_same_samples(folder, tmp_path):
    write_folder_shards(folder, tmp_path / "shards", per_shard=10)
    from_folder, from_shards = open_stream(folder), open_stream(tmp_path / "shards")
    pattern = open_stream(str(tmp_path / "shards" / "train-{000000..000002}.tar"))
    assert len(from_folder) == len(from_shards) == len(pattern) == 24
    assert from_folder.paths == from_shards.paths and torch.equal(from_folder.labels, from_shards.labels)
    assert from_folder.classes == from_shards.classes
    assert all(from_folder.read(i) == from_shards.read(i) == pattern.read(i) for i in range(24))
    line = from_folder.summary(16, 2, "data.mode=stream")
    assert line.startswith("data: streaming 24 training images from ") and "labelled, 10 classes" in line
    assert "source 40x40 px, cropped at decode time to 16x16 px in 2 worker(s)" in line
    assert "10 classes; the train shards; source 40x40 px (headers of 24 samples)" in from_shards.summary(16, 2, "")
    assert "; every sample of the shards named; " in pattern.summary(16, 2, "")
    sub = from_shards.subset(10, seed=1)
    assert len(sub) == 10 and sub.paths == from_folder.subset(10, seed=1).paths
    assert sub.read(3) == from_folder.read(from_folder.paths.index(sub.paths[3]))


def test_the_header_pass_names_bad_files_or_leaves_them_out(folder, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    victim = sorted((copy / "train").rglob("*.jpg"))[3]
    victim.write_bytes(victim.read_bytes()[:200])  # cut short: no end-of-image marker
    with pytest.raises(UserError, match=r"1 unreadable image file\(s\) in .*" + victim.name):
        open_stream(copy, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning, match="skipped 1 unreadable"):
        assert len(open_stream(copy, cache_dir=tmp_path / "cache", skip_bad_images=True)) == 23


def test_auto_mode_keeps_memory_while_the_set_fits_its_budget(folder, tmp_path):
    write_folder_shards(folder, tmp_path / "shards", per_shard=10)

    def chosen(source, **data):
        cfg, why = choose_mode(replace(Config(), data=DataConfig(source=str(source), size=16, **data)), CPU)
        return cfg.data.mode, why

    mode, why = chosen(folder)
    assert mode == "memory" and why.startswith("auto: 18.0 KiB decoded at 16 px fits data.memory_budget (0.25 of ")
    assert chosen(folder, memory_budget=1e-12)[0] == "stream"
    assert chosen(tmp_path / "shards")[0] == "memory"
    assert chosen(tmp_path / "shards", memory_budget=1e-12)[0] == "stream"
    assert chosen(tmp_path / "shards", mode="memory") == ("memory", "data.mode=memory")
    assert chosen("shapes:64")[0] == "memory" and chosen("shapes:64", mode="stream")[0] == "stream"
    with pytest.raises(UserError, match="data.mode=stream reads an ImageFolder directory or tar shards"):
        open_stream("shapes:64")


@pytest.mark.parametrize("cores, threads, local, free, workers", [
    (2, 1, 2, 0, 0),    # 2 processes of 1 thread sharing 2 cores: none free
    (1, 1, 2, 0, 0),    # a process bound to its own core (train.bind_cores)
    (2, 2, 1, 0, 0),    # one process of 2 threads on 2 cores
    (2, 1, 1, 1, 1),    # one thread on 2 cores: one core free
    (64, 8, 1, 56, 2),  # many free cores: at most 2 workers
    (16, 4, 2, 8, 2),   # 2 unbound processes of 4 threads on 16 cores
])
def test_auto_decoding_workers_take_only_the_cores_the_training_threads_leave(cores, threads, local, free, workers,
                                                                              monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    cfg, why = choose_workers(replace(Config(), data=DataConfig(source="x")), CPU)
    assert cfg.data.workers == workers and why.startswith(f"auto: {free} of {cores} core(s) free"), why
    set_two = replace(Config(), data=DataConfig(source="x", workers=2))
    assert choose_workers(set_two, CPU) == (set_two, "")  # a set count is kept
    assert choose_workers(replace(Config(), data=DataConfig(source="x")), torch.device("cuda"))[0].data.workers == 2


def test_shards_load_into_memory_as_their_folder_does_and_patterns_stay_absolute(folder, tmp_path, monkeypatch):
    from kontrast.data import load_images
    from kontrast.data.sources import absolute_source

    write_folder_shards(folder, tmp_path / "shards", per_shard=10)
    for split in ("train", "test"):
        a = load_images(folder, split, size=16, cache_dir=tmp_path / "cache")
        b = load_images(tmp_path / "shards", split, size=16, cache_dir=tmp_path / "cache")
        assert torch.equal(a.x, b.x) and torch.equal(a.labels, b.labels) and a.paths == b.paths
    pattern = load_images(str(tmp_path / "shards" / "train-{000000..000002}.tar"), size=16, cache_dir=tmp_path / "c")
    assert torch.equal(pattern.x, load_images(folder, size=16, cache_dir=tmp_path / "cache").x)
    monkeypatch.chdir(tmp_path)
    assert absolute_source("shards/train-{000000..000002}.tar") == f"{tmp_path}/shards/train-{{000000..000002}}.tar"


def test_what_counts_as_shards(folder, tmp_path):
    from kontrast.data.stream_source import is_folder_spec, is_shard_spec

    write_folder_shards(folder, tmp_path / "indexed", per_shard=10)
    loose = tmp_path / "loose"
    loose.mkdir()
    for tar in (tmp_path / "indexed").glob("train-*.tar"):
        (loose / tar.name).write_bytes(tar.read_bytes())
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.png").write_bytes(_smooth_image(8, 8, "PNG"))
    (photos / "old.tar").write_bytes(b"")
    assert is_shard_spec(str(tmp_path / "indexed")) and is_shard_spec(str(loose))
    assert is_shard_spec("x/train-{0..3}.tar") and not is_shard_spec(str(photos)) and not is_shard_spec(str(folder))
    assert is_folder_spec(str(photos)) and is_folder_spec(str(folder)) and not is_folder_spec(str(loose))
    assert len(open_stream(loose)) == 24


@pytest.mark.parametrize("mode", ["L", "CMYK", "P", "I;16", "RGBA"])
def test_any_image_mode_comes_out_as_rgb_crops(mode):
    """Grey, CMYK (JPEG, no draft to RGB), palette, 16-bit and alpha images: 3-channel uint8 crops of the picture
    the memory path's converter (pil_to_rgb_array) makes of them."""
    from kontrast.data.decode import pil_to_rgb_array

    rgb = Image.open(io.BytesIO(_smooth_image(64, 48, "PNG")))
    im = rgb.convert("L").convert("I;16") if mode == "I;16" else rgb.convert(mode)
    buf = io.BytesIO()
    im.save(buf, "JPEG" if mode in ("L", "CMYK") else "PNG", **({"quality": 95} if mode in ("L", "CMYK") else {}))
    data = buf.getvalue()
    specs = recipe_views("simclr_cifar", 16)
    key = derive_key("augment", 0, 0)
    views = decode_views(data, key, 3, specs)
    reference = torch.from_numpy(pil_to_rgb_array(Image.open(io.BytesIO(data))).copy()).permute(2, 0, 1)  # [3, 48, 64]
    boxes = crop_boxes(key, 3, 48, 64, specs)
    for view, box in zip(views, boxes):
        assert view.shape == (3, 16, 16) and view.dtype == torch.uint8
        expected = ops.resized_crop(to_float(reference[None]), box[None], 16)[0]
        assert (to_float(view) - expected).abs().mean() < 2 / 255
        if mode in ("L", "I;16"):
            assert torch.equal(view[0], view[1]) and torch.equal(view[1], view[2])
