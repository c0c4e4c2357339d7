"""The first piece of every Learner connector: the episodes' steps as columns, per module."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lightning_rl.connectors.episodes import episodes_to_batch
from lightning_rl.connectors.pipeline import ConnectorPiece, TrainBatch
from lightning_rl.core.action_masks import ACTION_MASK, is_action_masked_space
from lightning_rl.core.observation_layout import ObservationLayout
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode

if TYPE_CHECKING:
    from lightning_rl.core.metrics import MetricsLogger
    from lightning_rl.core.rl_modules import MultiRLModule

MODULE_EPISODES = "module_episodes"
"""``shared_data`` key: ``{module_id: [episodes]}``, the episodes whose steps are that
module's rows, in row order. Written by :class:`AddColumnsFromEpisodes`; pieces that compute
per-episode columns after it (GAE) read it."""


def module_episodes(shared_data: Mapping[str, Any] | None, piece: str) -> dict[str, list[Any]]:
    """``shared_data[MODULE_EPISODES]``, for a piece that computes columns per episode.

    Args:
        shared_data: The pipeline call's shared data.
        piece: The piece asking, named in the error.

    Raises:
        ValueError: Naming ``piece``, if no piece before it recorded the module episodes.
    """
    if not shared_data or MODULE_EPISODES not in shared_data:
        raise ValueError(
            f"{piece} needs shared_data[{MODULE_EPISODES!r}] (which episodes became which module's rows): put it "
            "after AddColumnsFromEpisodes in the pipeline"
        )
    return shared_data[MODULE_EPISODES]


MODULES_TO_TRAIN = "modules_to_train"
"""``shared_data`` key: the set of module ids the Learner trains in this update (its
``policies_to_train``), written by ``Learner.episodes_to_train_batch`` before the pipeline
runs. :class:`AddColumnsFromEpisodes` gives no rows to the other modules of multi-agent
episodes (a frozen league snapshot's steps cost nothing); absent, every module gets its rows."""


class AddColumnsFromEpisodes(ConnectorPiece):
    """Concatenates the steps of the episodes into columns, one batch per module.

    Each module gets ``obs``, ``actions``, ``rewards``, ``terminateds``, ``truncateds`` and
    the model outputs recorded while sampling (``action_logp``, ``action_dist_inputs``, ...),
    one row per step (see :func:`~lightning_rl.connectors.episodes.episodes_to_batch`).
    Which episodes feed which module is :meth:`episodes_per_module`'s choice, so several
    modules' rows can come from the same episodes: a multi-agent episode's agents feed the
    modules their episode maps them to, each agent's steps as one trajectory of its own (so
    GAE after this piece never runs across agents).

    Args:
        module_id: The module single-agent episodes train. ``None``: the only module of the
            Learner (an error if it has several).
        device: Where the columns go. ``None``: the device of the module's weights, read at
            every call (so it follows the Learner when a Trainer moves it).
    """

    def __init__(self, module_id: str | None = None, device: torch.device | str | None = None) -> None:
        if module_id is not None and not isinstance(module_id, str):
            raise TypeError(f"module_id must be a str or None, got {type(module_id).__name__} {module_id!r}")
        self.module_id = module_id
        self.device = None if device is None else torch.device(device)

    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        batch: TrainBatch,
        episodes: Sequence[Any],
        shared_data: dict[str, Any],
        metrics: MetricsLogger,
    ) -> TrainBatch:
        """Add each module's columns to ``batch`` and its episodes to ``shared_data[MODULE_EPISODES]``.

        ``shared_data[MODULES_TO_TRAIN]``, when present, limits the modules that get rows
        from multi-agent episodes (single-agent episodes always feed their one module).
        """
        module_episodes = self.episodes_per_module(rl_module, episodes)
        modules_to_train = shared_data.get(MODULES_TO_TRAIN)
        if modules_to_train is not None and _are_multi_agent(episodes):
            module_episodes = {mid: eps for mid, eps in module_episodes.items() if mid in modules_to_train}
        shared_data[MODULE_EPISODES] = module_episodes
        for module_id, its_episodes in module_episodes.items():
            device = self.device if self.device is not None else _weights_device(rl_module, module_id)
            batch.setdefault(module_id, {}).update(episodes_to_batch(its_episodes, device))
        return batch

    def episodes_per_module(self, rl_module: MultiRLModule, episodes: Sequence[Any]) -> dict[str, list[Any]]:
        """Which episodes become which module's rows; called once per call, before any column.

        Single-agent episodes all go to one module (``module_id``, or the only module); for a
        module on an action-mask Dict space they are first split as multi-agent ones come
        (:func:`split_action_masks`). Multi-agent episodes are split into one
        ``SingleAgentEpisode`` per agent, each going to ``episode.module_for(agent_id)``;
        agents without a step in a chunk are left out. Override it for other episode types;
        every value must be a non-empty list of ``SingleAgentEpisode``.

        Args:
            rl_module: The Learner's modules.
            episodes: The update's episodes: all single-agent or all multi-agent.

        Raises:
            ValueError: For a module id the Learner does not have (naming the agent for
                multi-agent episodes), or no ``module_id`` and a Learner with several modules
                given single-agent episodes.
            TypeError: For episodes of other types, or a mix of single- and multi-agent ones.
        """
        if _are_multi_agent(episodes):
            return _agent_episodes_per_module(rl_module, episodes)
        for index, episode in enumerate(episodes):
            if not isinstance(episode, SingleAgentEpisode):
                raise TypeError(
                    f"episode {index} is a {type(episode).__name__}; AddColumnsFromEpisodes takes a list of "
                    "SingleAgentEpisodes or a list of MultiAgentEpisodes, not a mix (override episodes_per_module "
                    "for other episode types)"
                )
        module_id = self._target_module_id(rl_module)
        space = rl_module[module_id].observation_space
        if is_action_masked_space(space):
            layout = ObservationLayout(space)
            return {module_id: [split_action_masks(episode, layout) for episode in episodes]}
        return {module_id: list(episodes)}

    def _target_module_id(self, rl_module: MultiRLModule) -> str:
        module_ids = sorted(rl_module.keys())
        if self.module_id is None:
            if len(module_ids) != 1:
                raise ValueError(
                    "single-agent episodes need one module to train: this Learner has modules "
                    f"{module_ids}; pass AddColumnsFromEpisodes(module_id=...) to choose one"
                )
            return module_ids[0]
        if self.module_id not in module_ids:
            raise ValueError(
                f"AddColumnsFromEpisodes(module_id={self.module_id!r}): the Learner has no such module; "
                f"it has {module_ids}"
            )
        return self.module_id

    def __repr__(self) -> str:
        settings = []
        if self.module_id is not None:
            settings.append(f"module_id={self.module_id!r}")
        if self.device is not None:
            settings.append(f"device={str(self.device)!r}")
        return f"AddColumnsFromEpisodes({', '.join(settings)})"


