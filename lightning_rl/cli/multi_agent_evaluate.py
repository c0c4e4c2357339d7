"""``lightning-rl evaluate`` on a multi-agent checkpoint: greedy games in its PettingZoo env, returns, win rates.

    lightning-rl evaluate --ckpt_path last.ckpt --module_id main --opponent random [--num_episodes 100]
    lightning-rl evaluate --ckpt_path last.ckpt                       # simple_spread: every agent on its module

Who plays and in which env: :mod:`lightning_rl.cli.multi_agent_matches`. The report (and
``--json``) holds the mean return per agent (seat) and per module, the episode return (the sum
over agents, RLlib's ``episode_return_mean``) and length; against an ``--opponent``, also the
evaluated module's wins, draws and losses overall and per seat it played.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from lightning_rl.cli._command_line import CommandError, tell
from lightning_rl.cli.command_parsers import HELD_OUT_SEED_OFFSET
from lightning_rl.cli.multi_agent_matches import Match, load_match, pettingzoo_source
from lightning_rl.core.checkpoint import atomic_write
from lightning_rl.data.evaluation_video import write_gif_file
from lightning_rl.env.frame_recorder import RecordedFrames
from lightning_rl.env.matches import match_result
from lightning_rl.env.multi_agent_episode import AgentID, MultiAgentEpisode

#: The outcomes counted for the evaluated module, in the order they are reported.
OUTCOMES = ("win", "draw", "loss")


def evaluate_multi_agent(args: argparse.Namespace, checkpoint: dict[str, Any], video_path: Path | None) -> None:
    """Play ``args.num_episodes`` greedy games with the checkpoint's modules; print (and write) the statistics.

    Args:
        args: ``evaluate``'s arguments.
        checkpoint: The checkpoint's content.
        video_path: Where to write the first game of the first env copy as an animated GIF
            (``--video``); ``None`` for no video.

    Raises:
        CommandError: As ``pettingzoo_source`` and ``load_match``; with a video, for an env that
            cannot render rgb frames.
    """
    source = pettingzoo_source(args.env, args.config, checkpoint, args.ckpt_path)
    first_seed = args.seed if args.seed is not None else (source.base_seed or 0) + HELD_OUT_SEED_OFFSET
    recorded = None if video_path is None else RecordedFrames()
    try:
        runner = source.make_runner(min(args.num_envs, args.num_episodes), first_seed, recorded)
    except gym.error.DependencyNotInstalled as error:  # pygame, for the envs that render with it
        raise CommandError(f'--video: {error}; install it with pip install "lightning-rl[video]"') from error
    except ValueError as error:
        if recorded is None:
            raise
        raise CommandError(f"--video: {error}") from error
    try:
        match = load_match(args.ckpt_path, checkpoint, args.module_id, args.opponent, runner, source, first_seed)
        episodes = match.play(runner, args.num_episodes, explore=False)
        agents = list(runner.possible_agents)
    finally:
        runner.close()
    stats = match_statistics(episodes, match, agents)
    tell(
        f"{source.env} (env from {source.origin}): {args.num_episodes} greedy games, {match.mapping_name}, "
        f"seeds {first_seed}..{first_seed + runner.num_envs - 1} (one per env copy)"
    )
    if args.seed is None and source.base_seed is None:
        tell("the run's seed is unknown: these seeds may have been trained on")
    for line in report_lines(stats, match.module_id):
        tell(line)
    if video_path is not None:
        write_gif_file(video_path, np.stack(recorded.frames), recorded.fps)
        tell(f"video: {video_path} (the first game of env copy 0, seed {first_seed})")
    if args.json is not None:
        record = {
            "ckpt_path": str(args.ckpt_path),
            "env": source.env,
            "module_id": match.module_id,
            "opponent": match.opponent,
            "first_seed": first_seed,
            **stats,
        }
        atomic_write(args.json, lambda file: file.write(json.dumps(record, indent=2).encode()))
        tell(f"wrote {args.json}")


def match_statistics(episodes: Sequence[MultiAgentEpisode], match: Match, agents: Sequence[AgentID]) -> dict[str, Any]:
    """The statistics of complete games: returns per agent, per module and per game; the match's outcomes.

    Args:
        episodes: Complete episodes.
        match: Who played them.
        agents: The env's possible agents (the seats), in order.

    Returns:
        ``num_episodes``; ``episode_return_{mean,std,min,max}`` (the sum over agents) and
        ``episode_len_mean`` (env steps); ``agent_episode_return_mean`` ``{agent: mean}``
        and ``module_episode_return_mean`` ``{module: mean over its agent-episodes}``. With
        an opponent also ``wins``, ``draws``, ``losses`` and their rates ``win_rate``,
        ``draw_rate``, ``loss_rate`` of ``match.module_id``, and ``seats``: ``{agent:
        {"num_episodes", "episode_return_mean", "wins", "draws", "losses", "win_rate"}}`` over
        the games it played in that seat (its return there).
    """
    returns = np.array([episode.get_return() for episode in episodes], dtype=np.float64)
    by_agent: dict[AgentID, list[float]] = {}
    by_module: dict[str, list[float]] = {}
    for episode in episodes:
        for agent, value in episode.agent_returns().items():
            by_agent.setdefault(agent, []).append(value)
            by_module.setdefault(episode.module_for(agent), []).append(value)
    stats: dict[str, Any] = {
        "num_episodes": len(episodes),
        "episode_return_mean": float(returns.mean()),
        "episode_return_std": float(returns.std()),
        "episode_return_min": float(returns.min()),
        "episode_return_max": float(returns.max()),
        "episode_len_mean": float(np.mean([episode.env_steps() for episode in episodes])),
        "agent_episode_return_mean": {agent: float(np.mean(by_agent[agent])) for agent in agents if agent in by_agent},
        "module_episode_return_mean": {module: float(np.mean(values)) for module, values in by_module.items()},
    }
    if match.module_id is None:
        return stats
    results = [match_result(episode, match.module_id) for episode in episodes]
    stats.update(_outcomes(results))
    stats["seats"] = {}
    for agent in agents:
        games = [index for index, episode in enumerate(episodes) if episode.module_for(agent) == match.module_id]
        if games:
            seat = _outcomes([results[index] for index in games])
            stats["seats"][agent] = {
                "num_episodes": len(games),
                "episode_return_mean": float(np.mean([episodes[index].agent_returns()[agent] for index in games])),
                **{key: seat[key] for key in ("wins", "draws", "losses", "win_rate")},
            }
    return stats


def _outcomes(results: Sequence[str]) -> dict[str, float]:
    counts = {outcome: sum(result == outcome for result in results) for outcome in OUTCOMES}
    return {
        "wins": counts["win"],
        "draws": counts["draw"],
        "losses": counts["loss"],
        "win_rate": counts["win"] / len(results),
        "draw_rate": counts["draw"] / len(results),
        "loss_rate": counts["loss"] / len(results),
    }


def report_lines(stats: dict[str, Any], module_id: str | None) -> list[str]:
    """What ``evaluate`` prints of :func:`match_statistics` (``module_id``: the one played against an opponent)."""
    lines = []
    if module_id is not None:
        lines.append(f"{module_id}: win rate {stats['win_rate']:.3f} ({_counts(stats)})")
        for agent, seat in stats["seats"].items():
            lines.append(
                f"  as {agent}: {seat['num_episodes']} games, win rate {seat['win_rate']:.3f} ({_counts(seat)}), "
                f"return mean {seat['episode_return_mean']:.3f}"
            )
    agents = " ".join(f"{agent} {value:.3f}" for agent, value in stats["agent_episode_return_mean"].items())
    modules = " ".join(f"{module} {value:.3f}" for module, value in stats["module_episode_return_mean"].items())
    lines.append(f"agent_episode_return_mean: {agents}")
    lines.append(f"module_episode_return_mean: {modules}")
    values = " ".join(f"{key} {stats[f'episode_return_{key}']:.3f}" for key in ("mean", "std", "min", "max"))
    lines.append(f"episode_return: {values}")
    lines.append(f"episode_len_mean: {stats['episode_len_mean']:.3f}")
    return lines


def _counts(stats: dict[str, Any]) -> str:
    return f"wins {stats['wins']}, draws {stats['draws']}, losses {stats['losses']}"
