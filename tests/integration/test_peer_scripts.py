"""The peer-parity scripts (benchmarks/parity.py, benchmarks/peer/): both sides take the same images, score with
the same kNN, and every setting of kontrast's resolved config reaches the peer (or the driver refuses).

The lightly side itself runs in its own venv (benchmarks/setup_peer.sh); its plain-torch helpers
(benchmarks/peer/peer_common.py) are tested here against kontrast's own code.
"""

import dataclasses
import importlib.util
import json
import shlex
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from kontrast.augment import ViewSpec, color, recipe_views
from kontrast.data import load_images
from kontrast.evaluate.knn import knn_top1 as kontrast_knn_top1
from support import ROOT

METHODS = ("simclr", "moco_v2", "byol", "swav", "simsiam")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


parity = _load("parity", ROOT / "benchmarks/parity.py")  # puts benchmarks/peer on sys.path
import peer_common  # noqa: E402


def _image_folder(root: Path) -> Path:
    """train/ and test/ with class names whose folder order differs from their path order ('a' < 'a-b' as
    names, but 'a-b/' < 'a/' as paths)."""
    gen = torch.Generator().manual_seed(0)
    for split, count in (("train", 9), ("test", 3)):
        for cls in ("a", "a-b", "c"):
            (root / split / cls).mkdir(parents=True)
            for i in range(count):
                pixels = torch.randint(0, 256, (8, 8, 3), generator=gen, dtype=torch.uint8).numpy()
                Image.fromarray(pixels).save(root / split / cls / f"{i:02d}.png")
    return root


@pytest.mark.parametrize("limit,seed", [(10, 0), (10, 3), (0, 0)])
def test_peer_takes_the_images_kontrast_takes(tmp_path, limit, seed):
    import torchvision

    root = _image_folder(tmp_path / "data")
    ours = load_images(str(root), "train", size=8, cache_dir=tmp_path / "cache").subset(limit, seed=seed)
    folder = torchvision.datasets.ImageFolder(root / "train")
    rows, paths = peer_common.chosen_images(folder.samples, folder.root, limit, seed)
    assert paths == ours.paths
    assert [folder.samples[i][1] for i in rows] == ours.labels.tolist()  # same labels too
    assert peer_common.paths_digest(paths) == peer_common.paths_digest(ours.paths)


@pytest.mark.parametrize("sigma", [0.1, 0.5, 1.0, 2.0])
def test_blur_handed_to_lightly_has_kontrast_kernels_spread(sigma):
    """The sigma the peer gives lightly's (untruncated) blur is the std of kontrast's 3-tap kernel."""
    impulse = torch.zeros(1, 1, 9, 9)
    impulse[0, 0, 4, 4] = 1.0
    out = color.gaussian_blur(impulse, torch.tensor([sigma]), 3, torch.tensor([True]))[0, 0, 4]  # one row
    offsets = torch.arange(9.0) - 4
    spread = float(((out / out.sum()) * offsets**2).sum().sqrt())
    assert peer_common.effective_blur_std(sigma, 3) == pytest.approx(spread, abs=1e-5)


def test_peer_knn_is_kontrasts_knn():
    gen = torch.Generator().manual_seed(1)
    bank, test = torch.randn(500, 16, generator=gen), torch.randn(120, 16, generator=gen)
    y_bank, y_test = torch.randint(0, 10, (500,), generator=gen), torch.randint(0, 10, (120,), generator=gen)
    ours = kontrast_knn_top1(bank, y_bank, test, y_test, k=50, temperature=0.1, num_classes=10)
    peer = peer_common.knn_top1(bank, y_bank, test, y_test, k=50, temperature=0.1, num_classes=10, chunk=37)
    assert peer == pytest.approx(ours)


def test_view_defaults_cover_every_viewspec_field():
    """A new ViewSpec field must be taught to the peer (VIEW_DEFAULTS and lightly_ssl.py)."""
    assert set(dataclasses.asdict(ViewSpec())) == set(peer_common.VIEW_DEFAULTS)


