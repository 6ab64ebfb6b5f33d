"""The package's shape: short functions, imports that point down the rooms, no import circle, nothing of the
benchmarks inside it. A file's length is not a target; a function much past 60 lines is a sign to split it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from support import ROOT

SRC = ROOT / "src"
PACKAGE = SRC / "kontrast"
MAX_FUNCTION_LINES = 60

# The rooms from the top down: a module imports only from rooms below its own (or from its own room).
LEVELS = {"cli": 0, "cli_args": 1, "kontrast": 2, "demo": 3, "bench": 3, "train": 4, "outputs": 4, "report": 4,
          "theory": 4, "evaluate": 5, "methods": 6, "decisions": 6.5, "encoders": 7, "losses": 7, "extract": 7,
          "micro_batches": 7, "data": 7, "augment": 8, "similarity": 8, "plotting": 8, "checkpoint": 8, "config": 9,
          "registry": 9, "precision": 10, "errors": 11}
LEVELS["plugins"] = 5.5  # methods from a user's file or an installed package: above methods, read by train and evaluate


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """kontrast modules that ``name`` imports, anywhere in the file (function-level imports too).

    ``from P import x`` is an edge to ``P.x`` when that is a module, else to ``P``.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in MODULES}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                target = f"{base}.{alias.name}"
                out.add(target if target in MODULES else base)
    return {m for m in out if m in MODULES and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    assert _cycles(graph) == []


def _room(module: str) -> str:
    """``kontrast.train.loop`` -> ``train``; ``kontrast.cli`` -> ``cli``; the package itself -> ``kontrast``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "kontrast"


def test_every_room_has_a_level():
    assert {_room(name) for name in MODULES} == set(LEVELS)


def test_imports_point_down_the_rooms():
    upward = [f"{name} -> {target}" for name, path in MODULES.items() for target in _imports(name, path)
              if _room(target) != _room(name) and LEVELS[_room(target)] <= LEVELS[_room(name)]]
    assert upward == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_functions_are_short(name):
    tree = ast.parse(MODULES[name].read_text())
    long = [f"{node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == [], f"{name}: split along its seams"


def test_package_holds_no_benchmark_paths_or_targets():
    """Peer comparisons, targets and ../shared paths live in benchmarks/, not in the installed package."""
    for name, path in MODULES.items():
        text = path.read_text()
        assert "../shared" not in text and "shared/data" not in text and "shared/bench" not in text, name
        assert "TARGETS" not in text, name
