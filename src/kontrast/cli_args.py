"""The command line's grammar: every command and flag, each with its help text (dispatch is in ``cli``)."""

from __future__ import annotations

import argparse
import re

from kontrast.errors import UserError, did_you_mean

DEVICE_HELP = "cpu, cuda, cuda:N or mps (default: %(default)s)"
PRECISION_HELP = ("the encoder's arithmetic: fp32 (the default, the same features on every machine), bf16, or auto "
                  "(bf16 where the device computes it natively)")


def _auto_or_float(text: str):
    """``auto`` or a non-negative number (argparse type)."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected auto or a number >= 0, got {text!r}")
    return value


def _resume_mode(text: str) -> str:
    """``--resume``'s one value: ``auto`` (argparse type)."""
    if text != "auto":
        raise argparse.ArgumentTypeError(f"--resume takes no value (continue) or auto (continue if there is a "
                                         f"checkpoint, else start), not {text!r}")
    return text


def _precision_arg(p) -> None:
    p.add_argument("--precision", choices=["fp32", "bf16", "auto"], default="fp32", help=PRECISION_HELP)


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage too by default)
        choice = re.match(r"argument .*: invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:  # argparse lists the choices; say which one was meant
            known = re.findall(r"'([^']*)'", choice.group(2)) or [c.strip() for c in choice.group(2).split(",")]
            message = f"{message}{did_you_mean(choice.group(1), known)}"
        raise UserError(f"{message} (see `{self.prog} --help`)")


def _plugin_arg(p) -> None:
    p.add_argument("--plugin", action="append", default=[], metavar="FILE",
                   help="a Python file of your own that registers methods (repeatable; a run keeps its path for "
                   "--resume and the commands that read the run; docs/guide.md, \"Add a method\")")


def _csv(kind):
    def parse(text: str) -> tuple:
        return tuple(kind(item) for item in text.split(",") if item)

    return parse


def _train_args(sub) -> None:
    p = sub.add_parser("train", help="pretrain an encoder")
    p.add_argument("--method", help="method name (see `kontrast methods`); default simclr")
    _plugin_arg(p)
    p.add_argument("--data", help="shapes | ImageFolder dir | .tar/.tar.gz | CIFAR folder | tar shards (a `kontrast "
                   "shards` folder or 'dir/train-{000000..000009}.tar', on disk or at s3://, gs://, https://); "
                   "data.mode=auto|memory|stream picks the "
                   "path (default: shapes)")
    p.add_argument("--epochs", type=int, help="passes over the training images (default: the method's)")
    p.add_argument("--batch-size", type=int, help="images per step, all processes together (default: the method's)")
    p.add_argument("--accumulate", type=int, metavar="K", help="train each step's batch in K micro-batches with "
                   "gradient caching: the same gradient in about 1/K of the activation memory, one more forward "
                   "(train.accumulate; docs/memory.md)")
    p.add_argument("--out", required=True, help="run directory (checkpoints, metrics, config)")
    p.add_argument("--config", help="YAML recipe (see configs/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. optim.lr=0.1")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp64"],
                   help="bf16 autocast or fp32 (default: auto, bf16 only where the device computes it natively); "
                   "fp64 for checking numerics (slower)")
    p.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps (default: auto, a GPU when there is one)")
    p.add_argument("--skip-bad-images", action="store_true", help="skip unreadable images instead of refusing "
                   "(streaming: one met mid-epoch is replaced by a sample drawn from seed, epoch and its number)")
    p.add_argument("--resume", nargs="?", const=True, default=False, type=_resume_mode, metavar="auto",
                   help="continue the run in --out from its newest checkpoint; --resume auto: continue when it has "
                   "one, start it otherwise (one command for every attempt: a requeued job, torchrun --max-restarts)")
    p.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--nproc", type=int, default=1, help="processes on this node (torchrun; docs/distributed.md); "
                   "--batch-size stays the global batch")


