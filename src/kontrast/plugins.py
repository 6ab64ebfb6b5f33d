"""Methods from outside the package: a user's own Python file, or an installed package's entry point.

``kontrast train --plugin my_methods.py`` (and ``methods``, ``config`` and the commands that read a run) runs the
file before anything else, so its ``@METHODS.register("name")`` adds the method; it then trains, resumes and runs
on several processes as a built-in one does. A package installed with an entry point in the group
``kontrast.methods`` (``my_methods = "my_package.methods"``: the module to import) is loaded the same way, by every
command that builds a method, without the option.

A run keeps the files its method came from, as absolute paths, under ``plugins:`` in the ``plan:`` of
``RUN/config.yaml``; ``--resume`` and the readers of a run (``eval``, ``embed``, ``export``, ``report``,
``diagnose``: :func:`kontrast.evaluate.run.load_run`) load them from there. Each process of ``--nproc`` runs the
launcher's command line, so it loads what the launcher loaded.

Each file is loaded once per process, under a module name of its own (two files both called ``methods.py`` do not
meet). What goes wrong with one is a one-line :class:`~kontrast.errors.UserError` naming the file and what to do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path

from kontrast.checkpoint import RUN_CONFIG, read_run_config
from kontrast.errors import UserError
from kontrast.registry import METHODS, AlreadyRegistered

ENTRY_POINT_GROUP = "kontrast.methods"  # installed packages' entry points: each names a module that registers methods
RUN_KEY = "plugins"  # in the plan of RUN/config.yaml: the files the run's method came from

_files: dict[Path, list[str]] = {}  # each file loaded in this process -> the methods it registered
_packages: dict[str, list[str]] | None = None  # each installed package's entry point loaded -> its methods
GUIDE = 'docs/guide.md, "Add a method"'


def load_plugins(files: Iterable[str | Path] = (), run_dir: str | Path | None = None) -> list[str]:
    """The installed packages' ``kontrast.methods`` entry points (once per process), then each of ``files``, then, when
    ``run_dir`` holds a run whose method is not known by now, the files its config.yaml names. Returns the methods
    ``files`` registered."""
    load_entry_points()
    names = [name for path in files for name in load_file(path)]
    if run_dir is not None:
        load_run_plugins(run_dir)
    return names


def load_file(path: str | Path) -> list[str]:
    """Run the Python file at ``path`` (once per process) so that its ``@METHODS.register`` runs; the methods it
    registered, by name."""
    path = _checked_path(path)
    if path in _files:
        return _files[path]
    import kontrast.methods  # noqa: F401  the built-in methods first: a plugin's are told from them, a clash is seen

    before = set(METHODS.names())
    _run_file(path)
    names = sorted(set(METHODS.names()) - before)
    if not names:
        raise UserError(f"plugin {path} registers no method; decorate a subclass of kontrast.methods.Method with "
                        f'@METHODS.register("name") ({GUIDE})')
    _check_methods(f"plugin {path}", names)
    _files[path] = names
    return names


def load_entry_points() -> None:
    """Import the module each installed ``kontrast.methods`` entry point names (once per process)."""
    global _packages
    if _packages is not None:
        return
    from importlib.metadata import entry_points

    _packages = {}
    found = list(entry_points(group=ENTRY_POINT_GROUP))
    if found:
        import kontrast.methods  # noqa: F401  the built-in methods first (as load_file)
    for point in found:
        where = f"the {ENTRY_POINT_GROUP} entry point {point.name} = {point.value} of the installed package " \
                f"{point.dist.name if point.dist else '?'}"
        before = set(METHODS.names())
        try:
            point.load()
        except AlreadyRegistered as exc:
            raise UserError(f"{where} registers {exc.kind} {exc.name!r}, {_holder(exc.name)}; uninstall one of "
                            "them") from None
        except Exception as exc:
            raise UserError(f"{where} failed on import ({_what(exc)}); fix or uninstall the package") from None
        _packages[where] = sorted(set(METHODS.names()) - before)
        _check_methods(where, _packages[where])


def load_run_plugins(run_dir: str | Path) -> None:
    """The files the run in ``run_dir`` trained its method from (``plugins:`` in its plan), unless its method is
    known by now (a ``--plugin`` of this command gave it, from where the file is now)."""
    if not (Path(run_dir) / RUN_CONFIG).is_file():
        return
    raw, plan = read_run_config(run_dir)
    files, method = plan.get(RUN_KEY) or [], (raw.get("method") or {}).get("name")
    if not files or method in METHODS:
        return
    missing = [file for file in files if not Path(file).is_file()]
    if missing:
        raise UserError(f"the run in {run_dir} trains method {method!r} from the plugin {missing[0]}, which is not "
                        "there any more; pass --plugin FILE with where that file is now")
    for file in files:
        load_file(file)


def plugin_files(method: str) -> list[str]:
    """The files loaded in this process that registered ``method`` (absolute paths; none for a built-in method or an
    installed package's): what a run records so that its readers find the method."""
    return [str(path) for path, names in _files.items() if method in names]


def _checked_path(path: str | Path) -> Path:
    given = Path(path).expanduser()
    if not given.exists():
        where = f" (relative to {os.getcwd()})" if not given.is_absolute() else ""
        raise UserError(f"plugin file not found: {path}{where}; pass the path of a Python file that registers a "
                        "method")
    if given.is_dir() or given.suffix != ".py":
        raise UserError(f"plugin {path} is not a .py file; pass a Python file that registers a method")
    return given.resolve()


def _run_file(path: Path) -> None:
    """Execute ``path`` as a module of its own name (its stem and a digest of its path)."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    name = f"kontrast_plugin_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look a class's module up by name while the file runs
    try:
        spec.loader.exec_module(module)
    except AlreadyRegistered as exc:
        del sys.modules[name]
        raise UserError(f"plugin {path} registers {exc.kind} {exc.name!r}, {_holder(exc.name)}; register it under "
                        "another name") from None
    except Exception as exc:
        del sys.modules[name]
        raise UserError(f"plugin {path} failed on import ({_what(exc, path)}); fix the file (`python {path}` shows "
                        "the whole traceback)") from None


def _what(exc: Exception, path: Path | None = None) -> str:
    """``ZeroDivisionError: division by zero, line 12``: the exception in one line, and the file's line it came from."""
    message = ((exc.msg if isinstance(exc, SyntaxError) else str(exc)).strip().splitlines() or [""])[0]
    line = exc.lineno if isinstance(exc, SyntaxError) and exc.filename == str(path) else None
    if line is None and path is not None:
        lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if Path(frame.filename) == path]
        line = lines[-1] if lines else None
    return f"{type(exc).__name__}{': ' + message if message else ''}{f', line {line}' if line else ''}"