def _flag_value(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


@pytest.mark.parametrize("method", METHODS)
def test_every_setting_of_kontrasts_config_reaches_the_peer(method):
    """No field of the resolved config is left behind; the key values and the views arrive as they are."""
    args = parity.build_parser().parse_args(["--method", method, "--data", "data/cifar10", "--threads", "2"])
    cfg = parity.resolved(args)
    flags, diffs, unknown = parity.peer_settings(cfg, args)
    assert unknown == [], f"extend benchmarks/parity.py and benchmarks/peer/lightly_ssl.py for: {unknown}"
    assert float(_flag_value(flags, "--lr")) == cfg.optim.lr
    assert float(_flag_value(flags, "--weight-decay")) == cfg.optim.weight_decay
    assert float(_flag_value(flags, "--warmup-epochs")) == cfg.optim.warmup_epochs
    assert _flag_value(flags, "--optim") == cfg.optim.name
    assert int(_flag_value(flags, "--train-limit")) == 20000 and int(_flag_value(flags, "--batch")) == 256
    views = [peer_common.full_view(v) for v in json.loads(_flag_value(flags, "--views"))]
    recipe = recipe_views(cfg.augment.recipe or {"simclr": "simclr_cifar", "simsiam": "simsiam_cifar",
                                                  "swav": "swav_multicrop"}.get(method, method), cfg.data.size)
    assert len(views) == len(recipe)
    for got, spec in zip(views, recipe):
        want = json.loads(json.dumps(dataclasses.asdict(spec)))
        assert {k: v for k, v in got.items() if k != "size_factor"} == \
            {k: v for k, v in want.items() if k != "size_factor"}
    if cfg.optim.name == "lars" and cfg.optim.lars_clip:
        assert "--kontrast-lars-clip" in flags and any("LARS" in d for d in diffs)


def test_a_setting_the_peer_cannot_take_stops_the_driver(tmp_path):
    argv = ["--method", "simclr", "--set", "augment.view.translate_p=0.5", "--set", "augment.view.translate=2",
            "--results", str(tmp_path / "r.jsonl")]
    args = parity.build_parser().parse_args(argv)
    _, _, unknown = parity.peer_settings(parity.resolved(args), args)
    assert any("translate_p=0.5" in u for u in unknown)
    with pytest.raises(SystemExit, match="cannot pass to the peer"):
        parity.run_pair(args)
    ramp = parity.build_parser().parse_args(["--method", "simclr", "--set", "augment.min_size=16"])
    assert parity.peer_settings(parity.resolved(ramp), ramp)[2] == [
        "augment.min_size=16 (the peer trains at data.size throughout)"]


def test_table_and_doc_section(tmp_path):
    def row(seed, ours, peer):
        return {"method": "simclr", "seed": seed, "epochs": 5, "train_limit": 20000, "width": 0.25, "batch": 256,
                "set": [], "commit": "abc", "date": "d", "same_images": True, "gap": round(ours - peer, 4),
                "differences": ["x differs"],
                "kontrast": {"knn_top1": ours, "img_per_s": 900.0, "command": "kontrast train ..."},
                "peer": {"knn_top1": peer, "img_per_s": 200.0, "command": "peer ..."}}

    text = parity.table([row(0, 0.46, 0.455), row(1, 0.47, 0.462)])
    assert "| `simclr` | 20,000 × 5 | 0 / 1 | 0.4600 / 0.4700 | 0.4550 / 0.4620 | +0.0065 |" in text
    assert "- simclr: x differs" in text and "kontrast train ..." in text
    doc = tmp_path / "results.md"
    doc.write_text(f"intro\n{parity.BEGIN}\nold\n{parity.END}\nafter\n")
    parity.write_doc(doc, text)
    assert (doc.read_text().startswith("intro\n") and "old" not in doc.read_text()
            and doc.read_text().endswith("after\n"))


def test_reuse_peer_takes_an_earlier_run_of_the_same_peer_command_and_its_notes(tmp_path):
    def args(*extra):
        return parity.build_parser().parse_args(["--method", "swav", "--threads", "2", *extra])

    def peer_cmd(a):
        flags, diffs, _ = parity.peer_settings(parity.resolved(a), a)
        return ["python", parity.PEER_SCRIPT, *flags], diffs

    clipped, clipped_diffs = peer_cmd(args())  # kontrast's clipped LARS: only a note-only flag more for the peer
    assert "--kontrast-lars-clip" in clipped
    peer_note = "blur: something only the peer script prints"
    old = {"method": "swav", "seed": 0, "epochs": 5, "train_limit": 20000, "width": 0.25, "batch": 256, "threads": 2,
           "set": [], "commit": "abc", "date": "d", "differences": clipped_diffs + [peer_note],
           "peer": {"knn_top1": 0.3, "img_per_s": 100.0, "command": shlex.join(clipped)}}
    matched, _ = peer_cmd(args("--set", "optim.lars_clip=false", "--set", "encoder.torch_init=true"))
    found, notes = parity.earlier_peer([old], matched)
    assert found is old and notes == [peer_note]  # the LARS and init notes were kontrast's config's, not the peer's
    assert parity.earlier_peer([old], peer_cmd(args("--seed", "1"))[0]) is None
    assert parity.earlier_peer([old], peer_cmd(args("--set", "method.temperature=0.2"))[0]) is None
