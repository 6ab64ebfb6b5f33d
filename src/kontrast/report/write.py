"""``write_report``: a run directory -> one self-contained HTML page about the run.

Sections: summary (checkpoint, step, method, final metrics, logged warnings), training curves,
a 2-D map of the frozen encoder's features, nearest neighbours of a few query images, the
recipe's augmented views, and the resolved config. A sequence method (CPC v1) gets the map
but no neighbour images or views, with a note saying why; when the run's data cannot be
loaded any more (moved, deleted) the page says so instead of the image sections.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from kontrast.config import Config, to_dict
from kontrast.data import Samples
from kontrast.errors import UserError
from kontrast.evaluate.features import extract_features
from kontrast.evaluate.run import load_run, run_views
from kontrast.report import figures, page
from kontrast.report.embedding import caption_of, nearest_neighbours, preview_views, project_2d, report_samples
from kontrast.report.metrics import final_metrics, read_json, read_metrics, warnings_of

NUM_QUERIES, NUM_NEIGHBOURS, NUM_PREVIEWS = 6, 5, 4
Section = tuple[str, str, str]  # (anchor, title, body html)


def write_report(run: str | Path, out: str | Path | None = None, *, device: str = "cpu", limit: int = 2000,
                 seed: int = 0) -> Path:
    """Write the HTML report of ``run`` (a run directory, or one checkpoint folder of it) and return its path.

    ``out`` defaults to ``RUN/report.html``. The map, neighbours and views use a fixed random
    subset (``seed``) of at most ``limit`` images of the run's data: the test split when the
    source has one, else train. Features are extracted on ``device``. Raises :class:`UserError`
    for a path that is not a run (or has no checkpoint) and for ``limit < 2``.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 2:
        raise UserError(f"report needs --limit >= 2 images, got {limit!r}")
    cfg, method, ckpt = load_run(run)
    run_dir = ckpt.parent.parent
    out = Path(out) if out is not None else run_dir / "report.html"
    if out.is_dir():
        raise UserError(f"report output {out} is a folder; pass a file name such as {out / 'report.html'}")
    records = read_metrics(run_dir / "metrics.jsonl")
    state = read_json(ckpt / "state.json") or {}
    sections = [summary_section(cfg, run_dir, ckpt, state, records), curves_section(records)]
    sections += image_sections(cfg, method, run_views(ckpt, cfg, method), device=device, limit=limit, seed=seed)
    sections.append(("config", "Configuration", page.code_block(yaml.safe_dump(to_dict(cfg), sort_keys=False))))
    subtitle = (f"{cfg.method.name} \u00b7 {cfg.encoder.name} width {cfg.encoder.width} \u00b7 {cfg.data.source} "
                f"\u00b7 {cfg.data.size} px \u00b7 checkpoint {ckpt.name}")
    text = page.render_page(f"kontrast report: {run_dir.name}", subtitle, sections)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out


def summary_section(cfg: Config, run_dir: Path, ckpt: Path, state: dict, records: list[dict]) -> Section:
    """What was run, how far it got, and how it ended (``summary.json``, the log's last values, warnings)."""
    rows = [("run directory", run_dir.resolve()), ("checkpoint", ckpt.name), ("step", state.get("step", "?")),
            ("epoch", state.get("epoch", "?")), ("method", cfg.method.name),
            ("encoder", f"{cfg.encoder.name} (width {cfg.encoder.width})"),
            ("data", f"{cfg.data.source} at {cfg.data.size} px"), ("batch size", cfg.train.batch_size)]
    summary = read_json(run_dir / "summary.json")
    parts = []
    if summary is None:
        parts.append(page.note("summary.json is missing: the run has not finished (or was interrupted)."))
    else:
        rows += [(f"summary: {k}", v) for k, v in summary.items() if k != "method"]
    rows += [(f"last logged {k}", v) for k, v in final_metrics(records).items()]
    parts.insert(0, page.table(rows))
    warnings = warnings_of(records)
    if warnings:
        parts.append(page.paragraph(f"{len(warnings)} warning(s) in the metric log:"))
        parts.append(page.bullet_list(warnings, cls="warnings"))
    return "summary", "Summary", "\n".join(parts)


