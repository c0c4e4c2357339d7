"""Write complete episodes as a Minari dataset (the format ``OfflineDataModule`` reads).

::

    path = write_minari_dataset(
        "pendulum/sac-medium-v0", episodes, env_id="Pendulum-v1",
        observation_space=env.observation_space, action_space=env.action_space,
        algorithm_name="SACLearner", description="...",
    )

Each episode goes to Minari as an ``EpisodeBuffer`` (``T + 1`` observations, the final one
included, and ``T`` actions, rewards, terminations and truncations) through
``minari.create_dataset_from_buffers``, which needs only h5py (Minari's ``DataCollector``
would import jax). The dataset stores the env's spec only when the env is a registered
gymnasium id without wrappers, so that ``MinariDataset.recover_environment()`` rebuilds the
very env the episodes came from; otherwise it stores the spaces alone.

A dataset is written whole or not at all: into a directory of its own inside the datasets
root first, then moved into place; an existing dataset id is refused unless ``overwrite``, and
even then the old dataset is removed only once the new one is complete.

A writer killed at any point (``kill -9``, a machine that stops) leaves nothing behind for
good: its directories are named after its host and process id
(``.lightning_rl-writing-<host>.<pid>.<random>``, as ``atomic_write``'s temporary files are),
and the next write or check of any id in that datasets root removes those of writers that no
longer run. Replacing a dataset (``overwrite``) first writes a journal
(``.lightning_rl-swap-<host>.<pid>.<random>.json``) naming the new dataset, the old one's
temporary name and the id; the next write or check finishes a swap its writer did not (moves
the complete new dataset into place, removes the old one), so the id is never left missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from lightning_rl.core.checkpoint import atomic_write, writer_tag
from lightning_rl.core.observation_layout import ObservationLayout
from lightning_rl.data.minari_io import (
    DATASETS_PATH_VARIABLE,
    REPLACED_PREFIX,
    SWAP_PREFIX,
    WRITING_PREFIX,
    datasets_root,
    recover_interrupted_writes,
    require_minari,
)
from lightning_rl.env.episode import SingleAgentEpisode

# Minari warns about every optional metadata field left out; these say nothing about the data.
_METADATA_WARNINGS = (
    r"^`(code_permalink|author|author_email|eval_env|algorithm_name|description)` is set to None|^env_spec is None"
)
# Keyword arguments of ``gym.make`` that are fields of an ``EnvSpec``, not arguments of the env.
_MAKE_SETTINGS = ("max_episode_steps", "disable_env_checker")


def check_dataset_id(dataset_id: str, *, overwrite: bool = False) -> Path:
    """Check that ``dataset_id`` is a valid Minari id that may be written; return where it will be.

    Called before recording starts, so that a typo or an existing dataset stops the command (or
    the fit) at once rather than after the episodes were played.

    Args:
        dataset_id: ``(namespace/)name-v(version)``, as ``minari.load_dataset`` takes it.
        overwrite: Whether an existing dataset of that id may be replaced.

    Raises:
        ValueError: For a malformed id, or an id that exists already without ``overwrite``.
        ImportError: If Minari is not installed (naming the extra).
    """
    require_minari()
    from minari.dataset.minari_dataset import parse_dataset_id

    recover_interrupted_writes(datasets_root())
    try:
        parse_dataset_id(dataset_id)
    except (ValueError, TypeError):  # Minari 0.5.4 raises TypeError for an id without a version
        raise ValueError(
            f"dataset id {dataset_id!r} is malformed: expected (namespace/)name-v(version), "
            "e.g. 'pendulum/sac-medium-v0'"
        ) from None
    path = datasets_root() / dataset_id
    if path.exists() and not overwrite:
        raise ValueError(
            f"a Minari dataset {dataset_id!r} exists already ({path}); pass overwrite=True (--overwrite) "
            "to replace it, or choose another id or version"
        )
    return path


def registered_env_spec(env: Any, env_kwargs: Mapping[str, Any] | None = None, wrappers: Sequence[Any] = ()) -> Any:
    """The ``gym.envs.registration.EnvSpec`` to store for ``env``, or ``None`` to store the spaces only.

    Args:
        env: What the episodes were played in: a gymnasium id (``"Pendulum-v1"``, or
            ``"module:Id"`` once the module is imported), an env factory's path or a callable.
        env_kwargs: The keyword arguments the env was made with; they go into the spec.
        wrappers: The wrappers applied to it; with any, the spec would describe another env
            than the one whose observations were recorded.

    Returns:
        The registered spec with ``env_kwargs`` added, for a registered id without wrappers;
        ``None`` otherwise.
    """
    if not isinstance(env, str) or wrappers:
        return None
    env_id = env.split(":", 1)[-1]
    if env_id not in gym.registry:
        return None
    spec = gym.spec(env_id)
    kwargs = dict(env_kwargs or {})
    # ``gym.make`` takes these itself (they are fields of the spec); the rest go to the env.
    make_settings = {name: kwargs.pop(name) for name in _MAKE_SETTINGS if name in kwargs}
    return dataclasses.replace(spec, kwargs={**spec.kwargs, **kwargs}, **make_settings)


def write_minari_dataset(
    dataset_id: str,
    episodes: Sequence[SingleAgentEpisode],
    *,
    observation_space: gym.Space,
    action_space: gym.Space,
    env_spec: Any = None,
    algorithm_name: str | None = None,
    description: str | None = None,
    author: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write complete episodes as the local Minari dataset ``dataset_id``.

    Args:
        dataset_id: The id to write, as ``minari.load_dataset`` takes it.
        episodes: Whole episodes (``t_started == 0``, terminated or truncated), with the env's
            own observations (not normalized; a Dict or Tuple observation in its flat stored
            layout, written as the dict it stands for) and the actions that were stepped.
        observation_space: The env's observation space (stored with the dataset).
        action_space: The env's action space.
        env_spec: A gymnasium ``EnvSpec`` to store (see :func:`registered_env_spec`), or
            ``None`` for datasets whose env cannot be rebuilt from the registry.
        algorithm_name: What played the episodes (Minari metadata).
        description: What the dataset holds (Minari metadata).
        author: Who made it (Minari metadata).
        overwrite: Replace an existing dataset of that id (only once the new one is written).

    Returns:
        The dataset's directory.

    Raises:
        ValueError: For a malformed or existing id (see :func:`check_dataset_id`), no
            episodes, or an episode that is not whole (a chunk, or not ended), naming it.
        ImportError: If Minari is not installed (naming the extra).
    """
    target = check_dataset_id(dataset_id, overwrite=overwrite)
    if not episodes:
        raise ValueError(f"no episodes to write to the dataset {dataset_id!r}")
    minari = require_minari()
    from minari.data_collector import EpisodeBuffer

    layout = ObservationLayout(observation_space)
    buffers = [
        EpisodeBuffer(id=index, **_episode_columns(episode, index, layout)) for index, episode in enumerate(episodes)
    ]
    root = datasets_root()
    writing_root = root / f"{writer_tag(WRITING_PREFIX)}{uuid.uuid4().hex}"
    try:
        with _datasets_root(writing_root), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_METADATA_WARNINGS, category=UserWarning)
            minari.create_dataset_from_buffers(
                dataset_id,
                buffers,
                env=env_spec,
                algorithm_name=algorithm_name,
                author=author,
                description=description,
                observation_space=observation_space,
                action_space=action_space,
                # Image observations stay exact: recorded data, not JPEG approximations of it.
                jpeg_encoding=False,
            )
        _move_into_place(writing_root / dataset_id, target, dataset_id, overwrite)
    finally:
        shutil.rmtree(writing_root, ignore_errors=True)
    return target


