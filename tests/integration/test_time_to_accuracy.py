"""benchmarks/time_to_accuracy.py: kontrast's side snapshots at the marks and stops at the budget, each snapshot
reads as a checkpoint of a run (``kontrast eval`` scores it), and the summary reads the curves as the targets say.
The peer's side runs in its own environment (benchmarks/peer/lightly_timed.py), not here."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import pytest
import yaml

from kontrast.evaluate.run import load_run
from support import ROOT

spec = importlib.util.spec_from_file_location("time_to_accuracy", ROOT / "benchmarks/time_to_accuracy.py")
tta = importlib.util.module_from_spec(spec)
sys.modules["time_to_accuracy"] = tta
spec.loader.exec_module(tta)


def test_ours_snapshots_at_the_marks_and_stops_at_the_budget(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "method": {"name": "simclr"}, "data": {"size": 16}, "encoder": {"width": 0.125},
        "augment": {"min_size": 8}, "train": {"epochs": 1000, "batch_size": 16, "num_threads": 1, "device": "cpu"}}))
    a = argparse.Namespace(recipe=str(recipe), data="shapes:64", out=str(tmp_path / "run"), seed=0, budget_s=3.0,
                           mark_s=1.0, set=[])
    tta.train_ours(a)
    snaps = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"side"')]
    assert len(snaps) >= 3 and snaps[-1]["reason"] == "end: budget"
    assert all(s["reason"] == "mark" for s in snaps[:-1])
    times = [s["train_s"] for s in snaps]
    assert times == sorted(times) and times[0] >= 1.0 and 3.0 <= times[-1] < 6.0  # one step past the budget at most
    for snap in snaps:  # each is a checkpoint of a run: eval, embed and export read it
        cfg, _, ckpt = load_run(tmp_path / "run/marks/checkpoints" / f"step-{snap['step']:08d}")
        assert cfg.augment.min_size == 8 and ckpt.name == f"step-{snap['step']:08d}"


def _row(side: str, seed: int, curve: list[tuple[float, float]]) -> dict:
    return {"side": side, "label": side, "seed": seed, "points": [{"train_s": t, "knn_top1": k} for t, k in curve]}


def test_the_summary_reads_time_to_the_peers_final_knn_and_the_margin_at_the_budget():
    rows = [_row("peer", 0, [(300, 0.40), (900, 0.50), (1800, 0.60)]),
            _row("ours", 0, [(300, 0.45), (600, 0.55), (900, 0.61), (1800, 0.66), (1850, 0.70)])]
    line, = tta.summary(rows, 1800.0)
    # 1850 s is past the budget:
    assert "peer (peer) kNN 0.6000 at 30 min; ours 0.6600 (+0.0600; target +0.05 met)" in line
    assert "ours reached the peer's in 15.0 min (target <= 15 min: met)" in line
    late = [_row("peer", 0, [(1800, 0.60)]), _row("ours", 0, [(600, 0.55), (900.3, 0.61), (901.5, 0.62), (1800, 0.66)])]
    assert "in 15.0 min (target <= 15 min: met)" in tta.summary(late, 1800.0)[0]  # the 15-min mark's snapshot, 0.3 s on
    assert "(target <= 15 min: not met)" in tta.summary([late[0], _row("ours", 0, [(901.5, 0.62)])], 1800.0)[0]
    assert tta.first_time_at(rows[1]["points"], 0.7) == 1850 and tta.first_time_at(rows[1]["points"], 0.8) is None
    behind, = tta.summary([rows[0], _row("ours", 0, [(900, 0.50), (1800, 0.54)])], 1800.0)
    assert "ours 0.5400 (-0.0600; target +0.05 not met); ours reached the peer's never (target" in behind
    tuned = {**_row("peer", 0, [(900, 0.55), (1800, 0.63)]), "label": "lightly tau0.2"}  # the peer's best setting
    for order in ([rows[0], tuned], [tuned, rows[0]]):
        line, = tta.summary([*order, rows[1]], 1800.0)
        assert "peer (lightly tau0.2) kNN 0.6300 at 30 min; ours 0.6600 (+0.0300; target +0.05 not" in line


def test_the_peers_pilot_rate_leaves_out_its_start_up():
    log = ("step 50/100000 loss 5.5 train_s 45\nstep 100/100000 loss 5.4 train_s 83\n"
           "step 150/100000 loss 5.3 train_s 121\n")
    assert tta.steady_rate(log, {"step": 160, "train_s": 130.0}) == 100 / 76  # 1.32, not 160 / 130 = 1.23
    assert tta.steady_rate("step 50/100000 loss 5.5 train_s 45\n", {"step": 60, "train_s": 60.0}) == 1.0


def test_the_plot_refuses_a_label_no_row_has(tmp_path, capsys):
    rows = [_row("peer", 0, [(1800, 0.60)]), _row("ours", 0, [(1800, 0.66)])]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({**r, "budget_s": 1800.0}) + "\n" for r in rows))
    args = ["--report", "--out", str(tmp_path / "rows.jsonl"), "--plot", str(tmp_path / "curves.png"), "--plot-labels"]
    with pytest.raises(SystemExit) as exit_:
        tta.main([*args, "ours,tau0.2"])
    assert exit_.value.code == 2
    assert "error: no row is labelled 'tau0.2'; the labels are ours, peer" in capsys.readouterr().err
    assert not (tmp_path / "curves.png").exists()
    tta.main([*args, "ours"])
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_ours_side_end_to_end_scores_each_snapshot_and_reports_minutes_to_targets(tmp_path, capsys):
    """The whole kontrast side as benchmarks/gpu.sh runs it (there on cuda, here on the CPU): train for the budget,
    score every snapshot with ``kontrast eval``, write the row, print the minutes to each kNN level."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "method": {"name": "simclr"}, "data": {"size": 16}, "encoder": {"width": 0.125}, "augment": {"min_size": 8},
        "train": {"epochs": 1000, "batch_size": 16, "num_threads": 1}, "eval": {"knn_k": 5}}))
    out = tmp_path / "rows.jsonl"
    tta.main(["--data", "shapes:64", "--recipe", str(recipe), "--sides", "ours", "--seeds", "0", "--label", "tiny",
              "--budget-min", "0.05", "--mark-min", "0.025", "--set", "train.device=cpu", "--eval-device", "cpu",
              "--targets", "0.0", "--work", str(tmp_path / "work"), "--out", str(out)])
    row, = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["side"] == "ours" and row["label"] == "tiny" and len(row["points"]) >= 2
    assert all(0.0 <= p["knn_top1"] <= 1.0 for p in row["points"])
    assert row["points"][-1]["reason"] == "end: budget"
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"seed 0 tiny: kNN {row['points'][-1]['knn_top1']:.4f} at ")
    first = row["points"][0]["train_s"] / 60
    assert line.endswith(f"; 0 in {first:.1f} min")
    curve = _row("ours", 1, [(150, 0.80), (300, 0.86), (1850, 0.95)])  # 1850 s is past the budget
    assert tta.reached([curve], [0.85, 0.9], 1800.0) == [
        "seed 1 ours: kNN 0.8600 at 5.0 min (step ?); 0.85 in 5.0 min, 0.9 not within the budget"]
    for bad in ("85,90", "0.85,x"):  # percentages, a typo: one line, exit 2
        with pytest.raises(SystemExit) as exit_:
            tta.parse_args(["--targets", bad])
        assert exit_.value.code == 2 and f"--targets: invalid levels value: '{bad}'" in capsys.readouterr().err


