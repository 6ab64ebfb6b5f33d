"""The small things a new user trips on: each one a line of output or an error that says what to do."""

import argparse
import subprocess
import sys

import numpy as np
import pytest
import yaml
from PIL import Image

from kontrast.cli import main
from kontrast.cli_args import build_parser
from support.args import TINY


def _one_line_error(capsys, *fragments):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def _photos(root, classes=("a", "b"), per_class=10, flat=False):
    rng = np.random.default_rng(0)
    for c in classes:
        folder = root if flat else root / c
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(folder / f"{c}{i:02d}.png")
    return root


def test_bare_kontrast_prints_help(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kontrast") and "embed" in out and "export" in out and "report" in out


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("kontrast 0.") and "torch 2." in out


def test_every_flag_of_every_command_has_help():
    missing = []

    def visit(parser, prefix):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    visit(sub, f"{prefix} {name}")
            elif action.help in (None, "") and not isinstance(action, argparse._HelpAction):
                missing.append(f"{prefix} {'/'.join(action.option_strings) or action.dest}")

    visit(build_parser(), "kontrast")
    assert missing == []


@pytest.mark.parametrize("argv, fragment", [
    (["train", "--out", "x", "--method", "simclear"], "did you mean 'simclr'?"),
    (["train", "--out", "x", "--set", "train.seeed=1"], "did you mean 'train.seed'?"),
    (["train", "--out", "x", "--set", "trian.seed=1"], "did you mean 'train'?"),
    (["train", "--out", "x", "--set", "encoder.name=resnet19"], "did you mean 'resnet18'?"),
    (["train", "--out", "x", "--set", "encoder.name=torchvision:resnet19"], "resnet18"),
    (["train", "--out", "x", "--method", "SimCLR"], "did you mean 'simclr'?"),  # another case
    (["trian", "--out", "x"], "did you mean 'train'?"),  # a command
    (["train", "--out", "x", "--resume"], "--resume: no complete checkpoint in"),  # before any data is read
])
def test_did_you_mean(argv, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    _one_line_error(capsys, fragment)
    assert not (tmp_path / "x").exists()  # refused before any work


def test_unknown_encoder_is_reported_before_the_data_is_read(capsys, tmp_path):
    """encoder.name=resnet19 used to surface first as a batch-size error on a small dataset."""
    assert main(["train", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "run"), "--set",
                 "encoder.name=resnet19", "--batch-size", "100000"]) == 2
    _one_line_error(capsys, "unknown encoder 'resnet19'")


def test_run_config_keeps_the_data_path_absolute_and_eval_works_from_elsewhere(tmp_path, monkeypatch, capsys):
    _photos(tmp_path / "photos")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--data", "photos", "--epochs", "1", "--batch-size", "6", "--out", "run",
                 "--device", "cpu", *TINY]) == 0
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert cfg["data"]["source"] == str((tmp_path / "photos").resolve())
    assert cfg["train"]["device"] == "cpu"
    out = capsys.readouterr().out
    summary = [line for line in out.splitlines() if line.startswith("data: ")]
    assert len(summary) == 1, out
    assert "18 training images" in summary[0] and "labelled, 2 classes" in summary[0]
    assert "every 10th image of each class (10 %) is held out" in summary[0] and "16x16 px" in summary[0]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["eval", "--checkpoint", str(tmp_path / "run"), "--no-linear", "--json"]) == 0


def test_unlabelled_run_eval_and_diagnose_suggest_split_train(tmp_path, capsys):
    _photos(tmp_path / "flat", flat=True)
    assert main(["train", "--data", str(tmp_path / "flat"), "--epochs", "1", "--batch-size", "5", "--out",
                 str(tmp_path / "run"), *TINY]) == 0
    assert "unlabelled; nothing held out" in capsys.readouterr().out
    for command in ("eval", "diagnose"):
        assert main([command, "--checkpoint", str(tmp_path / "run")]) == 2
        _one_line_error(capsys, "--split train")
    assert main(["diagnose", "--checkpoint", str(tmp_path / "run"), "--split", "train", "--limit", "16",
                 "--graph-size", "8", "--json"]) == 0