def _holder(name: str) -> str:
    """Who registered ``name`` before: a plugin file, an installed package, or kontrast itself."""
    for path, names in _files.items():
        if name in names:
            return f"which the plugin {path} registered already"
    for where, names in (_packages or {}).items():
        if name in names:
            return f"which {where} registered already"
    return "which is the name of a built-in method"


def _check_methods(where: str, names: list[str]) -> None:
    """Each registered name is a :class:`~kontrast.methods.Method` subclass with what the training room reads."""
    from kontrast.methods.base import Method

    for name in names:
        cls = METHODS.get(name)
        if not (isinstance(cls, type) and issubclass(cls, Method)):
            raise UserError(f"{where} registers {name!r} as {cls!r}, not a subclass of kontrast.methods.Method "
                            f"({GUIDE})")
        lacking = [attr for attr in ("description", "recipe", "Params") if not hasattr(cls, attr)]
        if lacking:
            raise UserError(f"{where}: method {name!r} does not set {', '.join(lacking)}; a method sets description, "
                            f"recipe and Params as class attributes ({GUIDE})")
        if not dataclasses.is_dataclass(cls.Params):
            raise UserError(f"{where}: the Params of method {name!r} is not a dataclass; declare it with "
                            f"@dataclass(frozen=True) ({GUIDE})")
