"""Command line: parse -> build a config -> call train / evaluate. No logic here.

Every user mistake ends as one line ``error: ...`` on stderr and exit code 2.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from kontrast.cli_args import build_parser
from kontrast.errors import Interrupted, UserError


def _train_config(args):
    """The run's config, resolved once: from the YAML, the flags and ``--set`` (and on ``--resume`` the run's own
    config.yaml); a process of ``--nproc`` reads the one its launcher resolved."""
    from kontrast.checkpoint import RUN_CONFIG, read_run_config
    from kontrast.config.load import assemble
    from kontrast.methods.build import resolve
    from kontrast.train.launcher import launched_config

    launched = launched_config()
    if launched is not None:
        return launched
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
    from kontrast.decisions import decide
    from kontrast.methods.build import resolve

    if args.reference:
        print(_reference())
        return 0
    cfg = resolve(assemble(config_file=args.config, method=args.method, sets=args.set))
    decide(cfg)  # what a run of it would refuse (on one process), refused here too
    print(describe(cfg))
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


def _run(args, argv: list[str]) -> int:
    if args.command is None:  # bare `kontrast`: what it can do
        build_parser().print_help()
        return 0
    if args.command == "train":  # --resume auto: continue or start, decided here and in every process alike
        from kontrast.train.rundir import resolve_resume

        args.resume, args.overwrite = resolve_resume(Path(args.out), args.resume, args.overwrite)
    if hasattr(args, "plugin"):  # a command that builds a method: --plugin files, installed packages' entry points
        from kontrast.plugins import load_plugins  # (and on --resume, every process: the files the run names)

        load_plugins(args.plugin, run_dir=args.out if args.command == "train" and args.resume else None)
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
    if args.nproc != 1:  # each process runs this command without --nproc, through main
        from kontrast.train.launcher import run_on_processes

        return run_on_processes(args.nproc, argv, resolve_config=lambda: _train_config(args), entry=main)
    from kontrast.train.loop import fit

    summary = fit(_train_config(args), args.out, resume=args.resume, overwrite=args.overwrite,
                  progress=not args.no_progress)
    if os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 speaks for the run
        print(json.dumps(summary))
    return 0


def _methods(args) -> int:
    from kontrast.methods import METHODS

    for name in METHODS.names():
        print(f"{name:10s} {METHODS.get(name).description}")
    return 0


def _eval(args) -> int:
    from kontrast.evaluate.options import EvalOptions
    from kontrast.evaluate.run import evaluate_run

    options = EvalOptions(device=args.device, precision=args.precision, linear=not args.no_linear,
                          clustering=not args.no_clustering, linear_weight_decay=args.linear_weight_decay,
                          labels_fraction=args.labels_fraction, finetune_epochs=args.finetune_epochs,
                          split=args.split)
    result = evaluate_run(args.checkpoint, args.data, options)
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
    split = " (validation split)" if result.get("split") == "validation" else ""
    return f"{result['method']} on {result['data']}{split}: " + ", ".join(parts)


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