def _episode_columns(episode: SingleAgentEpisode, index: int, layout: ObservationLayout) -> dict[str, Any]:
    """The ``EpisodeBuffer`` fields of one whole episode (terminations and truncations per step).

    Episodes hold Dict and Tuple observations flattened; the dataset gets them as the env
    returned them (``{key: [T + 1, ...]}``), which is what its observation space says.
    """
    if episode.t_started != 0 or not episode.is_done:
        raise ValueError(
            f"episode {index} (id {episode.id_}) is not a whole episode: it starts at step {episode.t_started} "
            f"and is {'done' if episode.is_done else 'still running'}; only complete episodes are written"
        )
    num_steps = len(episode)
    if num_steps == 0:
        raise ValueError(f"episode {index} (id {episode.id_}) has no steps")
    terminations = np.zeros(num_steps, dtype=np.bool_)
    truncations = np.zeros(num_steps, dtype=np.bool_)
    terminations[-1], truncations[-1] = episode.is_terminated, episode.is_truncated
    return {
        "observations": layout.unflatten_batch(np.asarray(episode.observations)),
        "actions": np.asarray(episode.actions),
        "rewards": np.asarray(episode.rewards),
        "terminations": terminations,
        "truncations": truncations,
        "infos": {},
    }


@contextlib.contextmanager
def _datasets_root(path: Path) -> Iterator[None]:
    """Minari reads and writes under ``path`` for the block (it reads the variable at each call)."""
    before = os.environ.get(DATASETS_PATH_VARIABLE)
    os.environ[DATASETS_PATH_VARIABLE] = str(path)
    try:
        yield
    finally:
        if before is None:
            del os.environ[DATASETS_PATH_VARIABLE]
        else:
            os.environ[DATASETS_PATH_VARIABLE] = before


def _move_into_place(written: Path, target: Path, dataset_id: str, overwrite: bool) -> None:
    """Move the complete dataset ``written`` to ``target``; an old one there goes only after the move."""
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.namespace import create_namespace, list_local_namespaces

    namespace = parse_dataset_id(dataset_id)[0]
    if namespace is not None and namespace not in list_local_namespaces():
        # Minari lists datasets of a namespace only where its metadata file is.
        create_namespace(namespace)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        written.rename(target)
        return
    if not overwrite:  # written by someone else while this one was being written
        check_dataset_id(dataset_id, overwrite=False)
    random = uuid.uuid4().hex
    replaced = target.parent / f"{writer_tag(REPLACED_PREFIX)}{random}"
    # The journal comes first: whichever rename a kill stops before, the next run finishes the swap.
    journal = datasets_root() / f"{writer_tag(SWAP_PREFIX)}{random}.json"
    swap = {"target": str(target), "replaced": str(replaced), "written": str(written)}
    atomic_write(journal, lambda file: file.write(json.dumps(swap).encode()))
    target.rename(replaced)
    try:
        written.rename(target)
    except OSError:
        replaced.rename(target)
        journal.unlink(missing_ok=True)
        raise
    shutil.rmtree(replaced, ignore_errors=True)
    journal.unlink(missing_ok=True)
