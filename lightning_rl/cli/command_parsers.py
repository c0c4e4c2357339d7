"""The parsers of ``evaluate``, ``export`` and ``record``, in a module that imports neither torch nor Lightning.

``lightning-rl evaluate --help`` and a usage error (a missing ``--ckpt_path``, a bad number)
are answered from here, in a fraction of a second; the commands' modules, which load torch
(and through it much else), are imported only once the arguments parse
(``lightning_rl.cli.main``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from lightning_rl.cli._command_line import (
    OneLineArgumentParser,
    existing_checkpoint,
    nonnegative_int,
    num_envs_int,
    output_file,
    positive_int,
)
from lightning_rl.cli.threads import HELP as THREADS_HELP

#: Added to the run's base seed for the default evaluation seeds (see ``lightning_rl.cli.evaluate_command``).
HELD_OUT_SEED_OFFSET = 5_000_000
#: ``export --format``'s choices: ``lightning_rl.policy.export.EXPORT_FORMATS`` (a test keeps them equal).
EXPORT_FORMATS: tuple[str, ...] = ("onnx", "torch")
OPPONENT_HELP = (
    "multi-agent checkpoints: play --module_id in every seat in turn against random, heuristic (connect four), "
    "self, or a checkpoint's path (its --module_id module, else its only one, else its main); a single-agent "
    "run on AgainstOpponentEnv: random or heuristic, in place of its env_kwargs' opponent"
)


def build_evaluate_parser() -> argparse.ArgumentParser:
    """The ``evaluate`` command's arguments."""
    parser = OneLineArgumentParser(
        prog="lightning-rl evaluate",
        description="Play greedy episodes with a checkpoint's policy on held-out seeds and report the returns.",
    )
    parser.add_argument("--ckpt_path", required=True, type=existing_checkpoint, help="a .ckpt file or save_to_path dir")
    parser.add_argument("--num_episodes", type=positive_int, default=100, help="episodes to play (default 100)")
    parser.add_argument(
        "--seed",
        type=nonnegative_int,
        default=None,
        help=f"episode i resets with seed+i (default: the run's seed + {HELD_OUT_SEED_OFFSET:,}, held out)",
    )
    parser.add_argument("--video", action="store_true", help="record the first episode as an animated GIF")
    parser.add_argument("--video_dir", type=Path, default=None, help="default: evaluation_videos beside the checkpoint")
    parser.add_argument(
        "--env", default=None, help="a registered gymnasium id (or module:Id), overriding the checkpoint's"
    )
    parser.add_argument("--config", type=Path, default=None, help="a training config whose data section names the env")
    parser.add_argument("--module_id", default=None, help="the module that acts, for checkpoints with several")
    parser.add_argument(
        "--num_envs", type=num_envs_int, default=8, help="envs stepped together (default 8, at most MAX_NUM_ENVS)"
    )
    parser.add_argument("--json", type=output_file, default=None, help="also write the statistics to this JSON file")
    parser.add_argument("--opponent", default=None, help=OPPONENT_HELP)
    parser.add_argument("--threads", type=nonnegative_int, default=None, help=THREADS_HELP)
    return parser


def build_export_parser() -> argparse.ArgumentParser:
    """The ``export`` command's arguments."""
    parser = OneLineArgumentParser(
        prog="lightning-rl export",
        description="Export a checkpoint's greedy policy (normalization and action post-processing included).",
    )
    parser.add_argument(
        "--ckpt_path",
        required=True,
        type=existing_checkpoint,
        help="a Lightning .ckpt file or a save_to_path directory",
    )
    parser.add_argument(
        "--format", required=True, choices=EXPORT_FORMATS, help="onnx (onnxruntime) or torch (torch.export, .pt2)"
    )
    parser.add_argument("--output", required=True, type=output_file, help="the file to write (replaced atomically)")
    parser.add_argument("--module_id", default=None, help="the module to export, for checkpoints with several")
    return parser


def build_record_parser() -> argparse.ArgumentParser:
    """The ``record`` command's arguments."""
    parser = OneLineArgumentParser(
        prog="lightning-rl record",
        description="Play episodes with checkpoints' policies or random actions; write them as a Minari dataset "
        "(a multi-agent checkpoint's games: as a directory of .npz files, --output).",
    )
    parser.add_argument(
        "--dataset_id", default=None, help="the Minari dataset to write, e.g. pendulum/sac-medium-v0 (single-agent)"
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="multi-agent checkpoints: the directory the games are written to"
    )
    parser.add_argument("--opponent", default=None, help=OPPONENT_HELP)
    parser.add_argument(
        "--ckpt_path",
        action="append",
        default=[],
        type=existing_checkpoint,
        help="a .ckpt file or save_to_path dir; repeat it for a mix of policies (episodes spread evenly)",
    )
    parser.add_argument("--num_episodes", type=positive_int, default=100, help="episodes to record (default 100)")
    parser.add_argument(
        "--random_fraction",
        type=fraction,
        default=0.0,
        help="this fraction of the episodes is played with uniformly random actions (default 0; 1 needs no checkpoint)",
    )
    parser.add_argument(
        "--explore", action="store_true", help="sample from the policy's exploration distribution instead of greedy"
    )
    parser.add_argument(
        "--seed",
        type=nonnegative_int,
        default=None,
        help=f"episode i resets with seed+i (default: the run's seed + {HELD_OUT_SEED_OFFSET:,}, held out)",
    )
    parser.add_argument(
        "--env", default=None, help="a registered gymnasium id (or module:Id), overriding the checkpoint's"
    )
    parser.add_argument("--config", type=Path, default=None, help="a training config whose data section names the env")
    parser.add_argument("--module_id", default=None, help="the module that acts, for checkpoints with several")
    parser.add_argument(
        "--num_envs", type=num_envs_int, default=8, help="envs stepped together (default 8, at most MAX_NUM_ENVS)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset of that id")
    parser.add_argument("--description", default=None, help="the dataset's description (Minari metadata)")
    parser.add_argument("--threads", type=nonnegative_int, default=None, help=THREADS_HELP)
    return parser


def fraction(text: str) -> float:
    """A float in ``[0, 1]``; an argparse type."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {value}")
    return value


#: Each command's parser, by the command's name.
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "evaluate": build_evaluate_parser,
    "export": build_export_parser,
    "record": build_record_parser,
}
