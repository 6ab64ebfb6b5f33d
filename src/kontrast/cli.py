"""Command line: parse -> build a config -> call train / evaluate. No logic here.

Every user mistake ends as one line ``error: ...`` on stderr and exit code 2.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path

from kontrast.cli_args import build_parser
from kontrast.errors import Interrupted, UserError


def _train_config(args):
    """The run's config, resolved once: from the YAML, the flags and ``--set`` (and on ``--resume`` the run's own
    config.yaml); a process of ``--nproc`` reads the one its launcher resolved."""
    from kontrast.checkpoint import RUN_CONFIG, read_run_config
    from kontrast.config import load_yaml
    from kontrast.config.load import assemble
    from kontrast.methods.build import read_resolved, resolve

    if CONFIG_ENV in os.environ and "RANK" in os.environ:
        return read_resolved(load_yaml(os.environ[CONFIG_ENV]))
    saved = read_run_config(Path(args.out))[0] if args.resume and (Path(args.out) / RUN_CONFIG).is_file() else None
    flags = {"data": {"source": args.data, "skip_bad_images": args.skip_bad_images or None},
             "train": {"epochs": args.epochs, "batch_size": args.batch_size, "accumulate": args.accumulate,
                       "precision": args.precision,
                       "device": args.device}}
    return resolve(assemble(saved=saved, config_file=args.config, method=args.method, flags=flags, sets=args.set,
                            where=str(args.out)))


def _show_config(args) -> int:
    """``kontrast config``: the resolved configuration, every key with what it is (a file ``--config`` reads);
    ``--reference``: every command and every key of every method, as Markdown (docs/reference.md)."""
    from kontrast.config.keys import describe
    from kontrast.config.load import assemble
    from kontrast.methods.build import resolve

    if args.reference:
        print(_reference())
        return 0
    print(describe(resolve(assemble(config_file=args.config, method=args.method, sets=args.set))))
    return 0


def _reference() -> str:
    """docs/reference.md: the commands, the config sections' keys, and each method's keys and defaults."""
    from kontrast.cli_args import commands_markdown
    from kontrast.config import SECTIONS
    from kontrast.config.keys import keys_markdown, yaml_value
    from kontrast.methods import METHODS

    out = ["# Reference", "", "What this page answers: every command with its options, and every configuration key "
           "with its default and what it is. Generated from the code by `kontrast config --reference > "
           "docs/reference.md`; a test keeps it current. `kontrast config --method M` prints one method's resolved "
           "configuration with the same descriptions.", "", "## Commands", "", commands_markdown(build_parser()),
           "## Configuration", "", "Order (later wins): these defaults, the method's own (below each method), "
           "`--config FILE`, the command's flags, `--set section.key=value`.", ""]
    for name, cls in SECTIONS.items():
        if name != "method":
            out += [f"### {name}", "", keys_markdown(cls, name), ""]
    out += ["## Methods", "", "`method.name` picks one; its keys follow.", ""]
    for name in METHODS.names():
        cls = METHODS.get(name)
        own = "; ".join(f"`{s}.{k}={yaml_value(v)}`" for s, values in cls.defaults.items() for k, v in values.items())
        out += [f"### {name}", "", cls.description + ".", ""]
        out += [f"Sets: {own}.", ""] if own else []
        out += [keys_markdown(cls.Params, "method"), ""]
    return "\n".join(out).rstrip("\n")


CONFIG_ENV = "KONTRAST_LAUNCH_CONFIG"  # set by --nproc's launcher: the config it resolved, which its processes read
NO_AGENT_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"  # torchrun's: the launcher serves no TCP store


def _launch(nproc: int, argv: list[str], cfg) -> int:
    """``kontrast train --nproc N``: the same command on N processes of this node, started by torchrun's launcher.

    On Linux the processes are forked from Python's fork server (start method ``forkserver``, started by
    :func:`_start_forkserver`): a process on one thread that imported PyTorch and kontrast's training room once,
    so each process starts without importing them and their pages are shared (docs/distributed.md, "Launch"). On
    macOS they start afresh (``spawn``), as ``torchrun ... -m kontrast.cli train`` starts them.
    """
    rest = _without_nproc(argv)  # each process runs the command under torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from kontrast.train import launch

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for several processes, without its warning
    start = "forkserver" if sys.platform == "linux" else "spawn"
    errors = tempfile.TemporaryDirectory(prefix="kontrast-launch-")  # what the processes tell the launcher
    # the launcher logs a worker's exit as a traceback of its own; the worker has said why (one line for an input
    # error, its own traceback for a crash) and the lines below name the rank
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    from kontrast.config import dump

    _say_launch(nproc, cfg.train.num_threads or int(os.environ["OMP_NUM_THREADS"]), start)
    os.environ[launch.FOLDER_ENV] = errors.name
    os.environ[CONFIG_ENV] = str(Path(errors.name) / "resolved.yaml")
    os.environ[NO_AGENT_STORE_ENV] = "1"  # read by torchrun's rendezvous: rank 0 serves the run's store
    dump(cfg, os.environ[CONFIG_ENV])
    try:  # torchrun's own launcher, in this process; each worker runs the command without --nproc
        config = _torchrun_config(nproc, start, Path(errors.name))
        elastic_launch(config=config, entrypoint=_worker)(rest, _AsLauncher())
    except SignalException as exc:  # SIGTERM / SIGINT to the launcher: torchrun passed it on and waited for them
        import signal

        _say_errors(Path(errors.name))  # a process that failed on its way out (rare) said why in the folder
        print(f"stopped: {signal.Signals(exc.sigval).name} to the launcher; "
              f"{launch.checkpoint_line(Path(errors.name), nproc)}", file=sys.stderr)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        rank, first = exc.get_first_failure()  # the cause; the others were stopped by torchrun after it
        if first.exitcode == 2:
            _say_errors(Path(errors.name))
        if first.exitcode in (2, 130, 143):  # an input error, or a signal the run handled: the process said why
            return first.exitcode
        how = first.signal_name() if first.exitcode < 0 else f"exit code {first.exitcode}"
        if first.exitcode > 0 and first.error_file_data.get("message"):  # a crash: its exception, as torchrun has it
            message = first.message.get("message", "") if isinstance(first.message, dict) else first.message
            how += ": " + (str(message).strip().splitlines() or ["?"])[0][:300]
        print(f"error: the process of rank {rank} ended the run ({how}); torchrun stopped the others", file=sys.stderr)
        return 1
    finally:
        os.environ.pop(launch.FOLDER_ENV, None)
        os.environ.pop(CONFIG_ENV, None)
        os.environ.pop(NO_AGENT_STORE_ENV, None)
        errors.cleanup()
    return 0


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


# what --nproc's fork server imports before it forks the processes: what each imports to run (the training room
# alone leaves 75 MiB more private memory a process: the config loader's and torchrun's modules). Not kontrast.cli:
# the processes of `python -m kontrast.cli` run it as their main module, which must not be imported before.
FORKSERVER_PRELOAD = ["kontrast.config.load", "torch.distributed.launcher.api", "kontrast.train.loop"]


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


def _worker(argv: list[str], *_as_launcher_done) -> None:
    """One process of ``--nproc``, started by torchrun's launcher: the command without ``--nproc``."""
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # OpenMP read the launcher's environment, not ours
    code = main(argv)
    if code:
        raise SystemExit(code)  # the launcher sees the exit code (2, 130, 143: this process said why)


