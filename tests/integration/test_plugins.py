"""Methods from outside the package (kontrast.plugins): a user's own file given with ``--plugin`` trains (with
``--accumulate``, on two processes), resumes and is read back without the option, and ``methods`` and ``config``
see it; an installed package's entry point is loaded without it; a bad file is one line and exit code 2.

The runs that load a good plugin are fresh interpreters: a method registered in the test process would stay in
``METHODS`` for every later test (the reference page, the tests over the registry).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from support import ROOT
from support.args import train_command
from support.cli import cli_run

# a method of the user's own: SimCLR's composition in one file, with state after_step keeps
PLUGIN = '''"""MySimCLR: SimCLR's two views and NT-Xent, in a file of the user's own."""

from dataclasses import dataclass

import torch

from kontrast.config import checked
from kontrast.extract import mlp
from kontrast.losses import mi_bound, nt_xent
from kontrast.methods import METHODS, Method
from kontrast.methods.base import Progress, Ranks, embedding_std


@dataclass(frozen=True)
class MyParams:
    temperature: float = checked(0.5, gt=0)  # tau of the scores cosine / tau
    proj_dim: int = checked(32, ge=1)  # output width of the projection head


@METHODS.register("NAME")
class MySimCLR(Method):
    name = "NAME"
    description = "MySimCLR: two views, in-batch negatives, NT-Xent (a plugin)"
    recipe = "simclr_cifar"
    Params = MyParams

    def __init__(self, encoder, params: MyParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.projector = mlp([encoder.dim, encoder.dim, params.proj_dim])
        self.register_buffer("std_ema", torch.zeros(()))  # updated after each step: checkpointed, resumed

    def training_step(self, views, indices=None, progress: Progress | None = None):
        b = views[0].shape[0]
        z = self.in_micro_batches(lambda x: self.projector(self.encoder(x)), views[:2])  # [2B, proj_dim]
        candidates, mine = self.ranks.everyone(z)  # every process's views; this one's rows
        loss = nt_xent(z[:b], z[b:], self.params.temperature, candidates=candidates, offset=mine.start)
        return {"loss": loss, "embedding_std": embedding_std(z[:b]), "mi_bound": mi_bound(loss, len(candidates) - 1)}

    def after_step(self, out, progress: Progress) -> None:
        self.std_ema.mul_(0.9).add_(0.1 * out["embedding_std"])
'''

# a plugin that extends a built-in method inherits what that declares: here that it runs on several processes
WIDE_SIMCLR = '''from dataclasses import dataclass

from kontrast.config import checked
from kontrast.methods import METHODS
from kontrast.methods.simclr import SimCLR, SimCLRParams


@dataclass(frozen=True)
class WideParams(SimCLRParams):
    proj_dim: int = checked(256, ge=1)  # output width of the projection head


@METHODS.register("wide_simclr")
class WideSimCLR(SimCLR):
    description = "SimCLR with a 256-wide projection output (a plugin)"
    Params = WideParams
'''


def _plugin(folder: Path, name: str = "my_simclr", text: str = PLUGIN, file: str = "my_methods.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / file).write_text(text.replace("NAME", name))
    return folder / file


def _kontrast(args: list[str], cwd: Path, path: str = "") -> subprocess.CompletedProcess:
    """``python -m kontrast.cli ARGS`` in a fresh interpreter started in ``cwd`` (``path``: more of sys.path)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in [path, str(ROOT / "src"), os.environ.get("PYTHONPATH", "")] if p)}
    env.pop("WORLD_SIZE", None)
    return subprocess.run([sys.executable, "-m", "kontrast.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600)


def _train(out: Path, *extra: str, method: str | None = None, epochs: int = 1) -> list[str]:
    return train_command(out, *extra, method=method, data="shapes:256", epochs=epochs, batch=64)


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_a_plugin_method_trains_resumes_and_is_read_back_without_the_option(tmp_path):
    """``--plugin my_methods.py`` (relative, with ``--accumulate 2``): the run keeps the file's absolute path; from
    another folder ``--resume`` and ``eval`` find the method without the option; with the file moved, one line
    says where it was, and ``--plugin`` with its new place serves."""
    plugin = _plugin(tmp_path / "mine")
    out = tmp_path / "run"
    first = _kontrast(_train(out, "--plugin", "my_methods.py", "--accumulate", "2", method="my_simclr"),
                      cwd=tmp_path / "mine")
    assert first.returncode == 0, first.stderr[-2000:]
    plan = yaml.safe_load((out / "config.yaml").read_text())["plan"]
    assert plan["plugins"] == [str(plugin.resolve())]

    resumed = _kontrast(_train(out, "--resume", epochs=2), cwd=tmp_path)  # no --plugin, another folder
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from step 4 of 8" in resumed.stdout
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["steps"] == 8
    state = load_file(sorted((out / "checkpoints").iterdir())[-1] / "model.safetensors")
    assert state["std_ema"].item() > 0  # after_step's state went through the checkpoint and on

    plugin.rename(tmp_path / "moved.py")
    lost = _kontrast(["eval", "--checkpoint", str(out), "--no-linear", "--no-clustering"], cwd=tmp_path)
    assert lost.returncode == 2
    assert _errors(lost.stderr) == [f"error: the run in {out} trains method 'my_simclr' from the plugin "
                                    f"{plugin.resolve()}, which is not there any more; pass --plugin FILE with "
                                    "where that file is now"]
    found = _kontrast(["eval", "--checkpoint", str(out), "--no-linear", "--no-clustering", "--json", "--plugin",
                       "moved.py"], cwd=tmp_path)
    assert found.returncode == 0, found.stderr[-2000:]
    assert json.loads(found.stdout)["method"] == "my_simclr"


def _guides_example() -> str:
    """The method file of docs/guide.md's "Add a method": the first ```python block under that heading."""
    text = (ROOT / "docs/guide.md").read_text().split("## Add a method", 1)[1]
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_guides_example_is_a_plugin_methods_and_config_list(tmp_path):
    plugin = tmp_path / "my_methods.py"
    plugin.write_text(_guides_example())
    listed = _kontrast(["methods", "--plugin", "my_methods.py"], cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "my_method  MyMethod: two views, in-batch negatives (Author et al. 2025)" in listed.stdout.splitlines()
    assert "simclr     SimCLR v1: two views, in-batch negatives, NT-Xent (Chen et al. 2020)" in listed.stdout
    shown = _kontrast(["config", "--plugin", str(plugin), "--method", "my_method"], cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    resolved = yaml.safe_load(shown.stdout)
    assert resolved["method"] == {"name": "my_method", "temperature": 0.5, "proj_dim": 128}
    assert (resolved["optim"]["name"], resolved["optim"]["lr"]) == ("sgd", 0.06)  # its defaults, under the user's


def test_an_installed_packages_entry_point_is_loaded_without_the_option(tmp_path):
    """A package with an entry point in the group ``kontrast.methods`` naming its module: ``kontrast methods``
    lists its method."""
    _plugin(tmp_path / "site" / "ep_methods", name="ep_simclr", file="__init__.py")
    info = tmp_path / "site" / "ep_methods-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-methods\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kontrast.methods]\nep_simclr = ep_methods\n")
    listed = _kontrast(["methods"], cwd=tmp_path, path=str(tmp_path / "site"))
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert any(line.startswith("ep_simclr ") for line in listed.stdout.splitlines())


RAISES = "import kontrast\n\nx = 1 / 0\n"
CLASH = '''from kontrast.methods import METHODS
from kontrast.methods.simclr import SimCLR


@METHODS.register("simclr")
class Mine(SimCLR):
    description = "mine"
'''


@pytest.mark.parametrize("text, line", [
    (None, "error: plugin file not found: {given}; pass the path of a Python file that registers a method"),
    (RAISES, "error: plugin {file} failed on import (ZeroDivisionError: division by zero, line 3); fix the file "
             "(`python {file}` shows the whole traceback)"),
    ("import kontrast\n", 'error: plugin {file} registers no method; decorate a subclass of kontrast.methods.Method '
                          'with @METHODS.register("name") (docs/guide.md, "Add a method")'),
    (CLASH, "error: plugin {file} registers method 'simclr', which is the name of a built-in method; register it "
            "under another name")], ids=["missing", "raises", "registers-nothing", "built-in-name"])
def test_a_bad_plugin_is_one_line_and_exit_code_2(tmp_path, text, line):
    """None of these registers a method, so they run in this process; nothing is written."""
    file = tmp_path / "bad.py"
    if text is not None:
        file.write_text(text)
    run = cli_run(_train(tmp_path / "run", "--plugin", str(file)))
    assert run.returncode == 2
    assert _errors(run.stderr) == [line.format(given=file, file=file.resolve())]
    assert not (tmp_path / "run").exists()


def test_a_plugin_registering_what_is_not_a_method_is_one_line(tmp_path):
    plugin = tmp_path / "odd.py"
    plugin.write_text('from kontrast.methods import METHODS\n\nMETHODS.register("odd")(print)\n')
    run = _kontrast(["methods", "--plugin", str(plugin)], cwd=tmp_path)
    assert run.returncode == 2
    assert _errors(run.stderr) == [f"error: plugin {plugin} registers 'odd' as <built-in function print>, not a "
                                   'subclass of kontrast.methods.Method (docs/guide.md, "Add a method")']


def test_a_plugin_method_runs_on_several_processes_only_once_it_declares_so(tmp_path):
    """Without the declaration (docs/guide.md, "Add a method"), ``--nproc 2`` is refused in one line before any
    process starts."""
    plugin = _plugin(tmp_path)
    run = _kontrast(_train(tmp_path / "run", "--plugin", str(plugin), "--nproc", "2", method="my_simclr"),
                    cwd=tmp_path)
    assert run.returncode == 2
    (line,) = [line for line in _errors(run.stderr) if not line.startswith("launching")]
    assert line.startswith("error: method 'my_simclr' ") and "--nproc 1" in line, run.stderr[-2000:]


@pytest.mark.slow  # new processes, two launches of two (about 30 s)
def test_a_plugin_method_on_two_processes_resumes_without_the_option(tmp_path):
    """Each process of ``--nproc 2`` runs the launcher's command line, so it loads the ``--plugin`` file; on
    ``--resume`` (no option, another folder) each loads the file the run names."""
    _plugin(tmp_path / "mine", text=WIDE_SIMCLR, file="wide.py")
    out = tmp_path / "run"
    first = _kontrast(_train(out, "--plugin", "wide.py", "--nproc", "2", method="wide_simclr"), cwd=tmp_path / "mine")
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = _kontrast(_train(out, "--resume", "--nproc", "2", epochs=2), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from step 4 of 8" in resumed.stdout
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["steps"] == 8


def _idle(declared: bool) -> str:
    """PLUGIN with a trainable parameter its step never uses, declared to run on several processes, and declared
    to leave parameters idle or not."""
    needs = "Needs(processes=True, idle_parameters=True)" if declared else "Needs(processes=True)"
    return (PLUGIN.replace("from kontrast.config import checked", "from kontrast.config import checked\n"
                           "from kontrast.decisions import Needs")
            .replace('    Params = MyParams\n', f'    Params = MyParams\n    needs = {needs}\n')
            .replace('        self.register_buffer(', '        self.idle = torch.nn.Parameter(torch.zeros(3))\n'
                     '        self.register_buffer('))


@pytest.mark.slow  # new processes, two launches of two (about 30 s)
def test_a_parameter_left_without_gradient_on_two_processes_is_named_until_declared(tmp_path):
    """DistributedDataParallel averages the gradients; a trainable parameter no step uses stops it at the second step
    (PyTorch's own error, many lines). kontrast says it in one line naming the declaration, exit 2; declared, the
    run trains."""
    undeclared = _plugin(tmp_path / "a", text=_idle(False))
    run = _kontrast(_train(tmp_path / "a" / "run", "--plugin", str(undeclared), "--nproc", "2", method="my_simclr"),
                    cwd=tmp_path)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [line for line in _errors(run.stderr) if line.startswith("error:")]
    assert lines == ["error: MySimCLR left a trainable parameter without a gradient in a step on several processes; "
                     "declare `needs = Needs(idle_parameters=True)` on the method's class"], run.stderr[-2000:]
    declared = _plugin(tmp_path / "b", text=_idle(True))
    run = _kontrast(_train(tmp_path / "b" / "run", "--plugin", str(declared), "--nproc", "2", method="my_simclr"),
                    cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["steps"] == 4