def curves_section(records: list[dict]) -> Section:
    png = figures.curves_png(records)
    if png is None:
        body = page.note("metrics.jsonl is missing or holds no loss, lr, kNN, embedding std or MI-bound values.")
    else:
        body = page.figure(png, "training curves against step",
                           "Logged every train.log_every steps; kNN top-1 appears when train.knn_every > 0. "
                           "The MI bound is the InfoNCE lower bound log N \u2212 L (nats); it cannot exceed log N.")
    return "curves", "Training curves", body


def image_sections(cfg: Config, method, specs: tuple, *, device: str, limit: int, seed: int) -> list[Section]:
    """The embedding map, then (for image methods) nearest neighbours and the recipe's views."""
    try:
        data, split = report_samples(cfg, limit, seed)
    except UserError as exc:
        return [("embedding", "Embedding map", page.note(
            f"The run's data could not be loaded, so there is no embedding map, neighbours or view preview: {exc}"))]
    mean, std = (specs[0].mean, specs[0].std) if specs else (None, None)
    features = extract_features(method.encoder.to(device), data.x, mean=mean, std=std, device=device,
                                precision=cfg.train.precision)  # [N, dim] on CPU
    sections = [map_section(features, data, f"{split} {'sequences' if not specs else 'images'} of {cfg.data.source}",
                            seed)]
    if not specs:
        sections.append(("views", "Neighbours and views", page.note(
            f"{cfg.method.name} trains on sequences, not images: there are no images to show as nearest "
            "neighbours and no augmentation recipe to preview.")))
        return sections
    sections.append(neighbours_section(features, data))
    sections.append(views_section(cfg, method, data, specs, seed))
    return sections


def map_section(features, data: Samples, what: str, seed: int) -> Section:
    """``what``: the rows in words, e.g. "test images of shapes"."""
    points, projection = project_2d(features, seed)
    what = f"{len(data)} {what}"
    png = figures.map_png(points, data.labels, data.classes, f"{projection} of frozen encoder features: {what}",
                          axis_name="PC" if projection == "PCA" else projection)
    caption = (f"{projection} of the encoder's {features.shape[1]}-dimensional features (the backbone's output, "
               f"no projection head) of a fixed random subset: {what}.")
    if projection == "PCA":
        caption += " UMAP is used when the optional umap-learn package is installed."
    if data.labels is None:
        caption += " The data is unlabelled, so the points are not coloured by class."
    return "embedding", "Embedding map", page.figure(png, f"{projection} map of encoder features", caption)


def neighbours_section(features, data: Samples) -> Section:
    queries = list(range(min(NUM_QUERIES, len(data))))
    indices, sims = nearest_neighbours(features, queries, NUM_NEIGHBOURS)
    if indices.shape[1] == 0:
        return "neighbours", "Nearest neighbours", page.note("Too few images for nearest neighbours.")
    captions = [caption_of(data, i) for i in range(len(data))]
    png = figures.neighbours_png(data.x, captions, queries, indices, sims, data.labels)
    caption = (f"Each row: a query image (blue frame), then its {indices.shape[1]} nearest neighbours by cosine "
               f"similarity of the encoder features among the same {len(data)} images.")
    if data.labels is not None:
        caption += " Green: same class as the query; red: another class."
    return "neighbours", "Nearest neighbours", page.figure(png, "query images and their nearest neighbours", caption)


def views_section(cfg: Config, method, data: Samples, specs: tuple, seed: int) -> Section:
    images = data.x[:NUM_PREVIEWS]
    views = preview_views(images, specs, seed)
    recipe = cfg.augment.recipe or method.recipe
    caption = (f"Recipe {recipe!r} ({len(specs)} view spec(s)) applied to {len(images)} images, as training "
               "draws views; the normalisation is undone for display.")
    if len(specs) == 1:
        caption += " The recipe makes one view per image; two draws are shown."
    return "views", "Augmentation views", page.figure(figures.views_png(images, views),
                                                      "augmented views of a few images", caption)