def _run(args, argv: list[str]) -> int:
    if args.command is None:  # bare `kontrast`: what it can do
        build_parser().print_help()
        return 0
    if args.command == "train":
        return _train(args, argv)
    handlers = {"config": _show_config, "methods": _methods, "eval": _eval, "embed": _take_away,
                "export": _take_away, "report": _take_away, "captions": _captions, "make-shapes": _write_files,
                "shards": _write_files, "theory": _theory, "diagnose": _diagnose, "bench": _bench, "demo": _demo}
    return handlers[args.command](args)


def _train(args, argv: list[str]) -> int:
    """``kontrast train``: one process here, or ``--nproc N`` launched from here."""
    from kontrast.train.rundir import check_run_dir

    check_run_dir(Path(args.out), resume=args.resume, overwrite=args.overwrite)  # before any data or process
    if args.nproc != 1:
        if args.nproc < 1:
            raise UserError(f"--nproc must be at least 1, got {args.nproc}")
        if "WORLD_SIZE" in os.environ:
            raise UserError("--nproc inside a torchrun launch: drop --nproc (torchrun already started the processes)")
        _start_forkserver()  # its imports run beside the config's resolution here
        from kontrast.train.distributed import check_world

        cfg = _train_config(args)
        check_world(cfg, args.nproc)  # bad input: one line here, before any process starts
        return _launch(args.nproc, argv, cfg)
    from kontrast.train.faults import Faults
    from kontrast.train.loop import fit

    summary = fit(_train_config(args), args.out, resume=args.resume, overwrite=args.overwrite,
                  progress=not args.no_progress, listeners=[Faults.from_env()])
    if os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 speaks for the run
        print(json.dumps(summary))
    return 0


