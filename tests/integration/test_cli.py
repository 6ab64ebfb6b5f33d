"""End to end through the CLI, and every bad input: one line, exit 2, nothing lost."""

import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from kontrast.cli import main

FAST = ["--set", "encoder.width=0.125", "--set", "train.log_every=1", "--no-progress"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """Run ``kontrast`` in a fresh process, as a user would."""
    return subprocess.run([sys.executable, "-m", "kontrast.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    proc = run_cli("train", "--method", "simclr", "--data", "shapes:256", "--epochs", "1", "--batch-size", "64",
                   "--out", str(out), *FAST)
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_train_writes_a_complete_run(trained_run):
    out, proc = trained_run
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 4 and summary["method"] == "simclr"
    assert (out / "config.yaml").is_file() and (out / "metrics.jsonl").is_file() and (out / "tb").is_dir()
    (ckpt,) = (out / "checkpoints").iterdir()
    assert {p.name for p in ckpt.iterdir()} == {"model.safetensors", "optimizer.safetensors", "rng.safetensors",
                                                "state.json"}
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4


def test_eval_json(trained_run):
    out, _ = trained_run
    proc = run_cli("eval", "--checkpoint", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert 0.0 <= result["knn_top1"] <= 1.0 and 0.0 <= result["linear_top1"] <= 1.0
    assert 0.0 <= result["kmeans_nmi"] <= 1.0 and -1.0 <= result["kmeans_ari"] <= 1.0
    assert 0.0 < result["kmeans_acc"] <= 1.0 and "finetune_top1" not in result
    for score in ("kmeans_nmi", "kmeans_ami", "kmeans_ari", "kmeans_acc"):  # each beside its chance level
        assert isinstance(result[score + "_chance"], float)
    assert result["kmeans_nmi_chance"] > 0 and abs(result["kmeans_ami_chance"]) < 0.1
    assert result["linear_weight_decay"] in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2) and 0 <= result["linear_val_top1"] <= 1
    fixed = run_cli("eval", "--checkpoint", str(out), "--linear-weight-decay", "0.005")  # the one line of figures
    assert fixed.returncode == 0, fixed.stderr
    assert "linear top-1 " in fixed.stdout and "k-means NMI 0." in fixed.stdout and "(chance 0." in fixed.stdout
    assert "AMI " in fixed.stdout
    bad = run_cli("eval", "--checkpoint", str(out), "--linear-weight-decay", "-1")
    assert bad.returncode == 2 and "expected auto or a number >= 0, got '-1'" in bad.stderr


def test_eval_fine_tunes_on_a_fraction_of_the_labels(trained_run):
    out, _ = trained_run
    proc = run_cli("eval", "--checkpoint", str(out), "--no-linear", "--no-clustering", "--labels-fraction", "0.25",
                   "--finetune-epochs", "2")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert "fine-tuned on 0.25 of the labels (" in line and "2 epochs) top-1 0." in line and "k-means" not in line
    proc = run_cli("eval", "--checkpoint", str(out), "--no-linear", "--labels-fraction", "0.25", "--finetune-epochs",
                   "1", "--json")
    result = json.loads(proc.stdout)
    assert result["labels_fraction"] == 0.25 and result["finetune_epochs"] == 1 and 0 <= result["finetune_top1"] <= 1
    assert result["finetune_labelled"] < 256 and "kmeans_acc" in result


def test_methods_lists_every_method(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("simclr", "moco_v2", "byol"):
        assert name in out


def test_existing_run_is_refused_and_kept(trained_run):
    out, _ = trained_run
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    proc = run_cli("train", "--data", "shapes:256", "--epochs", "1", "--batch-size", "64", "--out", str(out), *FAST)
    assert_one_line_error(proc, "already holds a run", "--resume", "--overwrite")
    assert before == {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}


def test_resume_continues_to_more_epochs(tmp_path):
    out = tmp_path / "run"
    args = ["--data", "shapes:256", "--batch-size", "64", "--out", str(out), *FAST]
    assert run_cli("train", "--epochs", "1", *args).returncode == 0
    proc = run_cli("train", "--epochs", "2", "--resume", *args)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["steps"] == 8
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step-00000004", "step-00000008"]


def test_resume_auto_starts_a_run_then_continues_it(tmp_path):
    """``--resume auto``: one command for every attempt of a job. No checkpoint: it starts, replacing an attempt that
    ended before its first checkpoint; a checkpoint: it continues from it."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')  # an attempt killed before its checkpoint
    args = ["--data", "shapes:256", "--batch-size", "64", "--out", str(out), "--resume", "auto", *FAST]
    first = run_cli("train", "--epochs", "1", *args)
    assert first.returncode == 0, first.stderr
    assert "resuming" not in first.stdout and json.loads(first.stdout.strip().splitlines()[-1])["steps"] == 4
    assert '"loss": 9.0' not in (out / "metrics.jsonl").read_text()
    again = run_cli("train", "--epochs", "2", *args)
    assert again.returncode == 0, again.stderr
    assert "resuming from step 4 of 8" in again.stdout
    assert json.loads(again.stdout.strip().splitlines()[-1])["steps"] == 8


@pytest.mark.parametrize("args, fragments", [
    (["--resume", "always"], ["--resume takes no value", "auto", "'always'"]),
    (["--resume", "auto", "--overwrite"], ["--resume auto and --overwrite contradict"]),
    (["--method", "nope"], ["unknown method 'nope'", "simclr"]),
    (["--data", "/does/not/exist"], ["/does/not/exist"]),
    (["--set", "optim.lrr=1"], ["optim.lrr"]),
    (["--set", "oops"], ["key=value"]),
    (["--batch-size", "100000"], ["larger than the dataset"]),
    (["--config", "/no/such.yaml"], ["config file not found"]),
    (["--precision", "fp8"], ["fp8"]),
])
def test_bad_train_input(tmp_path, args, fragments):
    out = tmp_path / "run"
    # later flags win in argparse, so ``args`` replace the good defaults
    proc = run_cli("train", "--data", "shapes:256", "--epochs", "1", "--batch-size", "64", *args,
                   "--out", str(out), "--no-progress")
    assert_one_line_error(proc, *fragments)
    assert not (out / "checkpoints").exists()


def test_empty_folder_and_corrupt_images(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(run_cli("train", "--data", str(empty), "--out", str(tmp_path / "r1")), str(empty))
    folder = tmp_path / "imgs" / "cls"
    folder.mkdir(parents=True)
    for i in range(8):
        Image.new("RGB", (32, 32), (i * 30, 0, 0)).save(folder / f"{i}.png")
    (folder / "broken.png").write_bytes(b"not an image")
    proc = run_cli("train", "--data", str(tmp_path / "imgs"), "--epochs", "1", "--batch-size", "4",
                   "--out", str(tmp_path / "r2"), *FAST)
    assert_one_line_error(proc, "broken.png", "--skip-bad-images")
    proc = run_cli("train", "--data", str(tmp_path / "imgs"), "--epochs", "1", "--batch-size", "4",
                   "--out", str(tmp_path / "r2"), "--skip-bad-images", *FAST)
    assert proc.returncode == 0, proc.stderr


def test_bad_eval_input(tmp_path):
    assert_one_line_error(run_cli("eval", "--checkpoint", str(tmp_path / "nothing")), "not found")
    assert_one_line_error(run_cli("eval", "--checkpoint", str(tmp_path / "nothing"), "--labels-fraction", "10"),
                          "--labels-fraction must be in (0, 1]", "got 10.0")
    (tmp_path / "empty_run").mkdir()
    assert_one_line_error(run_cli("eval", "--checkpoint", str(tmp_path / "empty_run")), "no complete checkpoint")


def test_damaged_checkpoint_is_reported(trained_run, tmp_path):
    import shutil

    out, _ = trained_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (ckpt,) = (copy / "checkpoints").iterdir()
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert_one_line_error(run_cli("eval", "--checkpoint", str(copy)), "model.safetensors")


def test_unknown_subcommand_is_one_line():
    assert_one_line_error(run_cli("fly"), "invalid choice")


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_a_validation_split_is_held_out_monitored_and_scored(tmp_path, mode):
    """``data.validation``: the rows are never trained on, the kNN monitor scores them (not the test split) on either
    data path, and ``kontrast eval --split validation`` scores them with the bank fit on the rest."""
    from kontrast.data import write_shapes_files

    root = tmp_path / "shapes"
    write_shapes_files(root, 160, size=32, seed=2)
    out = tmp_path / "run"
    proc = run_cli("train", "--method", "simclr", "--data", str(root), "--epochs", "1", "--batch-size", "32",
                   "--out", str(out), "--set", "data.validation=40", "--set", f"data.mode={mode}", "--set",
                   "train.knn_every=1", *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "40 more held out as the validation split" in proc.stdout + proc.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if "knn_val_top1" in r] == [0, 1]
    assert not any("knn_top1" in r for r in records)
    assert sum(1 for r in records if "loss" in r) == 120 // 32  # 120 training rows: 3 full batches
    proc = run_cli("eval", "--checkpoint", str(out), "--split", "validation", "--no-clustering", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["split"] == "validation" and 0.0 <= result["knn_top1"] <= 1.0


def test_a_validation_score_of_a_run_without_one_is_one_line(trained_run):
    out, _ = trained_run
    proc = run_cli("eval", "--checkpoint", str(out), "--split", "validation")
    assert_one_line_error(proc, "held out no validation images", "data.validation=N")
