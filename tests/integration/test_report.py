"""``kontrast.report``: the page's pieces, the page of a tiny run, and the page in headless Chromium."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from kontrast.cli import main
from kontrast.errors import UserError
from kontrast.report import write_report
from kontrast.report.embedding import nearest_neighbours, preview_views, project_2d, spread_rows
from kontrast.report.figures import curves_png, map_png
from kontrast.report.metrics import metric_series, read_metrics, warnings_of
from kontrast.report.page import PNG_URI, esc, render_page

TINY = ["--epochs", "1", "--batch-size", "16", "--no-progress", "--set", "encoder.width=0.125",
        "--set", "train.log_every=1"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SECTIONS = ("summary", "curves", "embedding", "neighbours", "views", "config")


def train_tiny(out: Path, *args: str) -> Path:
    assert main(["train", "--out", str(out), *TINY, *args]) == 0
    return out


@pytest.fixture(scope="module")
def tiny_report(tiny_simclr_run, tmp_path_factory) -> Path:
    """A copy of the shared SimCLR run (32 shapes at 16 px, 4 steps, kNN monitor on) and its report at the default
    path."""
    run = tmp_path_factory.mktemp("report") / "run"
    shutil.copytree(tiny_simclr_run, run)
    path = write_report(run, limit=64)
    assert path == run / "report.html"
    return path


def embedded_pngs(text: str) -> list[bytes]:
    """The decoded images of every <img> of a page; each src must be a PNG data URI."""
    sources = re.findall(r"<img\b[^>]*\bsrc=\"([^\"]*)\"", text)
    assert len(sources) == text.count("<img"), "an <img> without a quoted src"
    pngs = []
    for src in sources:
        assert src.startswith(PNG_URI), src[:60]
        pngs.append(base64.b64decode(src[len(PNG_URI):], validate=True))
    return pngs


def assert_self_contained(text: str) -> None:
    assert not re.search(r"https?://", text), "the page references the network"
    assert "<script" not in text and "@import" not in text and "url(" not in text
    for png in embedded_pngs(text):
        assert png.startswith(PNG_MAGIC)
        with Image.open(io.BytesIO(png)) as img:
            assert img.format == "PNG" and min(img.size) > 50


# ---- the pieces ---------------------------------------------------------------------------------------------


def test_metric_log_reading(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 0, "epoch": 0, "knn_top1": 0.1}\n{"step": 1, "loss": 2.0, "lr": 0.1}\n'
                   '{"step": 2, "loss": NaN}\n{"step": 2, "warning": "collapse", "message": "std 0.001"}\n'
                   '{"step": 3, "lo')
    records = read_metrics(log)
    assert len(records) == 4  # the line a crash cut short is skipped
    assert metric_series(records, "loss") == ([1.0], [2.0])  # NaN is not plotted
    assert metric_series(records, "knn_top1") == ([0.0], [0.1])
    assert warnings_of(records) == ["step 2: collapse: std 0.001"]
    assert read_metrics(tmp_path / "absent.jsonl") == []


def test_curves_skip_absent_metrics():
    assert curves_png([]) is None
    assert curves_png([{"step": 1, "img_per_s": 3.0}]) is None
    one = curves_png([{"step": s, "loss": 1.0 / s} for s in range(1, 5)])
    five = curves_png([{"step": s, "loss": 1.0, "lr": 0.1, "knn_top1": 0.5, "embedding_std": 0.1, "mi_bound": 1.0}
                       for s in range(1, 5)])
    widths = [Image.open(io.BytesIO(png)).size[0] for png in (one, five)]
    assert one.startswith(PNG_MAGIC) and widths[0] < widths[1]  # one panel, then a row of three


def test_projection_and_neighbours():
    torch.manual_seed(0)
    features = torch.randn(20, 8)
    points, name = project_2d(features)
    assert points.shape == (20, 2) and name in ("PCA", "UMAP")
    assert project_2d(torch.randn(1, 8))[0].shape == (1, 2)
    features[7] = features[3] * 2  # same direction: cosine 1
    idx, sims = nearest_neighbours(features, [3, 5], k=5)
    assert idx.shape == sims.shape == (2, 5)
    assert int(idx[0, 0]) == 7 and float(sims[0, 0]) == pytest.approx(1.0)
    assert 3 not in idx[0].tolist() and 5 not in idx[1].tolist()  # never one's own neighbour
    assert (sims[:, :-1] >= sims[:, 1:]).all()
    assert nearest_neighbours(features[:3], [0], k=5)[0].shape == (1, 2)  # capped at N - 1


def test_preview_views_undo_normalisation():
    from kontrast.augment import recipe_views

    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    views = preview_views(images, recipe_views("instdisc", 16), seed=0)  # a one-view recipe: drawn twice
    assert len(views) == 2 and all(v.shape == (4, 3, 16, 16) for v in views)
    assert all(0.0 <= float(v.min()) and float(v.max()) <= 1.0 for v in views)
    multicrop = preview_views(images, recipe_views("swav_multicrop", 16), seed=0)
    assert [v.shape[-1] for v in multicrop] == [16, 16, 8, 8, 8, 8]


def test_map_without_labels_and_escaping():
    assert map_png(torch.randn(30, 2), None, [], "unlabelled").startswith(PNG_MAGIC)
    assert map_png(torch.randn(30, 2), torch.arange(30) % 25, [], "25 classes, no legend").startswith(PNG_MAGIC)
    assert esc('<b a="1">&') == "&lt;b a=&quot;1&quot;&gt;&amp;"
    text = render_page("<run>", "x", [("a", "A & B", "<p>body</p>")])
    assert "&lt;run&gt;" in text and "A &amp; B" in text and "<p>body</p>" in text


# ---- whole pages --------------------------------------------------------------------------------------------


def test_report_of_a_tiny_run(tiny_report):
    text = tiny_report.read_text()
    for anchor in SECTIONS:
        assert f'<section id="{anchor}">' in text, anchor
    assert len(embedded_pngs(text)) == 4  # curves, map, neighbours, views
    assert_self_contained(text)
    assert "step-00000004" in text and "knn_top1" in text  # the checkpoint, the final metrics
    assert "name: simclr" in text and "source: shapes:32" in text  # the config as YAML
    assert ("PCA of" in text) != ("UMAP of" in text)  # the projection is named


def test_report_to_another_file_and_from_a_checkpoint(tiny_report, tmp_path):
    ckpt = next((tiny_report.parent / "checkpoints").iterdir())
    out = write_report(ckpt, tmp_path / "sub" / "page.html", limit=8, seed=1)
    assert out == tmp_path / "sub" / "page.html"
    assert_self_contained(out.read_text())


def test_sequence_run_gets_a_page_with_a_note(tmp_path):
    run = train_tiny(tmp_path / "seq", "--method", "cpc", "--data", "sequences:32")
    text = write_report(run, limit=16).read_text()
    assert "trains on sequences, not images" in text
    assert len(embedded_pngs(text)) == 2  # curves and the map; no neighbour images, no views
    assert_self_contained(text)


def test_missing_data_gives_a_page_with_a_note(tiny_report, tmp_path):
    run = tmp_path / "moved"
    shutil.copytree(tiny_report.parent, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["data"]["source"] = str(tmp_path / "gone")
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run / "summary.json").unlink()
    text = write_report(run).read_text()
    assert "could not be loaded" in text and "summary.json is missing" in text
    assert len(embedded_pngs(text)) == 1  # the curves only
    assert_self_contained(text)


@pytest.mark.parametrize("make", ["absent", "empty", "file"])
def test_not_a_run_is_a_one_line_error(tmp_path, make):
    path = tmp_path / "x"
    if make == "empty":
        path.mkdir()
    elif make == "file":
        path.write_text("{}")
    with pytest.raises(UserError) as err:
        write_report(path)
    assert "\n" not in str(err.value)


def test_bad_limit_and_folder_output(tiny_report):
    with pytest.raises(UserError, match="limit"):
        write_report(tiny_report.parent, limit=1)
    with pytest.raises(UserError, match="is a folder"):
        write_report(tiny_report.parent, tiny_report.parent)


# ---- in a browser -------------------------------------------------------------------------------------------


def browser_paths() -> tuple[str, str]:
    """Chromium and chromedriver from the system's packages; skip without them, fail under CI=true."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if binary and driver:
        return binary, driver
    missing = " and ".join(n for n, p in (("chromium", binary), ("chromedriver", driver)) if not p)
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{missing} not found under CI=true; .ci/run should have installed chromium chromium-driver")
    pytest.skip(f"{missing} not found; install chromium and chromium-driver (apt) to run the browser test")


