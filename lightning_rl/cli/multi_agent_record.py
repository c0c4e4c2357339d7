"""``lightning-rl record`` on a multi-agent checkpoint: play games and write them as a multi-agent dataset directory.

    lightning-rl record --ckpt_path last.ckpt --module_id main --opponent random \\
        --num_episodes 200 --output games/main-vs-random

Minari has no multi-agent format: the games go to ``--output`` as one compressed ``.npz`` per
episode and a ``metadata.json`` (:mod:`lightning_rl.data.multi_agent_dataset`, read back with
``load_multi_agent_dataset``). Who plays, the env and the seeds are ``evaluate``'s
(:mod:`lightning_rl.cli.multi_agent_matches`); actions are greedy unless ``--explore``.
``--random_fraction F`` plays that share of the games (rounded) first with the recorded players
acting uniformly at random (legal moves where the env masks them; an ``--opponent`` plays as it
does in the other games); ``num_random_episodes`` in ``metadata.json`` says how many of the
episodes, the first ones, those are.

Stopped by SIGTERM (a scheduler's stop) or Ctrl-C, it writes the games that ended, with
``stopped_by`` in ``metadata.json``, and exits with status ``128 + signal``.
"""

from __future__ import annotations

import argparse
import signal
from typing import Any

import torch

from lightning_rl.cli._command_line import CommandError, tell
from lightning_rl.cli.command_parsers import HELD_OUT_SEED_OFFSET
from lightning_rl.cli.multi_agent_matches import Match, agent_spaces, load_match, pettingzoo_source, random_players
from lightning_rl.cli.stop_signals import Stopped, stop_on_sigterm, stop_signal
from lightning_rl.data.multi_agent_dataset import check_output_directory, write_multi_agent_dataset
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode
from lightning_rl.env.multi_agent_runner import MultiAgentEnvRunner


def record_multi_agent(args: argparse.Namespace, checkpoint: dict[str, Any]) -> None:
    """Play ``args.num_episodes`` games with the checkpoint's modules and write them to ``args.output``.

    Args:
        args: ``record``'s arguments.
        checkpoint: The content of the (only) ``--ckpt_path``.

    Raises:
        CommandError: For flags of single-agent recording (``--dataset_id``, several
            ``--ckpt_path``), a missing ``--output``, and as ``pettingzoo_source`` and ``load_match``.
        ValueError: For an existing ``--output`` without ``--overwrite``.
        SystemExit: ``128 + signal`` when SIGTERM or SIGINT stopped the games (after writing
            the ones that ended).
    """
    if args.dataset_id is not None:
        raise CommandError("Minari has no multi-agent format: pass --output DIR instead of --dataset_id")
    if args.output is None:
        raise CommandError("--output DIR is required: where the multi-agent episodes are written")
    if len(args.ckpt_path) > 1:
        raise CommandError("a multi-agent recording plays one --ckpt_path; pass another checkpoint as --opponent PATH")
    check_output_directory(args.output, overwrite=args.overwrite)  # before any game is played
    ckpt_path = args.ckpt_path[0]
    source = pettingzoo_source(args.env, args.config, checkpoint, ckpt_path)
    first_seed = args.seed if args.seed is not None else (source.base_seed or 0) + HELD_OUT_SEED_OFFSET
    # Sampled actions (--explore) come from torch's generator: seeded, a recording is repeatable.
    torch.manual_seed(first_seed)
    runner = source.make_runner(min(args.num_envs, args.num_episodes), first_seed)
    num_random = round(args.random_fraction * args.num_episodes)
    try:
        match = load_match(ckpt_path, checkpoint, args.module_id, args.opponent, runner, source, first_seed)
        games = [(match, args.num_episodes - num_random)]
        if num_random:  # first, and in a match of their own: a match seats the games it plays
            players = load_match(ckpt_path, checkpoint, args.module_id, args.opponent, runner, source, first_seed)
            games.insert(0, (random_players(players, first_seed + 1), num_random))
        games = [(game, count) for game, count in games if count]
        observation_spaces, action_spaces = agent_spaces(runner)
        played, stopped_by = _play(games, runner, args)
    finally:
        runner.close()
    if stopped_by is not None:
        # A scheduler's SIGTERM or Ctrl-C: write the games that ended (a second signal now ends
        # the process at once; what it was writing is swept by the next write).
        if not played:
            tell(f"stopped by {stopped_by.name} before any game ended: nothing written")
            raise SystemExit(128 + stopped_by)
        tell(f"stopped by {stopped_by.name} after {len(played)} of {args.num_episodes} games: writing them")
    mode = "explore" if args.explore else "greedy"
    info = {
        "env": source.env,
        "env_kwargs": source.env_kwargs,
        "ckpt_path": str(ckpt_path),
        "module_id": match.module_id,
        "opponent": match.opponent,
        "players": match.mapping_name,
        "explore": bool(args.explore),
        "num_random_episodes": min(num_random, len(played)),  # the first ones
        "first_seed": first_seed,
        "num_envs": runner.num_envs,
        # The games asked for, and the signal that stopped the recording before they all ended (or null).
        "num_episodes_requested": args.num_episodes,
        "stopped_by": None if stopped_by is None else stopped_by.name,
        "description": args.description or _description(len(played), num_random, mode, source.env, match),
    }
    path = write_multi_agent_dataset(
        args.output,
        played,
        observation_spaces=observation_spaces,
        action_spaces=action_spaces,
        info=info,
        overwrite=args.overwrite,
    )
    steps = sum(episode.env_steps() for episode in played)
    tell(
        f"{source.env} (env from {source.origin}): {_description(len(played), num_random, mode, source.env, match)}, "
        f"seeds {first_seed}..{first_seed + len(games) * runner.num_envs - 1} (one per env copy"
        + (")" if len(games) == 1 else ", for the random games and again for the others)")
    )
    tell(f"wrote {path}: {len(played)} episodes, {steps} env steps")
    if stopped_by is not None:
        raise SystemExit(128 + stopped_by)


def _description(num_played: int, num_random: int, mode: str, env: str, match: Match) -> str:
    """``"200 greedy games of <env>: main against random"``, the random games counted first when there are any."""
    if not num_random:
        return f"{num_played} {mode} games of {env}: {match.mapping_name}"
    num_random = min(num_random, num_played)
    return f"{num_played} games of {env}: {num_random} with random actions, then {mode}: {match.mapping_name}"


def _play(
    matches: list[tuple[Match, int]], runner: MultiAgentEnvRunner, args: argparse.Namespace
) -> tuple[list[MultiAgentEpisode], signal.Signals | None]:
    """Each match's games in turn, in the order they ended, and the signal that stopped them (``None`` when all were
    played)."""
    played: list[MultiAgentEpisode] = []  # each game as it ends, so a stop keeps the ones that ended
    try:
        with stop_on_sigterm():
            for match, num_episodes in matches:
                match.play(runner, num_episodes, explore=args.explore, on_episode=played.append)
    except (KeyboardInterrupt, Stopped) as stop:
        return played, stop_signal(stop)
    return played, None
