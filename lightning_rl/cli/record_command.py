"""``lightning-rl record``: play episodes with checkpoints' policies (or random actions) and write them as a Minari dataset.

    lightning-rl record --config examples/sac_pendulum.yaml --ckpt_path last.ckpt \\
        --num_episodes 200 --dataset_id pendulum/sac-medium-v0 [--explore]
    lightning-rl record --env CartPole-v1 --ckpt_path expert.ckpt --random_fraction 0.5 \\
        --num_episodes 200 --dataset_id cartpole/mixed-v0

The env, the policies and the seeds are ``evaluate``'s: the env from ``--env``, ``--config``
or the (first) checkpoint (on an ``AgainstOpponentEnv``, ``--opponent`` sets its opponent);
each policy through ``Policy.act`` (its saved observation normalization, greedy unless
``--explore``, Box actions clipped, a recurrent policy's state per env reset where each
episode starts); episode ``i`` resets with
seed ``S + i``, ``S`` held out from training by default. ``--ckpt_path`` may be given several
times, for a mix of policies: the policy episodes are spread evenly over them, in the order
given, and ``--random_fraction F`` of all episodes (rounded) come first, played with uniformly
random actions (legal ones on an env with action masks; with ``--random_fraction 1`` no
checkpoint is needed). Every episode is played
to its end (termination or truncation) and stored with its final observation and the env's
own observations and rewards. The dataset goes to ``$MINARI_DATASETS_PATH`` (default
``~/.minari/datasets``); an existing id is refused unless ``--overwrite``.

A multi-agent checkpoint's games (a ``MultiAgentDataModule`` run) go to ``--output DIR``
instead (:mod:`lightning_rl.cli.multi_agent_record`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.cli._command_line import CommandError, run_command, tell
from lightning_rl.cli.command_parsers import HELD_OUT_SEED_OFFSET
from lightning_rl.cli.command_parsers import build_record_parser as build_parser
from lightning_rl.cli.evaluate_command import (
    Actor,
    EnvSource,
    PolicyActor,
    check_env_fits,
    env_source,
    episode_stats,
    run_episodes,
)
from lightning_rl.cli.multi_agent_matches import MULTI_AGENT_DATA_MODULE, is_multi_agent_checkpoint
from lightning_rl.cli.multi_agent_record import record_multi_agent
from lightning_rl.cli.stop_signals import Stopped, stop_on_sigterm, stop_signal
from lightning_rl.cli.threads import apply_threads
from lightning_rl.core.action_masks import ACTION_MASK, is_action_masked_space
from lightning_rl.core.checkpoint import checkpoint_file, read_checkpoint_file
from lightning_rl.core.observation_layout import ObservationLayout
from lightning_rl.data.minari_writer import check_dataset_id, registered_env_spec, write_minari_dataset
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.policy.loading import policy_module
from lightning_rl.policy.policy import Policy

#: The label of the episodes played with random actions, in the summary and the dataset's metadata.
RANDOM_SOURCE = "random"


@dataclasses.dataclass
class EpisodeSource:
    """What plays a share of the episodes.

    Attributes:
        label: ``"random"``, or the checkpoint's path and ``(greedy)`` / ``(explore)``.
        actor: Plays the episodes (:class:`~lightning_rl.cli.evaluate_command.Actor`).
        num_episodes: How many episodes it plays.
        policy: The checkpoint's policy (``None`` for random actions).
    """

    label: str
    actor: Actor
    num_episodes: int
    policy: Policy | None = None


def main(args: list[str]) -> None:
    """Run ``lightning-rl record`` with ``args`` (the words after ``record``).

    Bad input (a malformed or existing dataset id, a missing or damaged checkpoint, no
    checkpoint for policy episodes, an env that cannot be found or does not fit a policy,
    Minari not installed) ends with one line on stderr and exit status 2.
    """
    run_command(build_parser(), args, _record)


def _record(args: argparse.Namespace) -> None:
    apply_threads(args.threads)
    first = None
    if args.ckpt_path:
        file = checkpoint_file(args.ckpt_path[0])
        first = read_checkpoint_file(file)
        if is_multi_agent_checkpoint(first, args.config, args.opponent):
            record_multi_agent(args, first)
            return
    if args.output is not None:
        raise CommandError(
            f"--output records multi-agent checkpoints (a {MULTI_AGENT_DATA_MODULE} run); "
            + ("this one is single-agent" if first is not None else "pass its --ckpt_path")
        )
    if args.dataset_id is None:
        raise CommandError("--dataset_id is required: the Minari dataset to write")
    check_dataset_id(args.dataset_id, overwrite=args.overwrite)  # before any episode is played
    num_random = round(args.random_fraction * args.num_episodes)
    num_policy = args.num_episodes - num_random
    if num_policy and not args.ckpt_path:
        raise CommandError(
            "--ckpt_path is required for policy episodes; pass one (or several), or --random_fraction 1 "
            "for random actions only"
        )
    if num_policy and num_policy < len(args.ckpt_path):
        raise CommandError(
            f"--num_episodes {args.num_episodes} leaves {num_policy} policy episodes for {len(args.ckpt_path)} "
            "checkpoints; record at least one episode per checkpoint"
        )
    policies, contents = [], []
    for index, path in enumerate(args.ckpt_path if num_policy else []):
        file = checkpoint_file(path)
        content = first if index == 0 else read_checkpoint_file(file)
        module, normalization = policy_module(content, args.module_id, file)
        policy = Policy(module, observation_normalization=normalization)
        policy.net.eval()  # acting is inference, as Policy.from_checkpoint
        policies.append(policy)
        contents.append(content)
    source = _env_source(args, contents)
    spaces = _env_spaces(source, policies)
    first_seed = args.seed if args.seed is not None else (source.base_seed or 0) + HELD_OUT_SEED_OFFSET
    # Sampled actions (--explore) come from torch's generator: seeded, a recording is repeatable.
    torch.manual_seed(first_seed)
    sources = _episode_sources(policies, args, num_random, num_policy, spaces, first_seed)
    played: list[list[SingleAgentEpisode]] = [[] for _ in sources]
    try:
        with stop_on_sigterm():
            _play(sources, source, first_seed, args.num_envs, played)
    except (KeyboardInterrupt, Stopped) as stop:
        # A scheduler's SIGTERM or Ctrl-C: write the episodes that ended (a second signal now
        # ends the process at once; what it was writing is swept by the next write).
        signum = stop_signal(stop)
        done = sum(len(episodes) for episodes in played)
        if not done:
            tell(f"stopped by {signum.name} before any episode ended: nothing written")
        else:
            tell(f"stopped by {signum.name} after {done} of {args.num_episodes} episodes: writing them")
            _write_and_report(source, spaces, sources, played, first_seed, args)
        raise SystemExit(128 + signum) from None
    _write_and_report(source, spaces, sources, played, first_seed, args)


def _env_source(args: argparse.Namespace, contents: Sequence[dict]) -> EnvSource:
    if contents:
        return env_source(args.env, args.config, contents[0], args.ckpt_path[0], opponent=args.opponent)
    if args.env is None and args.config is None:
        raise CommandError("random episodes need an env: pass --env ID or --config your_config.yaml")
    return env_source(args.env, args.config, {}, "", opponent=args.opponent)


def _env_spaces(source: EnvSource, policies: Sequence[Policy]) -> tuple[gym.Space, gym.Space]:
    """The env's observation and action spaces, checked against every policy's."""
    env = source.make_env()
    try:
        for policy in policies:
            check_env_fits(env, policy, source.env)
        return env.observation_space, env.action_space
    finally:
        env.close()


def _episode_sources(
    policies: Sequence[Policy],
    args: argparse.Namespace,
    num_random: int,
    num_policy: int,
    spaces: tuple[gym.Space, gym.Space],
    seed: int,
) -> list[EpisodeSource]:
    sources = []
    if num_random:
        sources.append(EpisodeSource(RANDOM_SOURCE, _RandomActions(*spaces, seed), num_random))
    share, extra = divmod(num_policy, max(len(policies), 1))
    mode = "explore" if args.explore else "greedy"
    for index, (policy, path) in enumerate(zip(policies, args.ckpt_path)):
        num_episodes = share + (index < extra)
        actor = PolicyActor(policy, deterministic=not args.explore, num_envs=min(args.num_envs, num_episodes))
        sources.append(EpisodeSource(f"{path} ({mode})", actor, num_episodes, policy))
    return sources


def _play(
    sources: Sequence[EpisodeSource],
    source: EnvSource,
    first_seed: int,
    num_envs: int,
    played: list[list[SingleAgentEpisode]],
) -> None:
    """Each source's episodes into ``played``: source ``k`` plays the next ``num_episodes`` seeds after source ``k - 1``'s.

    ``played[k]`` gets source ``k``'s episodes as each ends (so a stop keeps the ones that ended),
    then in the order of their seeds once all of them did.
    """
    envs: list[gym.Env] = []
    try:
        for _ in range(min(num_envs, max(share.num_episodes for share in sources))):
            envs.append(source.make_env())
        seed = first_seed
        for share, episodes in zip(sources, played):
            keep = _keeper(episodes)
            episodes[:] = run_episodes(envs[: share.num_episodes], share.actor, seed, share.num_episodes, keep=keep)
            seed += share.num_episodes
    finally:
        for env in envs:
            env.close()


def _keeper(episodes: list[SingleAgentEpisode]) -> Callable[[SingleAgentEpisode], SingleAgentEpisode]:
    def keep(episode: SingleAgentEpisode) -> SingleAgentEpisode:
        episodes.append(episode)
        return episode

    return keep


def _write_and_report(
    source: EnvSource,
    spaces: tuple[gym.Space, gym.Space],
    sources: Sequence[EpisodeSource],
    played: Sequence[list[SingleAgentEpisode]],
    first_seed: int,
    args: argparse.Namespace,
) -> None:
    """Print what was played per source, write the episodes as the dataset, and say where."""
    last_seed = first_seed + args.num_episodes - 1
    tell(f"{source.env} (env from {source.origin}): {args.num_episodes} episodes, seeds {first_seed}..{last_seed}")
    if args.seed is None and source.base_seed is None:
        tell("the run's seed is unknown (drawn at random, or not saved): these seeds may have been trained on")
    for share, episodes in zip(sources, played):
        tell(f"  {share.label}: {_summary(episodes)}")
    episodes = [episode.to_numpy() for group in played for episode in group]
    # Fewer than asked for when a signal stopped the recording.
    labels = ", ".join(f"{share.label} x{len(group)}" for share, group in zip(sources, played) if group)
    path = write_minari_dataset(
        args.dataset_id,
        episodes,
        observation_space=spaces[0],
        action_space=spaces[1],
        env_spec=registered_env_spec(source.env, source.env_kwargs, source.wrappers),
        algorithm_name=f"lightning-rl record: {labels}",
        description=args.description or f"{len(episodes)} episodes of {source.env}: {labels}",
        overwrite=args.overwrite,
    )
    tell(f"wrote {args.dataset_id}: {_summary(episodes)} ({path})")


def _summary(episodes: Sequence[SingleAgentEpisode]) -> str:
    stats = episode_stats(episodes)
    return (
        f"{len(episodes)} episodes, {int(stats.lengths.sum())} steps, "
        f"return mean {stats.returns.mean():.3f} std {stats.returns.std():.3f}"
    )


class _RandomActions:
    """Uniformly random actions of ``action_space`` (seeded with ``seed``), one per observation.

    On a masked env (a Dict observation of ``"observation"`` and ``"action_mask"``, such as
    ``AgainstOpponentEnv``) each action is drawn among the ones its observation's mask allows:
    an illegal move would end a board game with a loss, which is no random play.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, seed: int) -> None:
        self.space = action_space
        self.space.seed(seed)
        self._layout = ObservationLayout(observation_space) if is_action_masked_space(observation_space) else None

    def act(self, observations: np.ndarray, rows: list[int]) -> np.ndarray:
        """One random action per observation (a legal one where the env masks actions)."""
        if self._layout is None:
            return np.stack([self.space.sample() for _ in range(len(observations))])
        masks = np.asarray(self._layout.unflatten_batch(observations)[ACTION_MASK], dtype=np.int8)
        return np.stack([self.space.sample(mask=mask) for mask in masks])

    def start_episodes(self, rows: list[int]) -> None:
        """Random actions keep no state."""

    def observe_rewards(self, rewards: np.ndarray, rows: list[int]) -> None:
        """Random actions ignore rewards."""
