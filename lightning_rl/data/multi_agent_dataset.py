"""Multi-agent episodes on disk: a directory of one compressed ``.npz`` per episode and a ``metadata.json``.

Minari has no multi-agent format, so ``lightning-rl record`` writes multi-agent episodes as
plain numpy archives any tool reads (``np.load``, no pickle), one per episode, and a JSON file
that says what they are::

    DIR/
      metadata.json        the format and its version, the env, its agents and their spaces,
                           how the episodes were played, and one entry per episode
      episode_000000.npz   "<agent>/observations", "<agent>/actions", ... for each agent
      episode_000001.npz
      ...

Each agent's arrays are on the agent's own timeline (a turn-based game's agent has a step only
where it moved; see :class:`~lightning_rl.env.multi_agent_episode.MultiAgentEpisode`):

- ``observations`` ``[T + 1, ...]``: every observation the agent got, the final one included
  (for PettingZoo's masked Dict observations, the ``observation`` part);
- ``action_masks`` ``[T, n]``: the legal moves at each step it acted (masked spaces only);
- ``actions`` ``[T, ...]``, ``rewards`` ``[T]`` (the reward summed until it observed again);
- ``terminations`` / ``truncations`` ``[T]``: ``True`` at the agent's last step if its
  episode ended that way (Minari's convention).

An episode's metadata entry names its file, the module each agent (seat) was played by
(``agent_modules``), each agent's return, its env steps and how it ended.
:func:`load_multi_agent_dataset` reads it all back.

A dataset is written whole or not at all: into a hidden directory beside the target first,
then renamed into place; an existing one is replaced only with ``overwrite``, moved aside
before the new one moves in and removed after.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from lightning_rl.core.action_masks import ACTION_MASK
from lightning_rl.core.checkpoint import writer_is_gone, writer_tag
from lightning_rl.core.spaces import space_from_dict, space_to_dict
from lightning_rl.env.multi_agent_episode import AgentID, ModuleID, MultiAgentEpisode

#: The ``format`` field of ``metadata.json``.
FORMAT_NAME = "lightning_rl.multi_agent_episodes"
#: The ``format_version`` this module writes and reads.
FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
#: The arrays each agent has in an episode file, ``action_masks`` only for masked observations.
AGENT_ARRAYS = ("observations", "action_masks", "actions", "rewards", "terminations", "truncations")
_WRITING_PREFIX = ".lightning_rl-writing-"
_REPLACED_PREFIX = ".lightning_rl-replaced-"
# The metadata keys the format writes itself.
_RESERVED_KEYS = frozenset(
    {"format", "format_version", "possible_agents", "observation_spaces", "action_spaces", "num_episodes", "episodes"}
)


@dataclasses.dataclass(frozen=True)
class AgentTrajectory:
    """One agent's steps in one episode (see the module docstring for the shapes).

    Attributes:
        module_id: The module that played this agent (its seat) in the episode.
        observations: ``[T + 1, ...]``.
        action_masks: ``[T, n]``, or ``None`` for an unmasked observation space.
        actions: ``[T, ...]``.
        rewards: ``[T]`` float32.
        terminations: ``[T]`` bool.
        truncations: ``[T]`` bool.
    """

    module_id: ModuleID
    observations: np.ndarray
    action_masks: np.ndarray | None
    actions: np.ndarray
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray


@dataclasses.dataclass(frozen=True)
class RecordedEpisode:
    """One multi-agent episode: its metadata entry and each agent's trajectory, in the order the agents joined."""

    metadata: dict[str, Any]
    agents: dict[AgentID, AgentTrajectory]


@dataclasses.dataclass(frozen=True)
class MultiAgentDataset:
    """What :func:`load_multi_agent_dataset` returns.

    Attributes:
        metadata: ``metadata.json`` as written (the ``episodes`` entries included).
        episodes: Every episode, in the order written.
        observation_spaces: ``{agent: space}``, as the env gave them (a masked Dict included).
        action_spaces: ``{agent: space}``.
    """

    metadata: dict[str, Any]
    episodes: list[RecordedEpisode]
    observation_spaces: dict[AgentID, gym.Space]
    action_spaces: dict[AgentID, gym.Space]


