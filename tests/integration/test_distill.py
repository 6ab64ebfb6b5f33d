"""distill from the CLI, as a user runs it: train a tiny teacher, export it, distil from the run folder and from the
export, resume, embed and export the student; a bad teacher is one line and exit code 2. (Two processes against one
and micro-batches against processes, step for step within a floor measured beside them: the every-method tests of
tests/integration/test_distributed.py, which build distill with support/teacher.py's tiny teacher.)"""

import json

import pytest
import torch
from safetensors.torch import load_file

from kontrast.checkpoint import latest_checkpoint
from support.args import train_command
from support.cli import cli_run


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A supervised run of 2 steps on shapes (a ResNet-18 at width 1/8, 16 px) and its export."""
    root = tmp_path_factory.mktemp("teacher")
    run = cli_run(train_command(root / "run", method="supervised", epochs=1))
    assert run.returncode == 0, run.stderr[-2000:]
    exported = cli_run(["export", "--checkpoint", str(root / "run"), "--out", str(root / "export")])
    assert exported.returncode == 0, exported.stderr[-2000:]
    return root


def _distill(out, teacher_ref, *extra, epochs: int = 1, settings: tuple = ()):
    named = [f"method.teacher={teacher_ref}"] if teacher_ref is not None else []  # None: no teacher named
    return cli_run(train_command(out, *extra, method="distill", epochs=epochs,
                                 settings=[*named, "train.log_every=1", *settings]))


def _losses(run) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_distil_from_a_run_and_from_its_export_resume_and_embed(teacher, tmp_path):
    for source in ("run", "export"):
        proc = _distill(tmp_path / source, teacher / source)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"distill: teacher {'run' if source == 'run' else 'export'} " in proc.stderr
    # the same teacher from both: the same losses; the checkpoint holds the student and its head only
    assert _losses(tmp_path / "run") == _losses(tmp_path / "export")
    keys = load_file(latest_checkpoint(tmp_path / "run") / "model.safetensors")
    assert {k.split(".")[0] for k in keys} == {"encoder", "head"}
    # resumed for a second epoch: it reads the teacher again from config.yaml and continues
    resumed = _distill(tmp_path / "run", teacher / "run", "--resume", epochs=2)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert latest_checkpoint(tmp_path / "run").name == "step-00000004"
    # the student embeds and exports without the teacher (moved away here)
    (teacher / "export").rename(teacher / "moved")
    try:
        embedded = cli_run(["embed", "--checkpoint", str(tmp_path / "export"), "--out", str(tmp_path / "e.pt"),
                            "--no-progress", "--device", "cpu"])
        assert embedded.returncode == 0, embedded.stderr[-2000:]
        exported = cli_run(["export", "--checkpoint", str(tmp_path / "export"), "--out", str(tmp_path / "student")])
        assert exported.returncode == 0, exported.stderr[-2000:]
    finally:
        (teacher / "moved").rename(teacher / "export")
    info = json.loads((tmp_path / "student/backbone.json").read_text())
    assert info["method"] == "distill" and info["feature_dim"] == 64  # the student's encoder, not the teacher
    assert torch.load(tmp_path / "e.pt", weights_only=True)["embeddings"].shape[1] == 64


@pytest.mark.parametrize("reference, words", [
    ("/nowhere/teacher", "teacher not found: /nowhere/teacher"),
    ("torchvision:resnet18", "needs its weights: set method.teacher_weights"),
    (None, "distill needs a teacher: set method.teacher"),
])
def test_a_bad_teacher_is_one_line_and_exit_code_2(reference, words, tmp_path):
    proc = _distill(tmp_path / "run", reference)
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert words in lines[0], lines[0]