def _methods(args) -> int:
    from kontrast.methods import METHODS

    for name in METHODS.names():
        print(f"{name:10s} {METHODS.get(name).description}")
    return 0


def _eval(args) -> int:
    from kontrast.evaluate.run import evaluate_run

    result = evaluate_run(args.checkpoint, args.data, device=args.device, linear=not args.no_linear,
                          clustering=not args.no_clustering, labels_fraction=args.labels_fraction,
                          finetune_epochs=args.finetune_epochs, precision=args.precision,
                          linear_weight_decay=args.linear_weight_decay)
    print(json.dumps(result) if args.json else _eval_line(result))
    return 0


def _captions(args) -> int:
    from kontrast.data.captions import write_captions

    info = write_captions(args.data, args.out, seed=args.seed)
    splits = ", ".join(f"{k} {info[k]}" for k in ("train", "test") if k in info)
    print(f"wrote {info['out']}: {splits} pairs, {info['classes']} classes; captions are class names in "
          f"{info['templates']} templates (the text is the label)")
    return 0


def _theory(args) -> int:
    from kontrast.theory import run_experiment

    run_experiment(args.experiment, vars(args))
    return 0


def _diagnose(args) -> int:
    from kontrast.evaluate.diagnostics import diagnose_run

    result = diagnose_run(args.checkpoint, args.data, split=args.split, limit=args.limit,
                          temperature=args.temperature, graph_size=args.graph_size, seed=args.seed,
                          device=args.device, out=args.out, log=(lambda _: None) if args.json else print)
    if args.json:
        print(json.dumps(result))
    return 0


def _bench(args) -> int:
    from kontrast.bench import main_json, run_bench
    from kontrast.bench.options import from_args

    opts = from_args(args)
    main_json(opts) if args.json else run_bench(opts)
    return 0


def _demo(args) -> int:
    from kontrast.demo import run_demo

    run_demo(args.out, epochs=args.epochs, progress=not args.no_progress)
    return 0


def _take_away(args) -> int:
    """What a user takes from a run: embeddings with file names, a portable backbone, a report page."""
    if args.command == "embed":
        from kontrast.outputs.embed import embed_run

        info = embed_run(args.checkpoint, args.data, args.out, split=args.split, batch_size=args.batch_size,
                         device=args.device, overwrite=args.overwrite, progress=not args.no_progress,
                         precision=args.precision)
        made = f" (created the folder {info['created']})" if info["created"] else ""
        print(f"wrote {info['rows']} embeddings of dim {info['dim']} to {', '.join(info['files'])}{made}")
        return 0
    if args.command == "export":
        from kontrast.outputs.export import export_backbone

        info = export_backbone(args.checkpoint, args.out, overwrite=args.overwrite, layout=args.format)
        print(f"wrote {args.out}: {info['architecture']} ({info['format']} state_dict, feature dim "
              f"{info['feature_dim']}); load it with kontrast.load_backbone({str(args.out)!r})")
        return 0
    from kontrast.report import write_report

    if (args.run is None) == (args.checkpoint is None):
        raise UserError("report takes the run once: kontrast report --checkpoint RUN (or kontrast report RUN)")
    run = args.checkpoint or args.run
    folder = Path(args.out).expanduser().parent if args.out else None
    made = f" (created the folder {folder})" if folder is not None and not folder.exists() else ""
    print(f"wrote {write_report(run, args.out, device=args.device, limit=args.limit, precision=args.precision)}{made}")
    return 0


