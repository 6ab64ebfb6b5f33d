"""``kontrast embed``: frozen encoder features of every image of a source, each row tied to its file.

The features are the ones ``kontrast eval`` scores (:func:`kontrast.evaluate.features.extract_features`:
the pooled encoder output, eval-mode BatchNorm, the recipe's normalisation, the run's precision), so a
user's own kNN or clustering on the file sees what kontrast measured. Rows come in the source's path
order (sorted), whatever the split layout, and the file format follows the output's extension:

==========  ==================================================================================
``.npy``    float32 ``[N, dim]``; the paths, one per line, in ``<name>.paths.txt`` beside it
``.pt``     ``torch.save`` of ``{"embeddings", "paths", "labels", "classes", "source", "checkpoint"}``
``.parquet`` one row per image: ``path``, ``label`` (class name; only for labelled sources), ``embedding``
            (a fixed-size list of float32); the run and source in the schema metadata
``.csv``    ``path,label,e0,...,e{dim-1}`` (``label`` only for labelled sources)
==========  ==================================================================================
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from kontrast.data import load_images
from kontrast.errors import UserError
from kontrast.evaluate.features import extract_features
from kontrast.evaluate.run import load_run, run_views

FORMATS = (".npy", ".pt", ".parquet", ".csv")


@dataclass
class Embeddings:
    """Features of a source's images, one row per file."""

    features: torch.Tensor  # float32 [N, dim]
    paths: list[str]  # each row's file, relative to the source root
    labels: list[str] | None  # each row's class name; None for unlabelled sources
    source: str
    checkpoint: str


def embed(run: str | Path, data: str | None = None, *, split: str = "all", batch_size: int = 512,
          device: str = "cpu", progress: bool = False, precision: str = "fp32") -> Embeddings:
    """Frozen features of every image of ``data`` (default: the run's training source) under the run's encoder.

    ``run``: a run directory (its newest checkpoint) or one checkpoint folder. ``precision``: fp32 by default
    whatever the run trained in, so the features do not depend on the machine (``bf16``, ``auto`` on request).
    """
    if split not in ("all", "train", "test"):
        raise UserError(f"unknown split {split!r}; use all, train or test")
    if batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {batch_size}")
    cfg, method, ckpt = load_run(run)
    source = data or cfg.data.source
    samples = load_images(source, split, size=cfg.data.size, cache_dir=cfg.data.cache_dir,
                        skip_bad_images=cfg.data.skip_bad_images)
    specs = run_views(ckpt, cfg, method)  # the recipe's normalisation (none for sequences)
    mean, std = (specs[0].mean, specs[0].std) if specs else (None, None)
    encoder = method.encoder.to(device)
    chunks = []
    for start in tqdm(range(0, len(samples), batch_size), disable=not progress, unit="batch", desc="embed"):
        chunks.append(extract_features(encoder, samples.x[start:start + batch_size], mean=mean, std=std,
                                       batch_size=batch_size, device=device, precision=precision))
    labels = [samples.classes[i] for i in samples.labels.tolist()] if samples.labels is not None else None
    return Embeddings(torch.cat(chunks), samples.paths, labels, str(source), str(ckpt))


def output_files(out: str | Path, *, overwrite: bool = False) -> list[Path]:
    """The files ``out`` names (``.npy`` adds ``.paths.txt``); a one-line error for an unknown format or a
    file that exists without ``overwrite``. Checked before any work."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in FORMATS:
        raise UserError(f"--out {out}: unknown format {suffix or '(no extension)'!r}; "
                        f"end the name with one of {', '.join(FORMATS)}")
    targets = [out, out.with_suffix(".paths.txt")] if suffix == ".npy" else [out]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not overwrite:
        raise UserError(f"{existing[0]} exists; pass --overwrite to replace it, or choose another --out")
    return targets


def write_embeddings(emb: Embeddings, out: str | Path, *, overwrite: bool = False) -> list[str]:
    """Write ``emb`` in the format of ``out``'s extension; return the files written.

    Each file is written beside its final name and renamed into place, so an interrupted write leaves
    no half file under the final name.
    """
    targets = output_files(out, overwrite=overwrite)
    targets[0].parent.mkdir(parents=True, exist_ok=True)
    writer = {".npy": _write_npy, ".pt": _write_pt, ".parquet": _write_parquet, ".csv": _write_csv}
    temps = [t.with_name(f".{t.name}.partial") for t in targets]
    try:
        writer[targets[0].suffix.lower()](emb, *temps)
        for temp, target in zip(temps, targets):
            os.replace(temp, target)
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)
    return [str(t) for t in targets]


def _write_npy(emb: Embeddings, path: Path, paths_file: Path) -> None:
    import numpy as np

    with open(path, "wb") as f:
        np.save(f, emb.features.numpy())
    paths_file.write_text("".join(f"{p}\n" for p in emb.paths))


def _write_pt(emb: Embeddings, path: Path) -> None:
    classes = sorted(set(emb.labels)) if emb.labels is not None else []
    torch.save({"embeddings": emb.features, "paths": emb.paths, "labels": emb.labels, "classes": classes,
                "source": emb.source, "checkpoint": emb.checkpoint}, path)


def _write_parquet(emb: Embeddings, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    dim = emb.features.shape[1]
    flat = pa.array(emb.features.reshape(-1).numpy(), type=pa.float32())  # [N·dim]
    columns = {"path": pa.array(emb.paths, type=pa.string())}
    if emb.labels is not None:
        columns["label"] = pa.array(emb.labels, type=pa.string())
    columns["embedding"] = pa.FixedSizeListArray.from_arrays(flat, dim)
    meta = {"kontrast": json.dumps({"source": emb.source, "checkpoint": emb.checkpoint, "dim": dim})}
    pq.write_table(pa.table(columns).replace_schema_metadata(meta), path)


def _write_csv(emb: Embeddings, path: Path) -> None:
    dim = emb.features.shape[1]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", *(["label"] if emb.labels is not None else []), *(f"e{i}" for i in range(dim))])
        for i, row in enumerate(emb.features.tolist()):
            writer.writerow([emb.paths[i], *([emb.labels[i]] if emb.labels is not None else []),
                             *(f"{v:.7g}" for v in row)])


def embed_run(run: str | Path, data: str | None, out: str | Path, *, split: str = "all", batch_size: int = 512,
              device: str = "cpu", overwrite: bool = False, progress: bool = True, precision: str = "fp32") -> dict:
    """``kontrast embed``: :func:`embed`, then :func:`write_embeddings`; what was written."""
    created = not Path(out).expanduser().parent.exists()
    output_files(out, overwrite=overwrite)  # a bad --out fails before any work
    emb = embed(run, data, split=split, batch_size=batch_size, device=device, progress=progress, precision=precision)
    files = write_embeddings(emb, out, overwrite=overwrite)
    return {"rows": len(emb.paths), "dim": int(emb.features.shape[1]), "files": files, "source": emb.source,
            "checkpoint": emb.checkpoint, "labelled": emb.labels is not None,
            "created": str(Path(out).expanduser().parent) if created else None}
