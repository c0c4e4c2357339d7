"""``lightning-rl evaluate``: play greedy episodes with a checkpoint's policy on seeds training never used.

    lightning-rl evaluate --ckpt_path last.ckpt --num_episodes 100 [--seed S] [--video] [--video_dir D]
                          [--env ID] [--config cfg.yaml] [--module_id M] [--num_envs N] [--json stats.json]

    lightning-rl evaluate --ckpt_path last.ckpt --module_id main --opponent random     # a multi-agent checkpoint
    lightning-rl evaluate --ckpt_path last.ckpt --config c4.yaml --opponent heuristic  # on AgainstOpponentEnv

A multi-agent checkpoint (a ``MultiAgentDataModule`` run) is played in its PettingZoo env by
:mod:`lightning_rl.cli.multi_agent_evaluate`; the rest of this docstring is single-agent.

The env is, in this order: ``--env`` (a registered gymnasium id, or ``module:Id``); the data
section of ``--config`` (its ``env``, ``env_kwargs`` and evaluation wrappers); or the
checkpoint's own data-module settings when they name a registered id with no wrappers (a
checkpoint never makes this command import anything). An offline run's data section (an
``OfflineDataModule``'s ``dataset_id``) names its env as the data module evaluates in: its
``evaluation_env``, else the registered env its local Minari dataset was recorded in. On an
``AgainstOpponentEnv``, ``--opponent random|heuristic`` replaces the ``opponent`` of its
``env_kwargs``. The policy acts through ``Policy.act`` (the saved observation normalization,
the greedy action, Box clipping; a recurrent policy keeps its state per env, reset where each
episode starts).
Episode ``i`` resets with seed ``S + i``; by default ``S`` is the run's base seed plus ``HELD_OUT_SEED_OFFSET``
(5,000,000), seeds that the data module reaches only after millions of episodes: its training
envs reset with ``seed + i + k * num_envs`` and its evaluation envs from ``seed + 1,000,003``,
and other ranks start at multiples of 10,000,000. A run whose data module drew its seed
(``seed: null``) did not save it: it drew it from numpy's generator, which the run's
``seed_everything`` seeds, so ``S`` is then that seed plus 5,000,000 (``seed_everything``
from ``--config``, or from the ``config.yaml`` that ``lightning-rl fit`` saved beside the
checkpoint's ``checkpoints`` directory). Only a run with no seed anywhere gets ``S`` =
5,000,000 and a note that those seeds may have been trained on.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from lightning_rl.cli._command_line import CommandError, run_command, tell
from lightning_rl.cli.command_parsers import HELD_OUT_SEED_OFFSET
from lightning_rl.cli.command_parsers import build_evaluate_parser as build_parser
from lightning_rl.cli.multi_agent_evaluate import evaluate_multi_agent
from lightning_rl.cli.multi_agent_matches import MULTI_AGENT_DATA_MODULE, is_multi_agent_checkpoint
from lightning_rl.cli.run_settings import read_data_section, run_base_seed
from lightning_rl.cli.threads import apply_threads
from lightning_rl.core.checkpoint import atomic_write, checkpoint_file, read_checkpoint_file
from lightning_rl.core.observation_layout import ObservationLayout
from lightning_rl.core.spaces import space_to_dict
from lightning_rl.data.dataset_rows import open_dataset, recorded_env
from lightning_rl.data.evaluation_video import write_gif_file
from lightning_rl.env.env_factory import make_env, resolve_env, resolve_wrappers
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.episode_quota import EpisodeQuota
from lightning_rl.env.frame_recorder import EpisodeFrameRecorder, env_kwargs_for_video
from lightning_rl.env.opponents import OPPONENTS
from lightning_rl.policy.loading import policy_module
from lightning_rl.policy.policy import Policy

#: The first episode's video, in ``--video_dir``.
VIDEO_FILE_NAME = "evaluation-episode-0.gif"


class Actor(Protocol):
    """What plays :func:`run_episodes`' envs: a policy (:class:`PolicyActor`) or random actions.

    Rows are the envs' indices: an actor that keeps a state per env (a recurrent policy)
    learns from :meth:`start_episodes` where an episode starts and from :meth:`observe_rewards`
    what each step returned.
    """

    def act(self, observations: np.ndarray, rows: list[int]) -> np.ndarray:
        """Observations ``[B, *obs_shape]`` (a Dict's flat layout) of envs ``rows`` to the actions ``[B, ...]``."""
        ...

    def start_episodes(self, rows: list[int]) -> None:
        """Envs ``rows`` were reset: their next observation is an episode's first."""
        ...

    def observe_rewards(self, rewards: np.ndarray, rows: list[int]) -> None:
        """The rewards ``[B]`` envs ``rows`` returned for the latest actions."""
        ...


@dataclasses.dataclass
class PolicyActor:
    """A :class:`Policy` as an :class:`Actor`: one row per env (a recurrent policy's state included).

    Attributes:
        policy: The policy; its recurrent state is reset by the first :meth:`start_episodes`
            for every env.
        deterministic: Greedy actions, else sampled as in training.
        num_envs: How many envs (rows) it acts for.
    """

    policy: Policy
    deterministic: bool
    num_envs: int

    def act(self, observations: np.ndarray, rows: list[int]) -> np.ndarray:
        """``Policy.act`` for the envs ``rows`` (a recurrent policy steps those rows' states).

        The stored rows of a masked env (a single-agent one, e.g. ``AgainstOpponentEnv``) hold
        the mask beside the observation: the policy gets them back as the env's dict.
        """
        if self.policy.is_masked:
            observations = self._masked_layout.unflatten_batch(observations)
        return self.policy.act(observations, deterministic=self.deterministic, rows=rows)

    @functools.cached_property
    def _masked_layout(self) -> ObservationLayout:
        return ObservationLayout(self.policy.observation_space)

    def start_episodes(self, rows: list[int]) -> None:
        """Reset the rows' recurrent state (every env: a fresh batch of ``num_envs`` rows)."""
        self.policy.reset(None if len(rows) == self.num_envs else rows)

    def observe_rewards(self, rewards: np.ndarray, rows: list[int]) -> None:
        """Pass the rewards on to a recurrent policy (its next previous rewards)."""
        self.policy.observe_rewards(rewards, rows)


@dataclasses.dataclass(frozen=True)
class EnvSource:
    """How to build the evaluation env, and where that came from.

    Attributes:
        env: A gymnasium id, or an env factory's import path (from ``--env`` or ``--config`` only).
        env_kwargs: Keyword arguments for ``gym.make``.
        wrappers: Wrapper specs, as a data module takes them.
        origin: ``"--env"``, ``"--config"`` or ``"the checkpoint"``, and ``--opponent``'s when given (for the report).
        base_seed: The run's base seed (its data module's ``seed``, else its ``seed_everything``), when known.
    """

    env: str
    env_kwargs: dict[str, Any]
    wrappers: list[Any]
    origin: str
    base_seed: int | None

    def make_env(self) -> gym.Env:
        """One copy of the env, its wrappers applied."""
        return make_env(resolve_env(self.env), self.env_kwargs, resolve_wrappers(self.wrappers))


@dataclasses.dataclass(frozen=True)
class EpisodeStats:
    """The returns and lengths of the episodes played, in order."""

    returns: np.ndarray
    lengths: np.ndarray

    def summary(self) -> dict[str, float]:
        """Mean, standard deviation (population), min and max of the returns and lengths."""
        result: dict[str, float] = {"num_episodes": len(self.returns)}
        for name, values in (("episode_return", self.returns), ("episode_len", self.lengths)):
            result.update(
                {
                    f"{name}_mean": float(np.mean(values)),
                    f"{name}_std": float(np.std(values)),
                    f"{name}_min": float(np.min(values)),
                    f"{name}_max": float(np.max(values)),
                }
            )
        return result


def main(args: list[str]) -> None:
    """Run ``lightning-rl evaluate`` with ``args`` (the words after ``evaluate``).

    Bad input (a missing or damaged checkpoint, an env that cannot be found or does not fit
    the policy, a missing directory) ends with one line on stderr and exit status 2.
    """
    run_command(build_parser(), args, _evaluate)


def _evaluate(args: argparse.Namespace) -> None:
    apply_threads(args.threads)
    file = checkpoint_file(args.ckpt_path)
    content = read_checkpoint_file(file)
    video_dir = (args.video_dir or _default_video_dir(args.ckpt_path)) if args.video else None
    if is_multi_agent_checkpoint(content, args.config, args.opponent):
        evaluate_multi_agent(args, content, None if video_dir is None else video_dir / VIDEO_FILE_NAME)
        return
    module, normalization = policy_module(content, args.module_id, file)
    policy = Policy(module, observation_normalization=normalization)
    source = env_source(args.env, args.config, content, args.ckpt_path, opponent=args.opponent)
    first_seed = args.seed if args.seed is not None else (source.base_seed or 0) + HELD_OUT_SEED_OFFSET
    stats = play_episodes(policy, source, args.num_episodes, first_seed, video_dir, args.num_envs)
    summary = stats.summary()
    last_seed = first_seed + args.num_episodes - 1
    tell(
        f"{source.env} (env from {source.origin}): {args.num_episodes} greedy episodes, seeds {first_seed}..{last_seed}"
    )
    if args.seed is None and source.base_seed is None:
        tell(
            "the run's seed is unknown (no data seed or seed_everything in the checkpoint, --config or the run's "
            "config.yaml): these seeds may have been trained on"
        )
    for name in ("episode_return", "episode_len"):
        values = " ".join(f"{key} {summary[f'{name}_{key}']:.3f}" for key in ("mean", "std", "min", "max"))
        tell(f"{name}: {values}")
    if video_dir is not None:
        tell(f"video: {video_dir / VIDEO_FILE_NAME}")
    if args.json is not None:
        record = {"ckpt_path": str(args.ckpt_path), "env": source.env, "first_seed": first_seed, **summary}
        atomic_write(args.json, lambda file: file.write(json.dumps(record, indent=2).encode()))
        tell(f"wrote {args.json}")


def env_source(
    env: str | None, config: Path | None, checkpoint: Mapping[str, Any], ckpt_path: str, *, opponent: str | None = None
) -> EnvSource:
    """The env to evaluate in: ``--env``, else ``--config``'s data section, else the checkpoint's data settings.

    Args:
        opponent: ``--opponent`` for a single-agent run: the fixed opponent (``random``,
            ``heuristic``) that an ``AgainstOpponentEnv`` plays in place of its ``env_kwargs``' one.

    Raises:
        CommandError: If none of them names an env this command can build without running
            code from the checkpoint, saying what to pass; or ``opponent`` is given for an env
            without a fixed opponent, or is not one of the fixed opponents' names.
    """
    saved = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    saved_seed = run_base_seed(checkpoint, ckpt_path)
    if env is not None:
        resolve_env(env)
        source = EnvSource(env, {}, [], "--env", saved_seed)
    elif config is not None:
        source = _env_from_config(config, saved_seed)
    else:
        origin = "the checkpoint"
        offline = _offline_env(saved, ckpt_path)
        if offline is not None:
            saved["env"], saved["env_kwargs"], named_by = offline
            origin = f"the checkpoint's {named_by}"
        problem = _why_not_rebuildable(saved)
        if problem is not None:
            raise CommandError(f"{ckpt_path}: {problem}; pass --env ID or --config your_config.yaml")
        source = EnvSource(saved["env"], dict(saved.get("env_kwargs") or {}), [], origin, saved_seed)
    return source if opponent is None else _with_opponent(source, opponent)


def _with_opponent(source: EnvSource, opponent: str) -> EnvSource:
    """``source`` playing ``opponent``: only an ``AgainstOpponentEnv`` (a two-player game as one agent) has one."""
    try:
        from lightning_rl.env.against_opponent import AgainstOpponentEnv
    except ImportError:  # without PettingZoo no env is an AgainstOpponentEnv
        AgainstOpponentEnv = None  # noqa: N806
    factory = resolve_env(source.env)
    if AgainstOpponentEnv is None or not (isinstance(factory, type) and issubclass(factory, AgainstOpponentEnv)):
        raise CommandError(
            f"--opponent plays multi-agent checkpoints (a {MULTI_AGENT_DATA_MODULE} run), and single-agent ones "
            f"whose env is lightning_rl.env.against_opponent.AgainstOpponentEnv; this run's env is {source.env}"
        )
    if opponent not in OPPONENTS:
        raise CommandError(
            f"--opponent {opponent!r}: AgainstOpponentEnv plays a fixed opponent, one of {sorted(OPPONENTS)} "
            "(another checkpoint or self is for multi-agent checkpoints)"
        )
    origin = f"{source.origin}, against the {opponent} opponent"
    return dataclasses.replace(source, env_kwargs={**source.env_kwargs, "opponent": opponent}, origin=origin)


def _why_not_rebuildable(saved: Mapping[str, Any]) -> str | None:
    """Why the checkpoint's data settings cannot name the env without importing code; ``None`` if they can."""
    env = saved.get("env")
    if env is None:
        return "it holds no data-module settings naming an env"
    if not isinstance(env, str) or ":" in env or env not in gym.registry:
        return f"its env {env!r} is not a registered gymnasium id that needs no import"
    if saved.get("wrappers") or saved.get("evaluation_wrappers"):
        return "its env has wrappers, which would have to be imported"
    return None


def _env_from_config(config: Path, saved_seed: int | None) -> EnvSource:
    section = read_data_section(config)
    env, env_kwargs, origin = section.init_args.get("env"), section.init_args.get("env_kwargs"), "--config"
    offline = _offline_env(section.init_args, f"--config {config}")
    if offline is not None:
        env, env_kwargs, named_by = offline
        origin = f"--config's {named_by}"
    if not isinstance(env, str):
        raise CommandError(f"--config {config}: its data section names no env id (env: {env!r})")
    resolve_env(env)
    wrappers = section.init_args.get("evaluation_wrappers")
    wrappers = section.init_args.get("wrappers") if wrappers is None else wrappers
    return EnvSource(
        env, dict(env_kwargs or {}), list(wrappers or []), origin, saved_seed if section.seed is None else section.seed
    )


def _offline_env(settings: Mapping[str, Any], where: str) -> tuple[str, dict[str, Any], str] | None:
    """An offline data module's evaluation env, as it evaluates: its ``evaluation_env``, else its dataset's env.

    Args:
        settings: A data module's init arguments (a checkpoint's or a config's).
        where: The checkpoint's path or ``--config <path>``, for the error.

    Returns:
        ``(env id, env kwargs, what named it)``: ``"evaluation_env"`` or ``"dataset <id>"``;
        ``None`` when ``settings`` name no ``dataset_id``, or name an ``env`` (not an
        ``OfflineDataModule``'s).

    Raises:
        CommandError: If the dataset is not stored locally (or Minari is missing), or was
            recorded in an env gymnasium does not have registered; saying to pass ``--env``.
    """
    dataset_id = settings.get("dataset_id")
    if not isinstance(dataset_id, str) or settings.get("env") is not None:
        return None
    env_kwargs = dict(settings.get("evaluation_env_kwargs") or {})
    if settings.get("evaluation_env") is not None:
        return settings["evaluation_env"], env_kwargs, "evaluation_env"
    try:
        recorded = recorded_env(open_dataset(dataset_id), env_kwargs)
    except (ImportError, ValueError) as error:
        raise CommandError(f"{where}: pass --env ID; without it the env is the one dataset {dataset_id!r} was "
                           f"recorded in, and {error}") from None  # fmt: skip
    if recorded is None:
        raise CommandError(f"{where}: dataset {dataset_id!r} was recorded in an env gymnasium has not registered; "
                           "pass --env ID")  # fmt: skip
    return *recorded, f"dataset {dataset_id}"


def play_episodes(
    policy: Policy,
    source: EnvSource,
    num_episodes: int,
    first_seed: int,
    video_dir: Path | None = None,
    num_envs: int = 1,
) -> EpisodeStats:
    """Play ``num_episodes`` greedy episodes, episode ``i`` reset with seed ``first_seed + i``.

    Up to ``num_envs`` episodes run side by side, their observations acted on in one batch;
    an env whose episode ends starts the next episode not yet begun.

    Args:
        policy: Acts with ``policy.act`` (greedy).
        source: The env.
        num_episodes: How many episodes.
        first_seed: The first episode's seed.
        video_dir: Write the first episode there as an animated GIF (:data:`VIDEO_FILE_NAME`);
            ``None`` for no video.
        num_envs: How many envs step together.

    Raises:
        CommandError: If the env's spaces do not fit the policy, or cannot be recorded.
    """
    envs: list[gym.Env] = []
    try:
        for index in range(min(num_envs, num_episodes)):
            envs.append(_make_env(source, video_dir if index == 0 else None))
        check_env_fits(envs[0], policy, source.env)
        actor = PolicyActor(policy, deterministic=True, num_envs=len(envs))
        summaries = run_episodes(envs, actor, first_seed, num_episodes, keep=_return_and_length)
        stats = EpisodeStats(
            np.array([summary[0] for summary in summaries], dtype=np.float64),
            np.array([summary[1] for summary in summaries], dtype=np.int64),
        )
        if video_dir is not None:
            _write_video(envs[0], video_dir / VIDEO_FILE_NAME)
    finally:
        for env in envs:
            env.close()
    return stats


def run_episodes(
    envs: Sequence[gym.Env],
    actor: Actor,
    first_seed: int,
    num_episodes: int,
    keep: Callable[[SingleAgentEpisode], Any] = lambda episode: episode,
) -> list[Any]:
    """Play ``num_episodes`` whole episodes in ``envs``, episode ``i`` reset with seed ``first_seed + i``.

    Up to ``len(envs)`` episodes run side by side, their observations acted on in one batch;
    an env whose episode ends starts the next episode not yet begun. What ``evaluate`` and
    ``record`` play.

    Args:
        envs: At most ``num_episodes`` envs (extra ones would start episodes past the last).
        actor: Acts for the envs still playing (``actor.act(observations [B, *obs_shape],
            rows)`` to the actions ``[B, ...]`` that are stepped, ``rows`` the envs' indices);
            told which envs start an episode (all of them first, then each env reset for the
            next episode) and each step's rewards, so that a recurrent policy keeps its
            state per env.
        first_seed: The first episode's seed.
        num_episodes: How many episodes.
        keep: What to keep of each episode once it ends (the whole episode by default); only
            the ``len(envs)`` episodes being played are held whole, so keeping less (``evaluate``
            keeps the return and length) bounds memory for long runs of large observations.

    Returns:
        ``keep`` of each episode, in the order of their seeds. An episode is list-backed: every
        observation (the reset's, then each step's, the final one included) in the stored
        layout (a Dict or Tuple observation flattened, as the env runner stores it; ``actor``
        gets the same rows), the actions stepped, the env's rewards, and whether it ended
        terminated or truncated.
    """
    # Copies: some envs return one array object at every step.
    stored = ObservationLayout(envs[0].observation_space).flatten_one
    kept: list[Any] = []
    # Only the episodes being played are held: one per env, made as each starts.
    episodes: dict[int, SingleAgentEpisode] = {index: SingleAgentEpisode() for index in range(len(envs))}
    episode_of = list(range(len(envs)))  # the episode each env plays
    observations = []
    for env, episode in zip(envs, episode_of):
        obs = stored(env.reset(seed=first_seed + episode)[0])
        episodes[episode].add_env_reset(obs)
        observations.append(obs)
    quota = EpisodeQuota(num_episodes, len(envs))
    playing = quota.envs
    actor.start_episodes(playing)
    while playing:
        actions = actor.act(np.stack([observations[index] for index in playing]), playing)
        still_playing, rewards, restarted = [], [], []
        for index, action in zip(playing, actions):
            obs, reward, terminated, truncated, _ = envs[index].step(action)
            obs = stored(obs)
            rewards.append(float(reward))
            episodes[episode_of[index]].add_env_step(
                obs, np.array(action), float(reward), terminated=terminated, truncated=truncated
            )
            if terminated or truncated:
                kept.append((episode_of[index], keep(episodes.pop(episode_of[index]))))
                if not quota.end(index):
                    continue
                episode_of[index] = quota.started - 1
                episodes[episode_of[index]] = SingleAgentEpisode()
                obs = stored(envs[index].reset(seed=first_seed + episode_of[index])[0])
                episodes[episode_of[index]].add_env_reset(obs)
                restarted.append(index)
            observations[index] = obs
            still_playing.append(index)
        # Rewards first: a restarted env's then go back to its new episode's zeros.
        actor.observe_rewards(np.array(rewards, dtype=np.float32), playing)
        if restarted:
            actor.start_episodes(restarted)
        playing = still_playing
    return [value for _, value in sorted(kept, key=lambda pair: pair[0])]


def _return_and_length(episode: SingleAgentEpisode) -> tuple[float, int]:
    """An episode's return (summed in step order, in float64) and length."""
    return sum(float(reward) for reward in episode.rewards), len(episode)


def episode_stats(episodes: Sequence[SingleAgentEpisode]) -> EpisodeStats:
    """The returns (summed in step order, in float64) and lengths of ``episodes``."""
    returns = np.array([_return_and_length(episode)[0] for episode in episodes], dtype=np.float64)
    return EpisodeStats(returns, np.array([len(episode) for episode in episodes], dtype=np.int64))


def _make_env(source: EnvSource, video_dir: Path | None) -> gym.Env:
    if video_dir is None:
        return source.make_env()
    # The recorder and encoder that write the TensorBoard evaluation videos.
    try:
        env = resolve_env(source.env)
        env_kwargs = env_kwargs_for_video(env, source.env_kwargs)
        recorder = make_env(env, env_kwargs, [*resolve_wrappers(source.wrappers), EpisodeFrameRecorder])
    except gym.error.DependencyNotInstalled as error:
        raise CommandError(f'--video: {error}; install it with pip install "lightning-rl[video]"') from error
    except ValueError as error:
        raise CommandError(f"--video: {error}") from error
    recorder.record_next_episode = True
    return recorder


def _write_video(recorder: EpisodeFrameRecorder, path: Path) -> None:
    write_gif_file(path, recorder.take_frames(), int(recorder.metadata.get("render_fps") or 30))


def check_env_fits(env: gym.Env, policy: Policy, name: str) -> None:
    """Raise ``CommandError`` if ``env``'s observation or action space differs from ``policy``'s."""
    # The same comparison a resume makes (``check_checkpoint_fits``): kind, shape, bounds, dtype.
    for kind, env_space, policy_space in (
        ("observation", env.observation_space, policy.observation_space),
        ("action", env.action_space, policy.action_space),
    ):
        if space_to_dict(env_space) != space_to_dict(policy_space):
            raise CommandError(f"wrong env: {name}'s {kind} space is {env_space}, but the policy's is {policy_space}")


def _default_video_dir(ckpt_path: str | Path) -> Path:
    location = Path(ckpt_path)
    return (location if location.is_dir() else location.parent) / "evaluation_videos"
