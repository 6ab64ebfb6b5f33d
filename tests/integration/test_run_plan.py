"""The run plan: the config resolved once per run, the plan made once per process that trains, both kept in
RUN/config.yaml and read back from there."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import kontrast.methods.build as build
import kontrast.train.loop as loop
from kontrast.checkpoint import read_run_config
from kontrast.decisions import view_specs
from kontrast.evaluate.run import load_run, run_views
from kontrast.methods.build import resolve
from kontrast.train.plan import plan_run
from support.args import TINY
from support.cli import cli_run


@pytest.fixture
def calls(monkeypatch, tmp_path) -> Path:
    """A file with a line ``<what> <pid>`` for every config resolution and every run plan in this process."""
    log = tmp_path / "calls.txt"
    log.touch()

    def counted(name, real):
        def wrapper(*args, **kwargs):
            with open(log, "a") as f:
                f.write(f"{name} {os.getpid()}\n")
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(build, "resolve", counted("resolve", build.resolve))
    monkeypatch.setattr(loop, "plan_run", counted("plan", loop.plan_run))
    return log


def _counts(log: Path) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {"resolve": {}, "plan": {}}
    for line in log.read_text().splitlines():
        what, pid = line.split()
        out[what][int(pid)] = out[what].get(int(pid), 0) + 1
    return out


def _train(out: Path, *extra: str):
    return cli_run(["train", "--method", "simclr", "--data", "shapes:32", "--epochs", "1", "--batch-size", "16",
                    "--out", str(out), *TINY, "--set", "train.device=cpu", *extra])


def test_one_process_resolves_once_and_plans_once(calls, tmp_path):
    r = _train(tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert _counts(calls) == {"resolve": {os.getpid(): 1}, "plan": {os.getpid(): 1}}


COUNTING_SITE = """
import os
import kontrast.methods.build as build
import kontrast.train.loop as loop

def counted(name, real):
    def wrapper(*args, **kwargs):
        with open(os.environ["KONTRAST_TEST_CALLS"], "a") as f:
            f.write(f"{name} {os.getpid()}\\n")
        return real(*args, **kwargs)
    return wrapper

build.resolve = counted("resolve", build.resolve)
loop.plan_run = counted("plan", loop.plan_run)
"""


def _counted(tmp_path: Path, launcher: list[str], *extra: str):
    """``LAUNCHER train ...`` with :data:`COUNTING_SITE` in every interpreter it starts; the run and its counts."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(COUNTING_SITE)  # counts in every process of the run
    log = tmp_path / "calls.txt"
    log.touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "KONTRAST_TEST_CALLS": str(log), "OMP_NUM_THREADS": "1"}
    command = [*launcher, "train", "--method", "simclr", "--data", "shapes:32", "--epochs", "1", "--batch-size", "16",
               "--out", str(tmp_path / "run"), *TINY, "--set", "train.device=cpu", *extra]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    return run, _counts(log)


def test_under_torchrun_each_fresh_process_resolves_once_and_plans_once(tmp_path):
    """``torchrun -m kontrast.cli train`` (no launcher of ours): every process starts afresh and reads the
    command itself, so each resolves the config once and plans once."""
    run, counts = _counted(tmp_path, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                      "--nproc-per-node=2", "-m", "kontrast.cli"])
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(counts["resolve"]) == 2 and sorted(counts["resolve"].values()) == [1, 1]
    assert counts["plan"].keys() == counts["resolve"].keys() and sorted(counts["plan"].values()) == [1, 1]
    assert read_run_config(tmp_path / "run")[1]["world"] == 2


def test_two_processes_resolve_once_and_plan_once_each(tmp_path):
    """``--nproc 2``: the launcher resolves the config once; its processes read what it resolved and plan once each
    (the counting wrappers run in every interpreter of the run: the fork server's are the processes')."""
    run, counts = _counted(tmp_path, [sys.executable, "-m", "kontrast.cli"], "--nproc", "2")
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(counts["resolve"].values()) == [1]  # the launcher's
    assert not counts["plan"].keys() & counts["resolve"].keys() and sorted(counts["plan"].values()) == [1, 1]
    raw, plan = read_run_config(tmp_path / "run")
    assert plan["world"] == 2 and raw["data"]["mode"] == "memory"