def test_skip_bad_images_warns_in_one_line_without_source(tmp_path):
    root = _photos(tmp_path / "photos")
    (root / "a" / "broken.png").write_bytes(b"not a png")
    proc = subprocess.run([sys.executable, "-m", "kontrast.cli", "train", "--data", str(root), "--epochs", "1",
                           "--batch-size", "6", "--out", str(tmp_path / "run"), "--skip-bad-images", *TINY],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "unreadable" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: skipped 1 unreadable"), proc.stderr
    assert "UserWarning" not in proc.stderr and ".py:" not in proc.stderr


def test_demo_says_when_it_replaces_an_earlier_run(tmp_path, monkeypatch, capsys):
    import kontrast.demo as demo

    class Stop(Exception):
        pass

    def fake_fit(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(demo, "fit", fake_fit)
    (tmp_path / "config.yaml").write_text("{}")
    with pytest.raises(Stop):
        demo.run_demo(tmp_path)
    assert f"replacing the earlier demo run in {tmp_path}" in capsys.readouterr().out


def test_the_device_error_names_the_flag(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: nothing to refuse")
    assert main(["train", "--out", str(tmp_path / "x"), "--device", "cuda", *TINY]) == 2
    _one_line_error(capsys, "use --device cpu")


def test_nproc_says_what_it_launched_and_warns_on_more_threads_than_cores(tmp_path):
    from support.cli import cli_run

    # 64 threads each: more than any CI machine's cores; each process then finds no data (rank 0 first, the other
    # waiting for it), before any step (so the test never runs 128 threads), and the error is said once
    missing = tmp_path / "no-such-folder"
    r = cli_run(["train", "--nproc", "2", "--method", "dino", "--data", str(missing), "--epochs", "1", "--batch-size",
                 "16", "--out", str(tmp_path / "run"), "--no-progress", "--set", "encoder.width=0.125", "--set",
                 "data.size=32", "--set", "train.num_threads=64"])
    assert r.returncode == 2, r.stderr
    assert "launching 2 processes on this node (torchrun, forkserver), 64 thread(s) each" in r.stdout
    assert "warning: 2 processes x 64 threads >" in r.stderr and "cores" in r.stderr
    assert r.stderr.count(f"error: dataset not found: {missing} does not exist") == 1, r.stderr
    assert "Terminating process" not in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("method, setting, fragment", [
    ("amdim", "data.size=24", "data.size 24 is too small for amdim"),
    ("cpc", "data.size=32", "shapes:64 holds images, but this method trains on sequences; use --data sequences"),
])
def test_a_refusal_under_nproc_is_said_before_any_process_starts(method, setting, fragment, tmp_path):
    """The plan's refusals (kontrast.decisions.decide, for N processes) are made once in the launcher: one line, no
    launch line, no process started."""
    from support.cli import cli_run

    r = cli_run(["train", "--nproc", "2", "--method", method, "--data", "shapes:64", "--epochs", "1", "--batch-size",
                 "16", "--out", str(tmp_path / "run"), "--no-progress", "--set", setting])
    assert r.returncode == 2 and "launching" not in r.stdout, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and fragment in r.stderr, r.stderr


@pytest.mark.parametrize("nproc, threads, remedies", [(3, 1, "use --nproc 2\n"),
                                                       (1, 4, "use --set train.num_threads=2\n"),
                                                       (2, 2, "use --nproc 1 or --set train.num_threads=1\n")])
def test_the_thread_warning_names_only_remedies_that_change_something(nproc, threads, remedies, capsys, monkeypatch):
    from kontrast.train import launcher

    monkeypatch.setattr(launcher.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # 2 cores
    launcher._say_launch(nproc, threads, "forkserver")
    assert capsys.readouterr().err.endswith(f"threads > 2 cores: they will slow each other; {remedies}")


def test_load_images_all_is_train_and_test_in_path_order():
    from kontrast.data import load_images

    both = load_images("shapes:40", "all", size=8)
    train, test = load_images("shapes:40", "train", size=8), load_images("shapes:40", "test", size=8)
    assert len(both) == len(train) + len(test) and both.paths == sorted(train.paths + test.paths)


def test_embed_says_when_it_creates_the_output_folder(tmp_path, capsys, tiny_simclr_run):
    out = tmp_path / "new" / "dir" / "e.npy"
    assert main(["embed", "--checkpoint", str(tiny_simclr_run / "checkpoints"), "--out", str(out),
                 "--no-progress"]) == 0
    assert f"(created the folder {out.parent})" in capsys.readouterr().out and out.is_file()