def agent_trajectories(episode: MultiAgentEpisode) -> dict[AgentID, AgentTrajectory]:
    """Each agent's arrays of a complete numpy :class:`MultiAgentEpisode`, as they are stored.

    Raises:
        ValueError: If the episode is not done, or starts after its env's reset (a chunk).
    """
    if not episode.is_done or episode.env_t_started != 0:
        raise ValueError(f"episode {episode.id_}: only complete episodes are recorded (got {episode!r})")
    episode.to_numpy()
    trajectories = {}
    for agent_id, agent_episode in episode.agent_episodes.items():
        steps = len(agent_episode)
        last = np.zeros(steps, dtype=bool)
        if steps:
            last[-1] = True
        masks = agent_episode.extra_model_outputs.get(ACTION_MASK)
        trajectories[agent_id] = AgentTrajectory(
            module_id=episode.module_for(agent_id),
            observations=np.asarray(agent_episode.observations),
            action_masks=None if masks is None else np.asarray(masks),
            actions=np.asarray(agent_episode.actions),
            rewards=np.asarray(agent_episode.rewards, dtype=np.float32),
            terminations=last & agent_episode.is_terminated,
            truncations=last & agent_episode.is_truncated,
        )
    return trajectories


def write_multi_agent_dataset(
    path: str | Path,
    episodes: Sequence[MultiAgentEpisode],
    *,
    observation_spaces: Mapping[AgentID, gym.Space],
    action_spaces: Mapping[AgentID, gym.Space],
    info: Mapping[str, Any],
    overwrite: bool = False,
) -> Path:
    """Write complete multi-agent episodes as the directory ``path`` (see the module docstring).

    Args:
        path: The directory to write; its parent must exist.
        episodes: Complete numpy episodes.
        observation_spaces: ``{agent: space}`` of every possible agent, in the env's order.
        action_spaces: ``{agent: space}``.
        info: Plain JSON data about how the episodes were played (env, checkpoint, seeds...),
            stored in ``metadata.json`` beside the format's own keys.
        overwrite: Replace an existing ``path``.

    Returns:
        ``path``.

    Raises:
        ValueError: For no episodes, a running episode, ``info`` setting one of the format's
            own keys, an existing ``path`` without ``overwrite``, or a missing parent directory.
    """
    target = Path(path)
    if not episodes:
        raise ValueError(f"{target}: no episodes to write")
    reserved = sorted(set(info) & _RESERVED_KEYS)
    if reserved:
        raise ValueError(f"{target}: info may not set {reserved}, which the format itself writes")
    check_output_directory(target, overwrite=overwrite)
    entries = []
    stage = target.parent / f"{writer_tag(_WRITING_PREFIX)}{target.name}"
    stage.mkdir()
    try:
        for index, episode in enumerate(episodes):
            trajectories = agent_trajectories(episode)
            file_name = f"episode_{index:06d}.npz"
            np.savez_compressed(stage / file_name, **_arrays(trajectories))
            entries.append(
                {
                    "file": file_name,
                    "id": episode.id_,
                    "env_steps": episode.env_steps(),
                    "agent_modules": {agent: t.module_id for agent, t in trajectories.items()},
                    "agent_returns": {
                        agent: float(t.rewards.sum(dtype=np.float64)) for agent, t in trajectories.items()
                    },
                    "terminated": bool(episode.is_terminated),
                    "truncated": bool(episode.is_truncated),
                }
            )
        metadata = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            **dict(info),
            "possible_agents": list(observation_spaces),
            "observation_spaces": {agent: space_to_dict(space) for agent, space in observation_spaces.items()},
            "action_spaces": {agent: space_to_dict(action_spaces[agent]) for agent in observation_spaces},
            "num_episodes": len(entries),
            "episodes": entries,
        }
        (stage / METADATA_FILE).write_text(json.dumps(metadata, indent=2))
        # The old dataset moves aside first and is removed last: the path always holds a whole one.
        replaced = target.parent / f"{writer_tag(_REPLACED_PREFIX)}{target.name}"
        if target.exists():
            target.rename(replaced)
        stage.rename(target)
        shutil.rmtree(replaced, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return target


def check_output_directory(path: Path, *, overwrite: bool) -> None:
    """Refuse to write ``path`` if it exists (unless ``overwrite``, and then only a dataset) or its parent does not.

    A write of ``path`` that a killed process left part way is finished or undone first
    (:func:`recover_interrupted_write`).

    Raises:
        ValueError: Naming ``path`` and the problem.
    """
    if not path.parent.is_dir():
        raise ValueError(f"{path}: its directory {path.parent} does not exist")
    recover_interrupted_write(path)
    if path.exists():
        if not overwrite:
            raise ValueError(f"{path} exists; pass --overwrite to replace it")
        if not (path / METADATA_FILE).is_file():
            raise ValueError(f"{path} exists and is not a multi-agent dataset ({METADATA_FILE} missing): not replaced")


def recover_interrupted_write(path: Path) -> list[str]:
    """Finish or undo a write of the dataset ``path`` whose writer was killed, and sweep what it left.

    :func:`write_multi_agent_dataset` writes a staging directory, moves an old dataset aside,
    moves the staging directory in, and removes the old one; both directories beside ``path``
    carry their writer's host and process id (``writer_tag``). Only those of a process of this
    host that no longer runs are touched. If ``path`` is missing, a complete staging directory
    (its ``metadata.json`` is written last) takes its place, else the old dataset moves back;
    what is left is removed.

    Returns:
        One line per thing done (for logs and tests).
    """
    def left_by_a_gone_writer(prefix: str) -> list[Path]:
        return [
            Path(entry.path)
            for entry in os.scandir(path.parent)
            if writer_is_gone(entry.name, prefix) and entry.name[len(prefix) :].split(".", 2)[2] == path.name
        ]

    staged, replaced = left_by_a_gone_writer(_WRITING_PREFIX), left_by_a_gone_writer(_REPLACED_PREFIX)
    done = []
    if not path.exists():
        complete = [stage for stage in staged if (stage / METADATA_FILE).is_file()]
        if complete:
            complete[0].rename(path)
            staged.remove(complete[0])
            done.append(f"{path}: moved the new dataset a killed writer had finished into place")
        elif replaced:
            replaced[0].rename(path)
            replaced.pop(0)
            done.append(f"{path}: restored the dataset a killed writer was replacing")
    for leftover in staged + replaced:
        shutil.rmtree(leftover, ignore_errors=True)
        done.append(f"removed {leftover} (its writer no longer runs)")
    return done


def load_multi_agent_dataset(path: str | Path) -> MultiAgentDataset:
    """Read a directory :func:`write_multi_agent_dataset` wrote (numpy arrays and JSON only, no pickle).

    Raises:
        ValueError: Naming the directory, if it is not such a dataset (another format or version)
            or an episode file lacks an agent's arrays.
    """
    root = Path(path)
    if root.parent.is_dir():
        recover_interrupted_write(root)
    try:
        metadata = json.loads((root / METADATA_FILE).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{root}: cannot read its {METADATA_FILE}: {error}") from error
    if metadata.get("format") != FORMAT_NAME or metadata.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{root}: not a {FORMAT_NAME} dataset of version {FORMAT_VERSION} (format {metadata.get('format')!r}, "
            f"version {metadata.get('format_version')!r})"
        )
    episodes = []
    for entry in metadata["episodes"]:
        with np.load(root / entry["file"], allow_pickle=False) as arrays:
            agents = {}
            for agent, module_id in entry["agent_modules"].items():
                missing = [name for name in AGENT_ARRAYS if name != "action_masks" and f"{agent}/{name}" not in arrays]
                if missing:
                    raise ValueError(f"{root / entry['file']}: agent {agent!r} has no arrays {missing}")
                masks = f"{agent}/action_masks"
                agents[agent] = AgentTrajectory(
                    module_id=module_id,
                    observations=arrays[f"{agent}/observations"],
                    action_masks=arrays[masks] if masks in arrays else None,
                    actions=arrays[f"{agent}/actions"],
                    rewards=arrays[f"{agent}/rewards"],
                    terminations=arrays[f"{agent}/terminations"],
                    truncations=arrays[f"{agent}/truncations"],
                )
        episodes.append(RecordedEpisode(entry, agents))
    return MultiAgentDataset(
        metadata,
        episodes,
        {agent: space_from_dict(space) for agent, space in metadata["observation_spaces"].items()},
        {agent: space_from_dict(space) for agent, space in metadata["action_spaces"].items()},
    )


def _arrays(trajectories: Mapping[AgentID, AgentTrajectory]) -> dict[str, np.ndarray]:
    """The episode file's arrays: ``"<agent>/<name>"`` for each agent and each of :data:`AGENT_ARRAYS` it has."""
    arrays = {}
    for agent, trajectory in trajectories.items():
        for name in AGENT_ARRAYS:
            value = getattr(trajectory, name)
            if value is not None:
                arrays[f"{agent}/{name}"] = value
    return arrays
