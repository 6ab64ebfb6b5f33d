"""``write_report``: a run directory -> one self-contained HTML page about the run.

Sections: summary (checkpoint, step, method, final metrics, logged warnings), training curves,
a 2-D map of the frozen encoder's features, nearest neighbours of a few query images, the
recipe's augmented views, and the resolved config. A sequence method (CPC v1) gets the map
but no neighbour images or views, with a note saying why; when the run's data cannot be
loaded any more (moved, deleted) the page says so instead of the image sections.
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from kontrast.checkpoint import read_run_config
from kontrast.config import Config, to_dict
from kontrast.data import Samples
from kontrast.decisions import decide
from kontrast.errors import UserError
from kontrast.evaluate.features import extract_features
from kontrast.evaluate.run import EVAL_FILE, load_run, run_views
from kontrast.report import figures, page
from kontrast.report.embedding import (
    caption_of,
    nearest_neighbours,
    preview_views,
    project_2d,
    report_samples,
    spread_rows,
)
from kontrast.report.metrics import final_metrics, read_json, read_metrics, warnings_of

NUM_QUERIES, NUM_NEIGHBOURS, NUM_PREVIEWS = 6, 5, 4
Section = tuple[str, str, str]  # (anchor, title, body html)


def write_report(run: str | Path, out: str | Path | None = None, *, device: str = "cpu", limit: int = 2000,
                 seed: int = 0, precision: str = "fp32") -> Path:
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
    sections = [summary_section(cfg, run_dir, ckpt, state, records), eval_section(run_dir), curves_section(records)]
    recipe = read_run_config(run_dir)[1].get("recipe") or decide(cfg).recipe
    sections += image_sections(cfg, method, run_views(ckpt, cfg, method), recipe, device=device, limit=limit,
                               seed=seed, precision=precision)
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


def eval_section(run_dir: Path) -> Section:
    """The latest ``kontrast eval`` of the run (``RUN/eval.json``), or how to get one."""
    scores = read_json(run_dir / EVAL_FILE)
    if not scores:
        return "eval", "Evaluation", page.note(f"No evaluation yet: kontrast eval --checkpoint {run_dir} scores the "
                                               "encoder (kNN, linear probe, clustering) and keeps the result here.")
    rows = [(k, v) for k, v in scores.items() if not isinstance(v, (dict, list)) and not k.endswith("_chance")]
    chance = {k[:-len("_chance")]: v for k, v in scores.items() if k.endswith("_chance")}
    body = page.table(rows)
    if chance:
        body += page.paragraph("Each clustering score beside what random assignments with the same cluster sizes "
                               "score on the same split (chance): a score is evidence only above its chance level. "
                               "AMI and ARI are corrected for chance (about 0 at random); NMI and accuracy are not.")
        body += page.table([(k, f"{page.fmt(scores[k])} (chance {page.fmt(v)})") for k, v in chance.items()
                            if k in scores])
    return "eval", "Evaluation", body


def curves_section(records: list[dict]) -> Section:
    png = figures.curves_png(records)
    if png is None:
        body = page.note("metrics.jsonl is missing or holds no loss, lr, kNN, embedding std or MI-bound values.")
    else:
        body = page.figure(png, "training curves against step",
                           "Logged every train.log_every steps (auto: 10, fewer in a short run); "
                           "kNN top-1 appears when train.knn_every > 0. "
                           "The MI bound is the InfoNCE lower bound log N \u2212 L (nats); it cannot exceed log N. "
                           "Below zero it says nothing about the mutual information: the loss is still above log N "
                           "(worse than scoring every candidate alike), so there is no evidence yet, not a negative "
                           "information.")
    return "curves", "Training curves", body


def image_sections(cfg: Config, method, specs: tuple, recipe: str | None, *, device: str, limit: int, seed: int,
                   precision: str = "fp32") -> list[Section]:
    """The embedding map, then (for image methods) nearest neighbours and the recipe's views."""
    try:
        data, is_test = report_samples(cfg, limit, seed)
    except UserError as exc:
        return [("embedding", "Embedding map", page.note(
            f"The run's data could not be loaded, so there is no embedding map, neighbours or view preview: {exc}"))]
    mean, std = (specs[0].mean, specs[0].std) if specs else (None, None)
    features = extract_features(method.encoder.to(device), data.x, mean=mean, std=std, device=device,
                                precision=precision)  # [N, dim] on CPU
    kind = "sequences" if not specs else "images"
    sections = [map_section(features, data, is_test, kind, seed)]
    if not specs:
        sections.append(("views", "Neighbours and views", page.note(
            f"{cfg.method.name} trains on sequences, not images: there are no images to show as nearest "
            "neighbours and no augmentation recipe to preview.")))
        return sections
    spread = spread_rows(features, data.labels, max(NUM_QUERIES, NUM_PREVIEWS))  # across classes or the map
    sections.append(neighbours_section(features, data, spread[:NUM_QUERIES]))
    sections.append(views_section(recipe, data, specs, spread[:NUM_PREVIEWS], seed))
    return sections


def map_section(features, data: Samples, is_test: torch.Tensor, kind: str, seed: int) -> Section:
    """``kind``: "images" or "sequences"; ``is_test``: bool ``[N]``, the rows of the test split (marked apart)."""
    points, projection = project_2d(features, seed)
    n_test = int(is_test.sum())
    what = f"{len(data) - n_test} train" + (f" and {n_test} test" if n_test else "") + f" {kind} of {data.name}"
    png = figures.map_png(points, data.labels, data.classes, f"{projection} of frozen encoder features: {what}",
                          axis_name="PC" if projection == "PCA" else projection, marked=is_test if n_test else None)
    caption = (f"{projection} of the encoder's {features.shape[1]}-dimensional features (the backbone's output, "
               f"no projection head) of a fixed random subset: {what}.")
    if n_test:
        caption += " Training images are dots, held-out test images crosses."
    if projection == "PCA":
        caption += " UMAP is used when the optional umap-learn package is installed."
    if data.labels is None:
        caption += " The data is unlabelled, so the points are not coloured by class."
    return "embedding", "Embedding map", page.figure(png, f"{projection} map of encoder features", caption)


def neighbours_section(features, data: Samples, queries: list[int]) -> Section:
    """``queries``: the rows shown with their neighbours (:func:`spread_rows`: across classes)."""
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


def views_section(recipe: str, data: Samples, specs: tuple, rows: list[int], seed: int) -> Section:
    """``recipe``: the one the run trained with (its plan's); ``rows``: the images shown (across classes)."""
    images = data.x[rows]
    views = preview_views(images, specs, seed)
    caption = (f"Recipe {recipe!r} ({len(specs)} view spec(s)) applied to {len(images)} images, as training "
               "draws views; the normalisation is undone for display.")
    if len(specs) == 1:
        caption += " The recipe makes one view per image; two draws are shown."
    return "views", "Augmentation views", page.figure(figures.views_png(images, views),
                                                      "augmented views of a few images", caption)
