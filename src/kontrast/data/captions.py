"""Captions made from class names, for CLIP on labelled image data.

Such captions carry exactly the label: a CLIP model trained on them learns from supervised
text, not from free-form descriptions. kontrast says so wherever it makes them (the
``kontrast captions`` command, and a log line when ``--method clip`` trains on a labelled
source without a paired file).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from kontrast.data.cifar import find_cifar_folder
from kontrast.data.layout import list_files, plan_layout
from kontrast.errors import UserError

# Varied phrasings (a subset in the spirit of CLIP's ImageNet prompt ensemble,
# Radford et al. 2021, https://arxiv.org/abs/2103.00020, section 3.1.4); also the zero-shot prompts.
TEMPLATES = (
    "a photo of a {}.",
    "a blurry photo of a {}.",
    "a close-up photo of the {}.",
    "a low resolution photo of a {}.",
    "a picture of a {}.",
    "an image of the {}.",
    "a cropped photo of a {}.",
    "a bright photo of a {}.",
    "a dark photo of the {}.",
    "a small {} in the picture.",
)


def class_text(name: str) -> str:
    """A class folder name as words: ``"pickup_truck"`` -> ``"pickup truck"``."""
    return " ".join(name.replace("_", " ").replace("-", " ").split())


def captions_from_labels(labels: torch.Tensor, classes: list[str], seed: int = 0) -> list[str]:
    """One caption per label: its class name in a template drawn per sample (fixed by ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    which = torch.randint(len(TEMPLATES), (len(labels),), generator=g).tolist()
    return [TEMPLATES[t].format(class_text(classes[y])) for t, y in zip(which, labels.tolist())]


def captions_for(data, seed: int = 0) -> tuple[list[str], str]:
    """The captions of a ``Samples``: its own, else made from its labels; and a one-line note saying which."""
    if data.captions is not None:
        return data.captions, f"{len(data.captions)} captions from {data.name}"
    if data.labels is not None and data.classes:
        return captions_from_labels(data.labels, data.classes, seed), (
            f"{data.name} has no captions; made them from its {len(data.classes)} class names "
            "in varied templates, so the text is the label (supervised)")
    raise UserError(f"{data.name} has neither captions nor labels; pass a paired .jsonl/.csv "
                    "(see `kontrast captions`) or a labelled source")


def write_captions(data: str | os.PathLike, out: str | os.PathLike, seed: int = 0) -> dict:
    """Write a JSONL paired file for an ImageFolder tree: one line per image.

    Lines: ``{"image": path relative to the output file's folder, "caption": ..., "label":
    class name, "split": "train" | "test"}`` (splits as kontrast reads the folder). Returns
    counts for a summary line.
    """
    root, out = Path(data).expanduser(), Path(out)
    if not root.is_dir() or find_cifar_folder(root):
        raise UserError(f"{root} is not an ImageFolder directory; captions need image files on disk "
                        "(for an archive, CIFAR pickles or shapes, train --method clip on it directly: "
                        "captions are then made from its class names)")
    plan = plan_layout(list_files(root), str(root))
    if not plan.classes:
        raise UserError(f"{root} has no class folders; captions are made from class names")
    lines, counts = [], {}
    for split, sp in plan.splits.items():
        if sp.labels is None:
            continue
        texts = captions_from_labels(torch.tensor(sp.labels), plan.classes, seed)
        for path, label, text in zip(sp.paths, sp.labels, texts):
            rel = os.path.relpath((root / path).resolve(), out.resolve().parent)
            lines.append(json.dumps({"image": Path(rel).as_posix(), "caption": text,
                                     "label": plan.classes[label], "split": split}))
        counts[split] = len(sp.paths)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out)
    return {"out": str(out), "classes": len(plan.classes), "templates": len(TEMPLATES), **counts}
