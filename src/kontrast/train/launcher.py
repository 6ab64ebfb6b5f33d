"""``kontrast train --nproc N``: the same command on N processes of this node, started by torchrun's launcher in
this process (docs/distributed.md, "Launch").

:func:`run_on_processes` checks what depends on N before any process starts, starts Python's fork server, resolves
the config once (its processes read it back: :func:`launched_config`), says what it starts, and ends with the run's
exit code: 0; a process's own 2, 130 or 143 (an input error or a handled signal: the process said why, and the
launcher says an input error once for all ranks); 128 + the signal the launcher received; or 1 with a line naming
the rank that ended the run. What the processes tell the launcher on their way out is :mod:`kontrast.train.launch`.

Each process runs the command without ``--nproc`` through ``entry``, the command line's own ``main``, handed in by
the command line: this room does not import it.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kontrast.errors import UserError
from kontrast.train import launch

if TYPE_CHECKING:
    from kontrast.config import Config

CONFIG_ENV = "KONTRAST_LAUNCH_CONFIG"  # set by the launcher: the config it resolved, which its processes read
NO_AGENT_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"  # torchrun's: the launcher serves no TCP store

# what --nproc's fork server imports before it forks the processes: what each imports to run (the training room
# alone leaves 75 MiB more private memory a process: the config loader's and torchrun's modules). Not kontrast.cli:
# the processes of `python -m kontrast.cli` run it as their main module, which must not be imported before.
FORKSERVER_PRELOAD = ["kontrast.config.load", "torch.distributed.launcher.api", "kontrast.train.loop",
                      "kontrast.train.launcher"]

Entry = Callable[[list[str]], int]  # the command line's main: argv -> exit code


def run_on_processes(nproc: int, argv: list[str], *, resolve_config: Callable[[], Config], entry: Entry) -> int:
    """``argv`` (a ``train`` command with ``--nproc nproc``) on ``nproc`` processes of this node; its exit code.

    ``resolve_config``: the run's config, resolved here once (beside the fork server's start); ``entry``: what each
    process runs with ``argv`` less ``--nproc`` (``kontrast.cli.main``, whose ``train`` reads the resolved config
    back with :func:`launched_config`). Input errors that depend on N end here, before any process starts.
    """
    if nproc < 1:
        raise UserError(f"--nproc must be at least 1, got {nproc}")
    if "WORLD_SIZE" in os.environ:
        raise UserError("--nproc inside a torchrun launch: drop --nproc (torchrun already started the processes)")
    _start_forkserver()  # its imports run beside the config's resolution here
    from kontrast.decisions import decide

    cfg = resolve_config()
    decide(cfg, nproc)  # every refusal of the config on nproc processes: one line here, before any process starts
    return _launch(nproc, _without_nproc(argv), cfg, entry)


def launched_config() -> Config | None:
    """In a process of ``--nproc``: the config its launcher resolved; None anywhere else."""
    if CONFIG_ENV not in os.environ or "RANK" not in os.environ:
        return None
    from kontrast.config import load_yaml
    from kontrast.methods.build import read_resolved

    return read_resolved(load_yaml(os.environ[CONFIG_ENV]))


def _launch(nproc: int, rest: list[str], cfg: Config, entry: Entry) -> int:
    """torchrun's launcher, in this process; each process runs ``entry(rest)``.

    On Linux the processes are forked from Python's fork server (start method ``forkserver``, started by
    :func:`_start_forkserver`): a process on one thread that imported PyTorch and kontrast's training room once,
    so each process starts without importing them and their pages are shared (docs/distributed.md, "Launch"). On
    macOS they start afresh (``spawn``), as ``torchrun ... -m kontrast.cli train`` starts them.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from kontrast.config import dump

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for several processes, without its warning
    start = "forkserver" if sys.platform == "linux" else "spawn"
    errors = tempfile.TemporaryDirectory(prefix="kontrast-launch-")  # what the processes tell the launcher
    folder = Path(errors.name)
    # the launcher logs a worker's exit as a traceback of its own, each process it stops after a failure
    # ("Terminating process ... via signal SIGTERM") and a signal it received ("Received 15 death signal"); the
    # worker has said why (one line for an input error, its own traceback for a crash) and the lines below name the
    # rank. Each of torchrun's modules sets its own logger's level (LOGLEVEL, else WARNING), so every logger under
    # those names is quietened, not only the parents
    quiet = ("torch.distributed.elastic", "torch.multiprocessing.spawn")
    for name in [*quiet, *(n for n in logging.root.manager.loggerDict if n.startswith(quiet))]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    _say_launch(nproc, cfg.train.num_threads or int(os.environ["OMP_NUM_THREADS"]), start)
    os.environ[launch.FOLDER_ENV] = errors.name
    os.environ[CONFIG_ENV] = str(folder / "resolved.yaml")
    os.environ[NO_AGENT_STORE_ENV] = "1"  # read by torchrun's rendezvous: rank 0 serves the run's store
    dump(cfg, os.environ[CONFIG_ENV])
    try:  # torchrun's own launcher, in this process; each worker runs the command without --nproc
        elastic_launch(config=_torchrun_config(nproc, start, folder), entrypoint=_worker)(entry, rest, _AsLauncher())
    except SignalException as exc:  # SIGTERM / SIGINT to the launcher: torchrun passed it on and waited for them
        return _stopped_by_signal(exc.sigval, folder, nproc)
    except ChildFailedError as exc:
        return _failure_exit_code(exc, folder)
    finally:
        for name in (launch.FOLDER_ENV, CONFIG_ENV, NO_AGENT_STORE_ENV):
            os.environ.pop(name, None)
        errors.cleanup()
    return 0