def test_report_in_headless_chromium(tiny_report, tmp_path, monkeypatch):
    binary, driver_path = browser_paths()
    from selenium import webdriver  # the test extra's selenium; only the browser comes from the system
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must never download a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        driver.get(tiny_report.resolve().as_uri())
        images = driver.execute_script(
            "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight]);")
        assert len(images) == 4 and all(done and w > 0 and h > 0 for done, w, h in images), images
        height = driver.execute_script("return document.documentElement.scrollHeight;")
        driver.set_window_size(1280, min(int(height) + 50, 8000))  # the whole page in one screenshot
        shot = tmp_path / "report.png"
        assert driver.save_screenshot(str(shot))
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    finally:
        driver.quit()
    assert not errors, json.dumps(errors, indent=1)
    assert shot.stat().st_size > 10_000
    with Image.open(shot) as img:
        assert img.size[0] >= 1000 and img.size[1] > 1500
        extrema = img.convert("RGB").getextrema()
        assert any(lo != hi for lo, hi in extrema), "the screenshot is one colour"


def test_queries_and_previews_are_spread_over_the_classes_or_the_map():
    labels = torch.tensor([0] * 10 + [1] * 5 + [2] * 2)  # path order: the first class first
    rows = spread_rows(torch.randn(17, 4), labels, 6)
    assert [int(labels[r]) for r in rows] == [0, 1, 2, 0, 1, 2]
    points = torch.tensor([[1.0, 0.0], [0.99, 0.1], [0.0, 1.0], [-1.0, 0.0], [0.98, 0.2]])  # unlabelled
    assert spread_rows(points, None, 3) == [0, 3, 2]  # each the farthest from those taken


def test_the_eval_section_shows_each_clustering_score_beside_its_chance_level(tmp_path):
    """A clustering score means something only against what chance scores on the same split: the report puts them
    side by side and says which scores are corrected for chance."""
    from kontrast.report.write import eval_section

    (tmp_path / "eval.json").write_text(json.dumps({"knn_top1": 0.31, "kmeans_nmi": 0.354, "kmeans_nmi_chance": 0.377,
                                                    "kmeans_ami": 0.01, "kmeans_ami_chance": -0.002}))
    anchor, title, body = eval_section(tmp_path)
    assert (anchor, title) == ("eval", "Evaluation")
    assert "0.354 (chance 0.377)" in body and "0.01 (chance -0.002)" in body
    assert "AMI and ARI are corrected for chance" in body and "kmeans_nmi_chance" not in body