def split_action_masks(episode: SingleAgentEpisode, layout: ObservationLayout) -> SingleAgentEpisode:
    """An episode of an action-mask Dict env with its observations split from their masks.

    A single-agent env runner stores each such observation in the space's flat layout, the
    mask beside the observation part (:class:`~lightning_rl.core.observation_layout.ObservationLayout`),
    while a module on that space reads the two apart (the ``obs`` and ``action_mask``
    columns). The returned episode holds the observation parts as its observations and each
    step's mask as the ``action_mask`` model output, as the multi-agent runner records them,
    so the columns and the values (GAE) computed from it are the module's own.

    Args:
        episode: A single-agent episode whose observations are in ``layout``'s stored rows.
        layout: The layout of the module's action-mask Dict space.

    Returns:
        A new episode (numpy); ``episode`` is left as it is. An episode that records
        ``action_mask`` already (split by whoever made it) is returned as it is.
    """
    if ACTION_MASK in episode.extra_model_outputs:
        return episode
    observations, masks = layout.split_masked_batch(np.asarray(episode.observations))
    return SingleAgentEpisode(
        episode.id_,
        observations=observations,
        actions=np.asarray(episode.actions),
        rewards=np.asarray(episode.rewards, dtype=np.float32),
        infos=episode.infos or None,
        terminated=episode.is_terminated,
        truncated=episode.is_truncated,
        extra_model_outputs={**episode.extra_model_outputs, ACTION_MASK: masks[: len(episode)]},
        t_started=episode.t_started,
    )


def _are_multi_agent(episodes: Sequence[Any]) -> bool:
    return bool(episodes) and all(isinstance(episode, MultiAgentEpisode) for episode in episodes)


def _agent_episodes_per_module(
    rl_module: MultiRLModule, episodes: Sequence[MultiAgentEpisode]
) -> dict[str, list[SingleAgentEpisode]]:
    """Each module's agent episodes (those with steps), in episode order, then agent order."""
    per_module: dict[str, list[SingleAgentEpisode]] = {}
    for index, episode in enumerate(episodes):
        for agent_id, agent_episode in episode.agent_episodes.items():
            if len(agent_episode) == 0:
                continue  # the agent observed but has not completed a step in this chunk
            module_id = episode.module_for(agent_id)
            if module_id not in rl_module:
                raise ValueError(
                    f"episode {index} (id {episode.id_}) maps agent {agent_id!r} to module {module_id!r}, which the "
                    f"Learner does not have; it has {sorted(rl_module.keys())}"
                )
            per_module.setdefault(module_id, []).append(agent_episode)
    return per_module


def _weights_device(rl_module: MultiRLModule, module_id: str) -> torch.device:
    # A module without parameters or buffers (a fixed policy) has no device of its own.
    module = rl_module[module_id]
    tensor = next(module.parameters(), None)
    if tensor is None:
        tensor = next(module.buffers(), None)
    return torch.device("cpu") if tensor is None else tensor.device