def _stopped_by_signal(sigval, folder: Path, nproc: int) -> int:
    """The launcher's line when a signal stopped it, and its exit code, 128 + the signal."""
    import signal

    _say_errors(folder)  # a process that failed on its way out (rare) said why in the folder
    print(f"stopped: {signal.Signals(sigval).name} to the launcher; {launch.checkpoint_line(folder, nproc)}",
          file=sys.stderr)
    return 128 + int(sigval)


def _failure_exit_code(exc, folder: Path) -> int:
    """The run's exit code when a process failed (torchrun's ``ChildFailedError``): the process's own 2, 130 or 143
    (it said why; an input error is said here, once), else 1 with a line naming the rank and how it ended."""
    rank, first = exc.get_first_failure()  # the cause; the others were stopped by torchrun after it
    if first.exitcode == 2 or (first.exitcode not in (130, 143) and any(folder.glob("rank-*"))):
        _say_errors(folder)  # a process's input error is the cause, whichever rank torchrun saw end first (the
        return 2  # others, waiting for it at a barrier, lose their connection)
    if first.exitcode in (130, 143):  # a signal the run handled: the process said why
        return first.exitcode
    how = first.signal_name() if first.exitcode < 0 else f"exit code {first.exitcode}"
    if first.exitcode > 0 and first.error_file_data.get("message"):  # a crash: its exception, as torchrun has it
        message = first.message.get("message", "") if isinstance(first.message, dict) else first.message
        how += ": " + (str(message).strip().splitlines() or ["?"])[0][:300]
    print(f"error: the process of rank {rank} ended the run ({how}); torchrun stopped the others", file=sys.stderr)
    return 1


def _torchrun_config(nproc: int, start: str, folder: Path):
    """torchrun's launch configuration for N processes on this node, as ``--standalone`` gives but for the
    rendezvous: a file in ``folder`` rather than a TCP store served from this process (the first remedy for a rank
    that never joined, when this process forked the processes: docs/distributed.md, "A process that never joins").
    The run's own store is served by rank 0."""
    import uuid

    from torch.distributed.run import config_from_args, get_args_parser

    args = get_args_parser().parse_args([f"--nproc-per-node={nproc}", f"--start-method={start}", "-m", "kontrast.cli"])
    args.rdzv_backend, args.rdzv_id, args.rdzv_conf = "c10d", str(uuid.uuid4()), "store_type=file"
    args.rdzv_endpoint = str(folder / "rendezvous")  # with NO_AGENT_STORE_ENV set: no TCP store served from here
    return config_from_args(args)[0]