def test_the_plan_is_kept_in_config_yaml_and_a_resume_keeps_its_decisions(tmp_path):
    run = tmp_path / "run"
    first = _train(run)
    assert first.returncode == 0, first.stderr
    raw, plan = read_run_config(run)
    assert "plan" not in raw and raw["train"]["precision"] in ("fp32", "bf16")  # decided, not "auto"
    assert raw["data"]["mode"] == "memory" and raw["data"]["source"] == "shapes:32"  # decided; a built-in set
    assert plan["numerics"] in first.stdout and plan["device"] == "cpu" and plan["world"] == 1
    assert plan["recipe"] == "simclr_cifar" and [v["size"] for v in plan["views"]] == [16, 16]
    assert plan["encoder"] == {"name": "resnet18", "stem": "cifar", "width": 0.125}  # decided: 16 px, CIFAR stem
    cfg, method, ckpt = load_run(run)  # what the readers (eval, embed, export, report, diagnose) do
    recorded = [{k: tuple(x) if isinstance(x, list) else x for k, x in v.items()} for v in plan["views"]]
    assert [dataclasses.asdict(v) for v in run_views(ckpt, cfg, method)] == recorded  # read from the plan ...
    assert [dataclasses.asdict(v) for v in view_specs(cfg)] == recorded  # ... which the config gives again
    again = cli_run(["train", "--out", str(run), "--resume", "--epochs", "2", "--no-progress"])
    assert again.returncode == 0, again.stderr
    raw2, plan2 = read_run_config(run)
    assert raw2["train"]["epochs"] == 2 and {k: v for k, v in raw2["train"].items() if k != "epochs"} == \
        {k: v for k, v in raw["train"].items() if k != "epochs"}
    same = ("device", "world", "recipe", "views", "encoder")  # the decisions (the words say why, now)
    assert {k: plan2[k] for k in same} == {k: plan[k] for k in same}


def test_plan_run_decides_every_auto_once(tmp_path):
    cfg = resolve({"data": {"source": "shapes:64", "size": 64}, "encoder": {"width": 0.125}})
    plan = plan_run(cfg)
    assert (cfg.train.precision, cfg.train.channels_last, cfg.data.mode) == ("auto", "auto", "auto")
    assert plan.cfg.train.precision in ("fp32", "bf16") and isinstance(plan.cfg.train.channels_last, bool)
    assert plan.cfg.data.mode == "memory" and plan.data_why.startswith("auto:")
    assert plan.recipe == "simclr_imagenet"
    assert any(line.startswith("views: 'simclr_imagenet'") for line in plan.lines())
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.device = "cuda"  # type: ignore[misc]
    assert yaml.safe_load(yaml.safe_dump(plan.to_dict()))["views"][0]["size"] == 64


def test_readers_take_the_views_from_the_plan_and_recompute_them_for_a_run_without_one(tiny_simclr_run, tmp_path):
    """eval, embed, export, report and diagnose normalise with the views the run recorded; a run directory written
    before plans were kept (no ``plan:`` section) gets them from its config."""
    run = tmp_path / "run"
    shutil.copytree(tiny_simclr_run, run)
    cfg, method, ckpt = load_run(run)
    body = yaml.safe_load((run / "config.yaml").read_text())
    body["plan"]["views"][0]["mean"] = [0.5, 0.5, 0.5]  # a recorded value the config would not give
    (run / "config.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    assert run_views(ckpt, cfg, method)[0].mean == (0.5, 0.5, 0.5)
    del body["plan"]
    (run / "config.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    assert run_views(ckpt, cfg, method) == view_specs(cfg)


def test_the_plan_says_when_a_vits_small_crops_were_rounded_to_whole_patches():
    cfg = resolve({"method": {"name": "dino"}, "data": {"source": "shapes:16", "size": 96},
                   "encoder": {"name": "vit_tiny", "width": 0.125, "depth": 1}})
    plan = plan_run(cfg)
    assert sorted({v.size for v in plan.views}) == [40, 96]  # 96 x 96/224 = 41.1 px -> 5 patches of 8 px
    assert "views: the small crops in whole 8-px ViT patches (41.1 -> 40 px)" in plan.lines()
    at_32 = plan_run(resolve({"method": {"name": "dino"}, "data": {"source": "shapes:16", "size": 32},
                              "encoder": {"name": "vit_tiny", "width": 0.125, "depth": 1}}))
    assert not any("whole" in line for line in at_32.lines())  # 16-px crops are 4 patches already
