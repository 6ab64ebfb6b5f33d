"""``kontrast embed``: every image's frozen features, tied to its file, in four formats."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from kontrast.cli import main
from kontrast.data import load_images
from kontrast.decisions import view_specs
from kontrast.evaluate.features import extract_features
from kontrast.evaluate.run import load_run
from kontrast.outputs.embed import embed
from support.args import TINY


def _folder(root, classes=("cat", "dog"), per_class=12):
    """Class folders only: every 10th image of each class is held out as test."""
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(root / c / f"{i:03d}.png")
    return root


@pytest.fixture(scope="module")
def labelled_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed")
    data = _folder(root / "photos")
    assert main(["train", "--data", str(data), "--epochs", "1", "--batch-size", "8", "--out", str(root / "run"),
                 *TINY]) == 0
    return root / "run", data


def test_rows_are_every_image_in_path_order_with_eval_features(labelled_run):
    run, data = labelled_run
    emb = embed(run)  # default: the run's own source, train and test splits together
    names = sorted(p.relative_to(data).as_posix() for p in data.rglob("*.png"))
    assert emb.paths == names  # all 24 images, in path order
    assert emb.labels == [p.split("/")[0] for p in names]
    cfg, method, _ = load_run(run)
    spec = view_specs(cfg)[0]
    test = load_images(str(data), "test", size=16)  # the held-out images eval scores
    ref = extract_features(method.encoder, test.x, mean=spec.mean, std=spec.std)  # [n_test, dim] fp32, as eval's
    rows = [emb.paths.index(p) for p in test.paths]
    torch.testing.assert_close(emb.features[rows], ref, rtol=1e-5, atol=1e-6)
    if cfg.train.precision == "bf16":  # the run trained in bf16 (a CPU with native bf16): embed still gives fp32
        assert not torch.allclose(emb.features[rows], extract_features(method.encoder, test.x, mean=spec.mean,
                                                                       std=spec.std, precision="bf16"), atol=1e-6)


@pytest.mark.parametrize("name", ["e.npy", "e.pt", "e.parquet", "e.csv"])
def test_each_format_holds_paths_labels_and_features(labelled_run, tmp_path, name, capsys):
    run, _ = labelled_run
    out = tmp_path / name
    assert main(["embed", "--checkpoint", str(run), "--out", str(out), "--no-progress"]) == 0
    assert "wrote 24 embeddings" in capsys.readouterr().out
    emb = embed(run)
    if name.endswith(".npy"):
        features = torch.from_numpy(np.load(out))
        paths = (tmp_path / "e.paths.txt").read_text().splitlines()
        labels = emb.labels
    elif name.endswith(".pt"):
        saved = torch.load(out, weights_only=True)
        features, paths, labels = saved["embeddings"], saved["paths"], saved["labels"]
        assert saved["classes"] == ["cat", "dog"]
    elif name.endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(out)
        features = torch.tensor(table.column("embedding").to_pylist())
        paths, labels = table.column("path").to_pylist(), table.column("label").to_pylist()
        meta = json.loads(table.schema.metadata[b"kontrast"])
        assert meta["dim"] == features.shape[1] and meta["checkpoint"].startswith(str(run))
    else:
        lines = out.read_text().splitlines()
        header = lines[0].split(",")
        assert header[:3] == ["path", "label", "e0"]
        rows = [line.split(",") for line in lines[1:]]
        features = torch.tensor([[float(v) for v in r[2:]] for r in rows])
        paths, labels = [r[0] for r in rows], [r[1] for r in rows]
    assert paths == emb.paths and labels == emb.labels
    torch.testing.assert_close(features, emb.features, rtol=1e-6, atol=1e-6)


def test_unlabelled_folder_embeds_without_labels(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    rng = np.random.default_rng(1)
    for i in range(10):
        Image.fromarray(rng.integers(0, 255, (18, 18, 3), dtype=np.uint8)).save(flat / f"p{i}.jpg")
    assert main(["train", "--data", str(flat), "--epochs", "1", "--batch-size", "4", "--out", str(tmp_path / "run"),
                 *TINY]) == 0
    out = tmp_path / "e.csv"
    assert main(["embed", "--checkpoint", str(tmp_path / "run"), "--out", str(out), "--no-progress"]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].startswith("path,e0,") and [line.split(",")[0] for line in lines[1:]] == [
        f"p{i}.jpg" for i in range(10)]


def test_bad_output_and_existing_file_are_one_line_errors(labelled_run, tmp_path, capsys):
    run, _ = labelled_run
    assert main(["embed", "--checkpoint", str(run), "--out", str(tmp_path / "e.h5")]) == 2
    assert "unknown format '.h5'" in capsys.readouterr().err
    (tmp_path / "e.pt").write_bytes(b"keep me")
    assert main(["embed", "--checkpoint", str(run), "--out", str(tmp_path / "e.pt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "e.pt").read_bytes() == b"keep me"  # nothing lost
    assert main(["embed", "--checkpoint", str(run), "--out", str(tmp_path / "e.pt"), "--overwrite",
                 "--no-progress"]) == 0
    assert not list(tmp_path.glob(".*partial"))