def test_the_peers_schedule_share_and_temperature_name_its_row_and_size_its_schedule(tmp_path, monkeypatch):
    """The peer's side with its processes faked: the pilot's pace sizes the schedule (0.98 of the budget by default,
    1.3 with --peer-schedule 1.3), and a setting other than the defaults is in the label and the work folder."""
    calls = []

    def fake_run_child(cmd, log):
        calls.append(cmd)
        if "evaluate" in cmd:
            return [{"train_s": 60.0, "knn_top1": 0.5}], 1.0
        if "pilot" in cmd[cmd.index("--out") + 1]:
            log.write_text("step 50/100000 loss 5 train_s 40\nstep 150/100000 loss 5 train_s 140\n")
            return [{"step": 160, "train_s": 150.0}], 1.0
        return [{"step": 60, "train_s": 60.0, "reason": "end: budget"}], 1.0

    monkeypatch.setattr(tta, "run_child", fake_run_child)
    base = ["--peer-python", "py", "--peer-data", "d", "--budget-min", "10", "--work", str(tmp_path)]
    default = tta.peer(tta.parse_args(base), 0)
    assert default["label"] == "lightly w0.25 b256 bf16_cl" and default["schedule_steps"] == int(0.98 * 600)
    assert str(tmp_path / "peer-t0.5-s0") in calls[1]
    tuned = tta.peer(tta.parse_args([*base, "--peer-temperature", "0.2", "--peer-schedule", "1.3"]), 1)
    assert tuned["label"] == "lightly w0.25 b256 bf16_cl tau0.2 x1.3" and tuned["schedule_steps"] == int(1.3 * 600)
    assert str(tmp_path / "peer-t0.2x1.3-s1") in calls[4] and calls[4][calls[4].index("--temperature") + 1] == "0.2"
    assert tuned["points"] == [{"step": 60, "train_s": 60.0, "reason": "end: budget", "knn_top1": 0.5}]