def _eval_args(sub) -> None:
    p = sub.add_parser("eval", help="kNN, linear-probe and clustering scores of a run's encoder; optionally "
                       "fine-tuning on a fraction of the labels")
    p.add_argument("--checkpoint", required=True, help="run directory or one checkpoint folder")
    _plugin_arg(p)
    p.add_argument("--data", help="labelled source to evaluate on (default: the run's training source)")
    p.add_argument("--split", choices=["test", "validation"], default="test",
                   help="score the test split (default), or the validation split the run held out of its training "
                   "images (data.validation), with the kNN bank and probe fit on the rest: for choosing settings")
    p.add_argument("--device", default="cpu", help=DEVICE_HELP)
    _precision_arg(p)
    p.add_argument("--no-linear", action="store_true", help="no linear probe")
    p.add_argument("--linear-weight-decay", type=_auto_or_float, default=None, metavar="WD",
                   help="the linear probe's weight decay (default: the run's eval.linear_weight_decay, auto: chosen "
                   "on a held-out tenth of the training labels, never on the test split)")
    p.add_argument("--no-clustering", action="store_true", help="no k-means of the test features (NMI, AMI, ARI, "
                   "Hungarian accuracy, each with its chance level)")
    p.add_argument("--labels-fraction", type=float, default=0.0, metavar="F",
                   help="also fine-tune the encoder with a linear head on this class-balanced fraction of the "
                   "training labels (e.g. 0.01 or 0.1, SimCLR's protocol) and score it on the test split")
    p.add_argument("--finetune-epochs", type=int, default=0, metavar="N",
                   help="epochs of that fine-tuning (default: 60 for 1%% of the labels or fewer, 30 above)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _outputs_args(sub) -> None:
    p = sub.add_parser("embed", help="frozen encoder features of every image, with file names")
    p.add_argument("--checkpoint", required=True, help="run directory or one checkpoint folder")
    _plugin_arg(p)
    p.add_argument("--data", help="images to embed: any source `train --data` reads (default: the run's own)")
    p.add_argument("--out", required=True, help="output file; its extension picks the format: "
                   ".npy (+ .paths.txt beside it), .pt, .parquet or .csv")
    p.add_argument("--split", choices=["all", "train", "test"], default="all",
                   help="which images of the source (default: all, in path order)")
    p.add_argument("--batch-size", type=int, default=512, help="images per forward pass (default: %(default)s)")
    p.add_argument("--device", default="cpu", help=DEVICE_HELP)
    _precision_arg(p)
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p = sub.add_parser("export", help="the encoder as a torchvision state_dict (safetensors) + a JSON of how to use it")
    p.add_argument("--checkpoint", required=True, help="run directory or one checkpoint folder")
    _plugin_arg(p)
    p.add_argument("--out", required=True, help="folder to write backbone.safetensors and backbone.json into")
    p.add_argument("--format", choices=["torchvision", "timm"], default="torchvision",
                   help="key names of the file: torchvision's (the default; kontrast's ResNets and ViTs carry them) "
                   "or timm's (timm.create_model(..., pretrained=False) loads it strictly; "
                   "backbone.json gives the call)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it holds files")
    p = sub.add_parser("report", help="one self-contained HTML page: curves, embedding map, neighbours, views")
    p.add_argument("run", nargs="?", help="run directory (or give it as --checkpoint, as the other commands)")
    p.add_argument("--checkpoint", help="run directory or one checkpoint folder")
    _plugin_arg(p)
    p.add_argument("--out", help="HTML file to write (default: RUN/report.html)")
    p.add_argument("--limit", type=int, default=2000,
                   help="images in the map and the neighbours (default: %(default)s)")
    p.add_argument("--device", default="cpu", help=DEVICE_HELP)
    _precision_arg(p)


def _files_args(sub) -> None:
    p = sub.add_parser("make-shapes", help="write the built-in shapes at any resolution as a JPEG ImageFolder tree "
                       "or tar shards (test and benchmark data)")
    p.add_argument("--out", required=True, help="new or empty folder for train/<class>/*.jpg and test/... "
                   "(or the shards)")
    p.add_argument("--n", type=int, default=1000, help="training images; n // 5 more for test (default: %(default)s)")
    p.add_argument("--size", type=int, default=256, help="pixels per side (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the same seed writes the same files (default: %(default)s)")
    p.add_argument("--shards", action="store_true", help="write WebDataset-style tar shards + index.json instead")
    p.add_argument("--per-shard", type=int, default=1000, help="samples per shard (default: %(default)s)")
    p = sub.add_parser("shards", help="write an image folder as WebDataset-style tar shards with an index.json of "
                       "member offsets and sha256 per shard")
    p.add_argument("--data", required=True, help="ImageFolder directory (train/ + test/, class folders, or flat)")
    p.add_argument("--out", required=True, help="new or empty folder for {split}-NNNNNN.tar and index.json")
    p.add_argument("--per-shard", type=int, default=1000, help="samples per shard (default: %(default)s)")
    p.add_argument("--skip-bad-images", action="store_true", help="leave out unreadable images instead of refusing")


def _theory_args(sub) -> None:
    p = sub.add_parser("theory", help="check contrastive-learning theory on worlds where the truth is known")
    which = p.add_subparsers(dest="experiment", required=True, parser_class=Parser)
    s = which.add_parser("spectral", help="contrastive learning vs spectral clustering of a known augmentation graph")
    s.add_argument("--out", default="runs/theory", help="folder for spectral.json and spectral.png")
    for name, kind, text in (
            ("n", int, "objects in the world"), ("k", int, "planted clusters (= embedding dim)"),
            ("steps", int, "training steps"), ("batch", int, "positive pairs per step"),
            ("seeds", int, "training runs per (encoder, loss)"), ("seed", int, "world and first training seed"),
            ("eval-every", int, "steps between evaluations"), ("lr", float, "Adam lr of the table encoder"),
            ("mlp-lr", float, "Adam lr of the MLP encoder"), ("tau", float, "temperature of every kernel"),
            ("gamma", float, "exponent of the gamma kernel"), ("bandwidth", float, "augmentation kernel length scale")):
        s.add_argument(f"--{name}", type=kind, help=text)
    s.add_argument("--losses", type=_csv(str), help="comma list of: spectral,infonce,laplacian,gamma,mixture")
    s.add_argument("--encoders", type=_csv(str), help="comma list of: table,mlp")
    m = which.add_parser("mi", help="InfoNCE's bound log N - L on pairs with known mutual information")
    m.add_argument("--out", default="runs/theory", help="folder for mi.json and mi.png")
    for name, kind, text in (
            ("dim", int, "independent coordinate pairs"), ("rho", float, "correlation of each pair"),
            ("steps", int, "critic training steps per N"), ("pairs", int, "pairs per training step"),
            ("eval-pairs", int, "fresh pairs for each estimate"), ("seed", int, "random seed")):
        m.add_argument(f"--{name}", type=kind, help=text)
    m.add_argument("--ns", type=_csv(int), help="comma list of N, e.g. 2,8,64,512")


def _diagnose_args(sub) -> None:
    p = sub.add_parser("diagnose", help="alignment, uniformity, collapse and graph spectrum of a run's encoder")
    p.add_argument("--checkpoint", required=True, help="run directory or one checkpoint folder")
    _plugin_arg(p)
    p.add_argument("--data", help="images to embed (default: the run's training source)")
    p.add_argument("--split", choices=["train", "test"], default="test", help="images of this split (default: test)")
    p.add_argument("--limit", type=int, default=512, help="images used (a fixed random subset)")
    p.add_argument("--temperature", type=float, default=0.5, help="of the batch similarity graph")
    p.add_argument("--graph-size", type=int, default=256, help="images in the similarity graph (2 views each)")
    p.add_argument("--seed", type=int, default=0, help="of the subset and the views")
    p.add_argument("--device", default="cpu", help=DEVICE_HELP)
    p.add_argument("--out", help="folder for diagnostics.json and .png (default: RUN/diagnostics)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _bench_args(sub) -> None:
    from kontrast.bench.options import add_arguments

    p = sub.add_parser("bench", help="this machine's speed: augmentation, per-step breakdown, loss, training images/s")
    add_arguments(p)


def _version() -> str:
    import platform

    import torch
    import torchvision

    from kontrast import __version__

    return (f"kontrast {__version__} (torch {torch.__version__}, torchvision {torchvision.__version__}, "
            f"Python {platform.python_version()})")


class _Version(argparse.Action):
    """``--version``: torch is imported only when asked."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, help="print the versions of kontrast, torch and torchvision")

    def __call__(self, parser, namespace, values, option_string=None):
        print(_version())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kontrast", description="Contrastive self-supervised learning in five components.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", parser_class=Parser, metavar="COMMAND")
    _train_args(sub)
    _eval_args(sub)
    _outputs_args(sub)
    _plugin_arg(sub.add_parser("methods", help="list methods"))
    c = sub.add_parser("config", help="the resolved configuration: every key, its value and what it is")
    c.add_argument("--method", help="method name (see `kontrast methods`); default simclr")
    _plugin_arg(c)
    c.add_argument("--config", help="YAML recipe (see configs/)")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. optim.lr=0.1")
    c.add_argument("--reference", action="store_true", help="every command and every key of every method, as Markdown")
    c = sub.add_parser("captions",
                       help="write a JSONL of image paths + captions made from an ImageFolder's class names")
    c.add_argument("--data", required=True, help="ImageFolder directory (class sub-folders)")
    c.add_argument("--out", required=True, help="output .jsonl (image paths relative to its folder)")
    c.add_argument("--seed", type=int, default=0, help="template choice per image")
    _files_args(sub)
    _theory_args(sub)
    _diagnose_args(sub)
    _bench_args(sub)
    d = sub.add_parser("demo", help="pretrain on the built-in shapes data and compare with baselines")
    d.add_argument("--out", default="runs/demo", help="run directory (default: %(default)s)")
    d.add_argument("--epochs", type=int, help="pretraining epochs (default: demo.yaml's)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def commands_markdown(parser: argparse.ArgumentParser) -> str:
    """Every command of ``parser`` with its options and their help, as Markdown (docs/reference.md)."""
    out = []
    for name, sub, text in _commands(parser, "kontrast"):
        out += [f"### `{name}`", "", f"{text}." if text else "", ""]
        rows = [(", ".join(f"`{o}`" for o in a.option_strings), sub._get_formatter()._expand_help(a) if a.help else "")
                for a in sub._actions if a.option_strings and a.dest != "help"]
        if rows:
            out += ["| option | what it does |", "|---|---|",
                    *(f"| {o} | {h.replace('|', chr(92) + '|')} |" for o, h in rows), ""]
    return "\n".join(out)


def _commands(parser: argparse.ArgumentParser, prefix: str):
    """``(command line, its parser, its help)`` of every leaf command under ``parser``, in the order declared."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                nested = any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
                if nested:
                    yield from _commands(sub, f"{prefix} {name}")
                else:
                    yield f"{prefix} {name}", sub, helps.get(name, "")
