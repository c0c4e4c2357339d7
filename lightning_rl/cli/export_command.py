"""``lightning-rl export``: write a checkpoint's greedy policy as an ONNX file or a ``torch.export`` program.

    lightning-rl export --ckpt_path last.ckpt --format onnx --output policy.onnx
    lightning-rl export --ckpt_path last.ckpt --format torch --output policy.pt2 [--module_id M]

The graph holds the saved observation normalization, the module's inference pass, the greedy
action and Box clipping (see ``lightning_rl.policy.export``). It is checked against
``Policy.act`` on 1,000 observations before the file is written, and an existing file is
replaced atomically. A module on PettingZoo's masked observation space (pick one module of a
self-play checkpoint with ``--module_id``) exports with a second input, ``action_mask``.
"""

from __future__ import annotations

import argparse

import gymnasium as gym

from lightning_rl.cli._command_line import CommandError, run_command, tell
from lightning_rl.cli.command_parsers import build_export_parser as build_parser
from lightning_rl.core.action_masks import ACTION_MASK, observation_part
from lightning_rl.policy.export import (
    EXPORT_ATOL,
    NUM_CHECK_OBSERVATIONS,
    ExportCheckError,
    export_policy,
)
from lightning_rl.policy.policy import Policy


def main(args: list[str]) -> None:
    """Run ``lightning-rl export`` with ``args`` (the words after ``export``).

    Bad input (a missing or damaged checkpoint, an unknown format or module id, a missing
    output directory) ends with one line on stderr and exit status 2.
    """
    run_command(build_parser(), args, _export)


def _export(args: argparse.Namespace) -> None:
    policy = Policy.from_checkpoint(args.ckpt_path, module_id=args.module_id)
    try:
        written = export_policy(policy, args.output, args.format)
    except ExportCheckError as error:
        raise CommandError(f"{error}; nothing was written") from error
    tolerance = f" (within {EXPORT_ATOL})" if isinstance(policy.action_space, gym.spaces.Box) else ""
    tell(
        f"wrote {written} ({args.format}): {type(policy.module).__name__}, {_inputs(policy)} "
        f"-> {policy.action_space}; same actions as Policy.act on {NUM_CHECK_OBSERVATIONS:,} observations{tolerance}"
    )


def _inputs(policy: Policy) -> str:
    """The graph's observation inputs as the message names them: ``observations (6, 7, 2) and action masks (7,)``."""
    space = observation_part(policy.observation_space)
    # A Dict or Tuple space has no shape of its own; the graph takes its flat layout.
    shape = tuple(space.shape) if space.shape is not None else (gym.spaces.flatdim(space),)
    described = f"observations {shape}"
    if policy.is_masked:
        described += f" and action masks {tuple(policy.observation_space[ACTION_MASK].shape)}"
    return described