def _write_files(args) -> int:
    """``kontrast make-shapes`` and ``kontrast shards``: data written to files, one line saying what."""
    if args.command == "make-shapes":
        from kontrast.data.shapes_files import write_shapes_files

        info = write_shapes_files(args.out, args.n, size=args.size, seed=args.seed, shards=args.shards,
                                  per_shard=args.per_shard)
        form = f"{info['shards']} tar shards + index.json" if args.shards else "JPEG files (train/ and test/)"
        print(f"wrote {info['train']} train + {info['test']} test shape images at {info['size']} px to "
              f"{info['out']} as {form}")
        return 0
    from kontrast.data.shard_writer import write_folder_shards

    index = write_folder_shards(args.data, args.out, per_shard=args.per_shard, skip_bad_images=args.skip_bad_images)
    splits = ", ".join(f"{name} {count}" for name, count in index["splits"].items())
    labels = f"{len(index['classes'])} classes" if index["classes"] else "unlabelled"
    print(f"wrote {len(index['shards'])} shards to {args.out} ({splits} images; {labels}; {index['layout']} "
          f"layout) with index.json (sha256 and member offsets per shard)")
    return 0


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """Warnings as ``warning: ...`` on one line, without Python's source line."""
    return f"warning: {message}\n"


def _eval_line(result: dict) -> str:
    """``kontrast eval``'s one line of figures."""
    parts = [f"kNN top-1 {result['knn_top1']:.4f}"]
    names = [("linear_top1", "linear top-1"), ("zeroshot_top1", "zero-shot top-1"), ("kmeans_nmi", "k-means NMI"),
             ("kmeans_ami", "AMI"), ("kmeans_ari", "ARI"), ("kmeans_acc", "Hungarian accuracy")]
    parts += [f"{label} {result[key]:.4f}" + (f" (chance {result[key + '_chance']:.4f})" if key + "_chance" in result
                                              else "") for key, label in names if key in result]
    if "finetune_top1" in result:
        parts.append(f"fine-tuned on {result['labels_fraction']:g} of the labels ({result['finetune_labelled']} "
                     f"images, {result['finetune_epochs']} epochs) top-1 {result['finetune_top1']:.4f}")
    return f"{result['method']} on {result['data']}: " + ", ".join(parts)


# A rank that stopped because another process of the run was lost waits this long before it exits. torchrun's
# launcher reports the first exit it finds, and with --nproc's processes that can be this rank's, found in the same
# poll as the lost one's, when it is the lost process that ended the run.
PEER_LOST_GRACE_S = 3.0


def main(argv: list[str] | None = None) -> int:
    import warnings

    warnings.formatwarning = _one_line_warning
    try:
        argv = sys.argv[1:] if argv is None else argv
        return _run(build_parser().parse_args(argv), argv)
    except UserError as exc:
        from kontrast.train.launch import tell_launcher

        rank = os.environ.get("RANK", "0")  # under torchrun: say which process speaks when it is not rank 0
        if not tell_launcher(f"rank-{rank}", str(exc)):  # a process of --nproc: the launcher says it, once
            print(f"error: {exc}" if rank == "0" else f"error: rank {rank}: {exc}", file=sys.stderr, flush=True)
        return 2
    except Interrupted as exc:  # SIGTERM / SIGINT during training: checkpoint written, then 143 / 130
        if os.environ.get("RANK", "0") == "0" or exc.exit_code not in (130, 143):  # a signal: rank 0 speaks for all
            print(f"stopped: {exc}", file=sys.stderr, flush=True)
        if exc.peer_lost:  # let the launcher see the lost process's exit first, so that it names that one
            import time

            time.sleep(PEER_LOST_GRACE_S)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kontrast ... | head`: the reader left; the work is done, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
