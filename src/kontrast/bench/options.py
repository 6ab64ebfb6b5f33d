"""``kontrast bench``'s options: the dataclass, its command-line arguments, their checks, and the
``kontrast bench`` line that reproduces one section. No torch here: the CLI builds its parser from it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field, fields

from kontrast.errors import UserError

ALL_SECTIONS = ("augment", "step", "loss", "train")
# setting -> (train.precision, train.channels_last); "auto" is kontrast's default, decided per machine
NUMERICS = {"auto": ("auto", "auto"), "fp32": ("fp32", False), "fp32_cl": ("fp32", True), "bf16_cl": ("bf16", True)}
TRAIN_SETTINGS = (*NUMERICS, "bf16_cl_compile")  # end-to-end runs; the step section takes those of NUMERICS


@dataclass
class BenchOptions:
    sections: tuple[str, ...] = ALL_SECTIONS
    data: str = "shapes"  # any training source of ``kontrast train --data``
    batch: int = 256
    encoder: str = "resnet18"
    width: float = 0.25
    threads: int = 0  # per process, for step / loss / train (0 = the number of CPUs); augment is always 1
    device: str = "cpu"
    recipes: tuple[str, ...] = ()  # () = every recipe
    methods: tuple[str, ...] = ()  # () = every image method
    aug_seconds: float = 2.0
    compile_views: bool = False  # augment: also the compiled view pipeline (train.compile's)
    step_iters: int = 3
    step_setting: str = "bf16_cl"
    loss_batches: tuple[int, ...] = (128, 256, 512, 1024, 2048)
    steps: int = 30  # training steps per end-to-end run
    settings: tuple[str, ...] = ("fp32", "bf16_cl")
    workdir: str | None = None
    timeout: float = 3600.0
    log: object = field(default=print, repr=False)


def _csv(kind):
    def parse(text: str) -> tuple:
        return tuple(kind(item) for item in text.split(",") if item)

    return parse


def add_arguments(p, *, data_default: str = "shapes") -> None:
    """The options of :class:`BenchOptions` (and ``--json``) on the argparse parser ``p``."""
    p.add_argument("--sections", type=_csv(str), help="comma list of: augment,step,loss,train (default: all)")
    p.add_argument("--data", default=data_default, help=f"training source (default: {data_default})")
    p.add_argument("--batch", type=int, default=256, help="images per step (default 256)")
    p.add_argument("--encoder", default="resnet18", help="step, train: encoder name (default resnet18)")
    p.add_argument("--width", type=float, default=0.25, help="step, train: encoder width (default 0.25)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per process (default: all CPUs)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default cpu)")
    p.add_argument("--recipes", type=_csv(str), help="augment: comma list of recipes (default: all)")
    p.add_argument("--methods", type=_csv(str), help="step: comma list of methods (default: all image methods)")
    p.add_argument("--aug-seconds", type=float, default=2.0, help="augment: seconds per measurement")
    p.add_argument("--step-iters", type=int, default=3, help="step: timed steps per method")
    p.add_argument("--step-setting", choices=list(NUMERICS), default="auto",
                   help="step: auto (kontrast's default on this machine; the default), fp32, fp32_cl "
                        "(+ channels_last), or bf16_cl (bf16 autocast + channels_last)")
    p.add_argument("--loss-batches", type=_csv(int), help="loss: comma list of batch sizes")
    p.add_argument("--steps", type=int, default=30, help="train: steps per end-to-end run")
    p.add_argument("--settings", type=_csv(str),
                   help="train: comma list of auto,fp32,fp32_cl,bf16_cl,bf16_cl_compile (default: fp32,bf16_cl)")
    p.add_argument("--compile-views", action="store_true",
                   help="augment: also time the view pipeline under torch.compile (train.compile's)")
    p.add_argument("--workdir", help="folder for run directories and logs (default: a new temporary folder)")
    p.add_argument("--timeout", type=float, help="seconds each subprocess run may take (default 3600)")
    p.add_argument("--json", action="store_true", help="print all figures as one JSON object (progress on stderr)")


def from_args(args) -> BenchOptions:
    """The :class:`BenchOptions` of parsed arguments (other attributes ignored; None = the default)."""
    given = {f.name: getattr(args, f.name) for f in fields(BenchOptions) if getattr(args, f.name, None) is not None}
    return BenchOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})


def check(opts: BenchOptions) -> None:
    """Raise :class:`UserError` for options no section can run with."""
    bad = [s for s in opts.sections if s not in ALL_SECTIONS]
    if bad:
        raise UserError(f"unknown bench section(s) {', '.join(bad)}; choose from {', '.join(ALL_SECTIONS)}")
    bad = [s for s in opts.settings if s not in TRAIN_SETTINGS]
    if bad or opts.step_setting not in NUMERICS:
        raise UserError(f"bench settings must be {', '.join(NUMERICS)} or (train) bf16_cl_compile, got "
                        f"{', '.join(bad) or opts.step_setting}")
    if opts.batch < 2 or opts.steps < 1 or opts.step_iters < 1 or opts.timeout <= 0:
        raise UserError("--batch must be >= 2, --steps and --step-iters >= 1, --timeout > 0")


def threads(opts: BenchOptions) -> int:
    return opts.threads or os.cpu_count() or 1


def command(opts: BenchOptions, section: str, prog: tuple[str, ...] = ("kontrast", "bench"), **extra) -> str:
    """The line that reproduces one section (with the options that matter to it)."""
    parts = [*prog, "--sections", section, "--data", opts.data, "--batch", str(opts.batch)]
    if section != "augment":
        parts += ["--threads", str(threads(opts))]
    if section in ("step", "train"):
        parts += ["--encoder", opts.encoder, "--width", f"{opts.width:g}"]
    if opts.device != "cpu":
        parts += ["--device", opts.device]
    for key, value in extra.items():
        parts += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(parts)