def _without_nproc(argv: list[str]) -> list[str]:
    rest, skip = [], False
    for arg in argv:
        if skip or arg == "--nproc" or arg.startswith("--nproc="):
            skip = arg == "--nproc"
            continue
        rest.append(arg)
    return rest


def _say_launch(nproc: int, threads: int, start: str) -> None:
    """What ``--nproc`` starts, and a warning when its threads outnumber the cores this process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    print(f"launching {nproc} processes on this node (torchrun, {start}), {threads} thread(s) each; rank 0 "
          f"speaks for the run", flush=True)
    if nproc * threads > cores:  # the remedies that change something: fewer processes, or fewer threads each
        fewer_procs, fewer_threads = max(1, cores // threads), max(1, cores // nproc)
        remedies = ([f"--nproc {fewer_procs}"] if fewer_procs < nproc else []) + (
            [f"--set train.num_threads={fewer_threads}"] if fewer_threads < threads else [])
        print(f"warning: {nproc} processes x {threads} threads > {cores} cores: they will slow each other; use "
              f"{' or '.join(remedies)}", file=sys.stderr, flush=True)


def _say_errors(folder: Path) -> None:
    """The workers' input errors, each message once: the same config fails the same way on every rank."""
    said = []
    for path in sorted(folder.glob("rank-*"), key=lambda p: int(p.name.split("-")[1])):
        message = path.read_text()
        if message not in said:
            rank = path.name.split("-")[1]
            print(f"error: {message}" if rank == "0" else f"error: rank {rank}: {message}", file=sys.stderr, flush=True)
            said.append(message)


def _start_forkserver() -> None:
    """On Linux, Python's fork server for ``--nproc``'s processes, unless this process started it already: a fresh
    interpreter on one thread that imports what the processes run (``FORKSERVER_PRELOAD``) and forks each of them."""
    if sys.platform != "linux":
        return
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    forkserver.ensure_running()


class _AsLauncher:
    """Sent with each process of ``--nproc``: unpickled there before torchrun sets that process's own variables,
    it gives the process this launcher's environment and standard output and error as they are at this launch
    (the process's working directory and ``sys.path`` are its launcher's already). The fork server the processes
    are forked from is started by this process's first launch and keeps what this process had then."""

    def __reduce__(self):
        from multiprocessing.context import get_spawning_popen
        from multiprocessing.reduction import DupFd  # the descriptors travel with the new process

        if get_spawning_popen() is None:  # pickled for something else than a new process (a copy): nothing to give
            return _AsLauncher, ()
        return _as_launcher, (dict(os.environ), DupFd(1), DupFd(2))


def _as_launcher(environ: dict, out, err) -> None:
    os.environ.clear()
    os.environ.update(environ)
    for fd, passed in ((1, out), (2, err)):
        received = passed.detach()
        if received != fd:  # spawn passes the launcher's own descriptor numbers
            os.dup2(received, fd)
            os.close(received)


def _worker(entry: Entry, argv: list[str], *_as_launcher_done) -> None:
    """One process of ``--nproc``, started by torchrun's launcher: ``entry(argv)``, the command without ``--nproc``.

    ``entry`` travels by reference: under ``python -m kontrast.cli`` it is the main module's ``main``, which the
    process has run as its own main module before it unpickles it."""
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # OpenMP read the launcher's environment, not ours
    code = entry(argv)
    if code:
        raise SystemExit(code)  # the launcher sees the exit code (2, 130, 143: this process said why)
