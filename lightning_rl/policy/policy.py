"""``Policy``: act with a trained module, from a checkpoint or a Learner, without a Trainer or an env.

    policy = Policy.from_checkpoint("lightning_logs/version_0/checkpoints/last.ckpt")
    action = policy.act(obs)                               # one observation -> one action, greedy
    actions = policy.act(batch_of_obs, deterministic=False)
    action = policy.act({"image": image, "mode": 2})       # a Dict observation, as the env returns it

Acting is :class:`PolicyNet`, a ``torch.nn.Module``: the saved observation normalization,
then :func:`~lightning_rl.core.acting.compute_actions` (what the env runner calls for training
and evaluation), then clipping Box actions to the space's bounds as the env runner does before
stepping. Export traces the same module, so a deployed graph acts exactly as ``Policy.act``.

A recurrent (stateful) module acts through :class:`~lightning_rl.core.acting.Acting`, as the
env runners do: ``Policy.act`` keeps each row's recurrent state (and previous action and
reward) between calls, for one episode or a batch of envs, and ``Policy.reset`` starts new
episodes::

    policy.reset()                      # new episodes in every row (the next act's batch sets how many)
    actions = policy.act(batch_of_obs)  # row i's state moves on one step
    policy.reset(rows=[2])              # env 2's episode ended: its row starts afresh

:class:`PolicyNet`'s pass of a recurrent module is a pure function for export: it takes the
packed state (and the previous actions and rewards when the module reads them) and returns
the actions and the state after the step.

A module on a Dict or Tuple observation space acts on the stored flat layout
(:mod:`lightning_rl.core.observation_layout`): ``Policy.act`` flattens a raw observation (a
dict, or a dict of batched arrays) as the env runner does, and also takes the flat rows
themselves, which is what :class:`PolicyNet` and an exported graph take.

A module on PettingZoo's masked observation space ``Dict({"action_mask": Box(0, 1, (n,)),
"observation": <space>})`` (a turn-based game's, e.g. a self-play connect-four module) acts on
observations as the env gives them, one or a batch (a dict of stacked arrays)::

    policy = Policy.from_checkpoint("last.ckpt", module_id="main")
    column = policy.act({"action_mask": mask, "observation": board})   # a legal action only

The mask goes to the module as its ``action_mask`` column, as the multi-agent runner passes it,
so greedy and sampled actions are legal; :class:`PolicyNet` takes it as ``action_mask``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from lightning_rl.core.acting import Acting, clip_actions, compute_actions
from lightning_rl.core.action_masks import (
    ACTION_MASK,
    check_maskable_action_space,
    is_action_masked_space,
    observation_part,
    split_masked_observation,
)
from lightning_rl.core.columns import Columns
from lightning_rl.core.normalization import ObservationNormalization
from lightning_rl.core.observation_layout import ObservationLayout
from lightning_rl.core.recurrent import pack_state, unpack_state
from lightning_rl.core.rl_module_specs import RLModuleSpec
from lightning_rl.core.rl_modules import MultiRLModule, RLModule
from lightning_rl.core.sharding import module_is_sharded, whole
from lightning_rl.learner.learner import Learner
from lightning_rl.policy.loading import choose_module_id, read_policy_checkpoint

# The spaces the package's modules (``core.mlp.flatten_obs``) and action distributions take.
_OBSERVATION_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.Dict, gym.spaces.Tuple)
_ACTION_SPACES = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.Box)


class PolicyNet(nn.Module):
    """Observations ``[B, *obs_shape]`` to actions ``[B, ...]``: normalization, forward pass, clipping.

    The module ``Policy.act`` runs and export traces. Observations of a Dict or Tuple space come
    in their stored flat layout, ``[B, flatdim]``.

    A recurrent module's pass takes one step from a given state, as a pure function:
    ``forward(obs, state_in, prev_actions=..., prev_rewards=...)`` returns ``(actions,
    state_out)``, the states packed ``[B, S]`` (:func:`~lightning_rl.core.recurrent.pack_state`,
    names in sorted order; ``get_initial_state()`` packed is an episode's first state).
    ``prev_actions`` (the previous step's actions, zeros at an episode's first step) and
    ``prev_rewards`` ``[B]`` (the reward after it) are read only when the module's
    ``lstm_use_prev_action`` / ``lstm_use_prev_reward`` are on (:attr:`state_inputs` names
    the inputs it takes).

    Args:
        module: The RLModule that acts.
        action_space: Box actions are clipped to its bounds.
        observation_normalization: Applied to observations first; ``None`` for none.
    """

    def __init__(
        self,
        module: RLModule,
        action_space: gym.Space,
        observation_normalization: ObservationNormalization | None = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.action_space = action_space
        self.observation_normalization = observation_normalization
        #: Whether the module carries a recurrent state.
        self.stateful = module.is_stateful()
        config = module.resolved_model_config() if self.stateful else {}
        #: The inputs after ``obs`` a recurrent pass takes: ``state_in``, then ``prev_actions`` and
        #: ``prev_rewards`` if the module reads them; empty for a feed-forward module.
        self.state_inputs: tuple[str, ...] = ()
        if self.stateful:
            reads = (("prev_actions", "lstm_use_prev_action"), ("prev_rewards", "lstm_use_prev_reward"))
            self.state_inputs = ("state_in", *(name for name, key in reads if config.get(key, False)))

    def forward(
        self,
        obs: torch.Tensor,
        state_in: torch.Tensor | None = None,
        prev_actions: torch.Tensor | None = None,
        prev_rewards: torch.Tensor | None = None,
        action_mask: torch.Tensor | None = None,
        explore: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The actions for a batch of observations: greedy unless ``explore``.

        Args:
            obs: ``[B, *obs_shape]``.
            state_in: A recurrent module's packed state ``[B, S]`` before this step.
            prev_actions: ``[B, *action_shape]``, for a module that reads them.
            prev_rewards: ``[B]``, for a module that reads them.
            action_mask: ``[B, n]``, true (or 1) where an action is legal; required by a module
                on a masked observation space (whose ``obs`` is then the observation part).
            explore: Sample actions instead of taking the most likely ones.

        Returns:
            The actions ``[B, ...]``; for a recurrent module ``(actions, state_out [B, S])``.

        Raises:
            ValueError: If a recurrent module gets no ``state_in``, or no previous actions
                or rewards it reads, or (from the module) a masked module gets no ``action_mask``.
        """
        if self.observation_normalization is not None:
            obs = self.observation_normalization(obs)
        if not self.stateful:
            _, actions = compute_actions(self.module, obs, explore=explore, with_logp=False, action_mask=action_mask)
            return clip_actions(actions, self.action_space)
        given = {"state_in": state_in, "prev_actions": prev_actions, "prev_rewards": prev_rewards}
        missing = [name for name in self.state_inputs if given[name] is None]
        if missing:
            raise ValueError(f"{type(self.module).__name__} is recurrent: its policy takes {missing} besides obs")
        columns: dict[str, Any] = {Columns.STATE_IN: unpack_state(state_in, self.module.get_initial_state())}
        if prev_actions is not None and "prev_actions" in self.state_inputs:
            columns[Columns.PREV_ACTIONS] = prev_actions.unsqueeze(1)
        if prev_rewards is not None and "prev_rewards" in self.state_inputs:
            columns[Columns.PREV_REWARDS] = prev_rewards.unsqueeze(1)
        if action_mask is not None:
            # The recurrent pass runs on a time axis of one step; the mask gets it too.
            action_mask = action_mask.unsqueeze(1)
        out, actions = compute_actions(
            self.module,
            obs.unsqueeze(1),
            explore=explore,
            with_logp=False,
            action_mask=action_mask,
            extra_columns=columns,
        )
        return clip_actions(actions.squeeze(1), self.action_space), pack_state(out[Columns.STATE_OUT])


class Policy:
    """A trained module that maps observations to actions, as Stable-Baselines3's ``predict`` does.

    Args:
        module: A single RLModule (pick one of a ``MultiRLModule`` with ``module[module_id]``).
        observation_space: The space observations come from; ``None`` for the module's own.
        action_space: The space actions go to (Discrete, MultiDiscrete or Box); ``None`` for the
            module's own.
        observation_normalization: The statistics the module was trained with; ``None`` for none.

    Raises:
        ValueError: For a ``MultiRLModule`` or a non-module, spaces missing or of an
            unsupported kind (a masked observation space with a non-``Discrete`` action
            space), or normalization of another shape than the observations.
    """

    def __init__(
        self,
        module: RLModule,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        observation_normalization: ObservationNormalization | None = None,
    ) -> None:
        if isinstance(module, MultiRLModule) or not isinstance(module, RLModule):
            raise ValueError(
                f"Policy takes one RLModule, got {type(module).__name__}; "
                "for several modules pass module[module_id] or use module_id="
            )
        observation_space = module.observation_space if observation_space is None else observation_space
        action_space = module.action_space if action_space is None else action_space
        #: Whether observations are PettingZoo's masked dicts: the mask then goes to the module
        #: as its ``action_mask`` column, and only the observation part is laid out and normalized.
        self.is_masked = is_action_masked_space(observation_space)
        if self.is_masked:
            check_maskable_action_space(action_space, "Policy")
        self._layout = _observation_layout(observation_part(observation_space))
        _check_action_space(action_space)
        if observation_normalization is not None:
            _check_normalization(observation_normalization, observation_part(observation_space))
        self.observation_space = observation_space
        self.action_space = action_space
        self.net = PolicyNet(module, action_space, observation_normalization)
        if observation_normalization is not None:
            observation_normalization.to(self.device)
        # A recurrent module's state per row of the batch it acts on; None until the first
        # act after a reset, whose batch sets the number of rows.
        self._acting: Acting | None = None

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, module_id: str | None = None, device: torch.device | str = "cpu"
    ) -> Policy:
        """The policy of any checkpoint lightning_rl writes, with the normalization it trained with.

        Args:
            path: A Lightning ``.ckpt`` file (``lightning-rl fit``, ``Trainer.fit`` with
                ``ModelCheckpoint``) or a ``save_to_path`` directory (a Learner's or a
                LearnerGroup's).
            module_id: The module to act with; ``None`` for a checkpoint with one module.
            device: Where the module runs.

        Raises:
            ValueError: One line naming the file (see ``read_policy_checkpoint``).
        """
        module, normalization, _ = read_policy_checkpoint(path, module_id)
        try:
            policy = cls(module, observation_normalization=normalization)
        except ValueError as error:
            raise ValueError(f"{os.fspath(path)}: cannot act with its policy: {error}") from error
        policy.net.to(device)
        # Acting is inference: dropout off, batch norm on its running statistics. (A policy of
        # a Learner's module acts in whatever mode the Learner keeps it.)
        policy.net.eval()
        return policy

    @classmethod
    def from_learner(
        cls,
        learner: Learner,
        module_id: str | None = None,
        observation_normalization: ObservationNormalization | None = None,
    ) -> Policy:
        """The policy of a built Learner's module, sharing its weights (later updates show).

        When the Learner's modules are sharded (FSDP2) it acts with a whole, inference-only copy
        of the module's current weights instead (gathering them is a collective call: make it
        on every rank); later updates do not show in the copy.

        Args:
            learner: A built Learner.
            module_id: The module to act with; ``None`` for a Learner with one module.
            observation_normalization: The statistics its data was normalized with, if any.

        Raises:
            ValueError: For an unbuilt Learner, or an unknown or ambiguous module id.
        """
        if not isinstance(learner, Learner):
            raise ValueError(f"from_learner takes a Learner, got {type(learner).__name__}")
        if learner.module is None:
            raise ValueError("the Learner is not built; call learner.build() first")
        module_id = choose_module_id(list(learner.module.keys()), module_id, "the Learner")
        module = learner.module[module_id]
        if module_is_sharded(learner.module):
            module = _whole_inference_copy(module)
        return cls(module, observation_normalization=observation_normalization)

    @property
    def module(self) -> RLModule:
        """The RLModule that acts."""
        return self.net.module

    @property
    def observation_normalization(self) -> ObservationNormalization | None:
        """The normalization applied to observations before the module, if any."""
        return self.net.observation_normalization

    @property
    def device(self) -> torch.device:
        """Where the module's weights are."""
        param = next(self.module.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    @property
    def is_stateful(self) -> bool:
        """Whether the module is recurrent: :meth:`act` then carries a state per row between calls."""
        return self.net.stateful

    def act(self, obs: Any, deterministic: bool = True, rows: Sequence[int] | None = None) -> Any:
        """The action(s) for one observation or a batch of them.

        A recurrent module keeps a state per row of the batch (one observation is a batch of
        one): each call moves the rows' states on one step, so consecutive calls are
        consecutive steps of the same episodes until :meth:`reset` starts new ones. The first
        call after a reset sets the number of rows; a later call with another batch size
        (without ``rows``) is an error. For a feed-forward module every call stands alone.

        Args:
            obs: One observation (the observation space's shape) or a batch ``[B, *shape]``;
                a numpy array (or anything ``np.asarray`` takes) or a tensor. For a Dict (or
                Tuple) observation space: one observation as the env returns it (a dict), a
                batch as a dict of arrays with a leading batch dimension (as a vector env
                returns it), or the stored flat layout (``[flatdim]`` or ``[B, flatdim]``,
                each row ``gym.spaces.flatten(space, obs)``).
                For a masked observation space: ``{"action_mask": m, "observation": o}`` as the
                env gives it (``m`` of shape ``[n]``), or a batch of them as one dict of stacked
                arrays (``m`` ``[B, n]``, ``o`` a batch of the observation part).
            deterministic: The greedy action (what evaluation plays); otherwise one sampled as
                in training (PPO draws from its distribution, DQN explores with its epsilon).
                With a mask, either way only legal actions.
            rows: For a recurrent module, the rows (envs) ``obs`` belongs to, when only some
                of the batch act (envs whose episodes are over); ``None`` for every row in
                order. Ignored for a feed-forward module.

        Returns:
            A numpy array for numpy input (and for a dict), a tensor (on the input's device)
            for a tensor; one action for one observation, ``[B, ...]`` for a batch (an action
            has the action space's shape: ``[k]`` int64 indices for ``MultiDiscrete``). Box
            actions lie within the space's bounds.

        Raises:
            ValueError: If the observation's shape is neither the space's nor a batch of it
                (for a dict: naming the key whose shape or value does not fit), the batch
                is empty, or (recurrent module) its size differs from the rows' without a
                :meth:`reset` in between, or ``rows`` do not fit; for a masked space, if the
                observation is not a dict of ``action_mask`` and ``observation``, or its mask
                is not ``[n]`` / ``[B, n]`` or leaves some observation no legal action.
        """
        mask = None
        if self.is_masked:
            try:
                obs, mask = split_masked_observation(obs)
            except ValueError as error:
                raise ValueError(f"Policy.act: this module is built on a masked observation space: {error}") from None
        is_tensor = isinstance(obs, torch.Tensor)
        batch, single = self._as_batch(obs)
        if len(batch) == 0:
            raise ValueError("Policy.act got an empty batch of observations (shape (0, ...)); pass at least one")
        action_mask = None if mask is None else self._mask_batch(mask, len(batch), single)
        # no_grad, not inference_mode: the tensors returned stay usable in the caller's autograd code.
        with torch.no_grad():
            if self.is_stateful:
                actions = self._act_with_state(batch, explore=not deterministic, rows=rows, action_mask=action_mask)
            else:
                actions = self.net(batch, action_mask=action_mask, explore=not deterministic)
        if single:
            actions = actions[0]
        if is_tensor:
            return actions.to(obs.device)
        return actions.cpu().numpy()

    def reset(self, rows: Sequence[int] | None = None) -> None:
        """Start new episodes: a recurrent module's rows go back to the initial state (no-op for a feed-forward one).

        Args:
            rows: The rows whose episode starts (envs that were reset); ``None`` for every
                row, after which the next :meth:`act` may take a batch of another size.
        """
        if self._acting is None:
            return
        if rows is None:
            self._acting = None
        else:
            self._acting.start_episodes(self._row_index(rows))

    def observe_rewards(self, rewards: Any, rows: Sequence[int] | None = None) -> None:
        """Tell a recurrent module the rewards of the step just taken (read with ``lstm_use_prev_reward`` only).

        Args:
            rewards: ``[B]`` rewards of ``rows``, after the actions of the latest :meth:`act`.
            rows: As in :meth:`act`.
        """
        if self._acting is not None:
            index = None if rows is None else self._row_index(rows)
            self._acting.observe_rewards(np.asarray(rewards, dtype=np.float32).reshape(-1), index)

    def _act_with_state(
        self,
        batch: torch.Tensor,
        *,
        explore: bool,
        rows: Sequence[int] | None,
        action_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`act` of a recurrent module: ``rows`` step their states on through :class:`Acting`."""
        if self._acting is None:
            if rows is not None and list(rows) != list(range(len(batch))):
                raise ValueError(
                    f"Policy.act got rows={list(rows)} before its rows were set: the first act after reset() "
                    "acts for the whole batch"
                )
            self._acting = Acting(self.module, len(batch))
        index = None
        if rows is None:
            if len(batch) != self._acting.num_rows:
                raise ValueError(
                    f"Policy.act got a batch of {len(batch)} observations, but this recurrent policy acts for "
                    f"{self._acting.num_rows} rows (the batch size of its first act since reset()); call "
                    "policy.reset() to start new episodes with another batch size, or pass rows= for a subset"
                )
        else:
            index = self._row_index(rows)
            if len(index) != len(batch):
                raise ValueError(f"Policy.act got {len(batch)} observations for {len(index)} rows")
        if self.observation_normalization is not None:
            batch = self.observation_normalization(batch)
        _, actions = self._acting.act(batch, explore=explore, rows=index, action_mask=action_mask, with_logp=False)
        return clip_actions(actions, self.action_space)

    def _mask_batch(self, mask: Any, batch_size: int, single: bool) -> torch.Tensor:
        """``mask`` as a bool ``[B, n]`` tensor on the module's device, checked against the observations.

        Checked here rather than left to the module: a mask of the wrong width would fail deep
        in the forward pass, and a row with no legal action would silently "choose" an
        illegal one (every logit masked alike).

        Args:
            mask: ``[n]`` for one observation, ``[B, n]`` for a batch (bool or 0/1 values).
            batch_size: ``B``, the number of observations.
            single: Whether the observation part was one observation.

        Raises:
            ValueError: If the shape is not ``[n]`` (``[B, n]``) or some row allows no action.
        """
        tensor = mask if isinstance(mask, torch.Tensor) else torch.as_tensor(np.asarray(mask))
        tensor = tensor.to(device=self.device).bool()
        width = int(self.action_space.n)
        expected = (width,) if single else (batch_size, width)
        if tuple(tensor.shape) != expected:
            raise ValueError(
                f"Policy.act: {ACTION_MASK!r} has shape {tuple(tensor.shape)}, expected {expected}: one value per "
                f"action of {self.action_space}" + ("" if single else f" for each of the {batch_size} observations")
            )
        tensor = tensor.reshape(-1, width)
        empty = (~tensor.any(dim=1)).nonzero().flatten().tolist()
        if empty:
            where = "the observation" if single else f"observation(s) {empty}"
            raise ValueError(f"Policy.act: {ACTION_MASK!r} allows no action for {where}; at least one must be legal")
        return tensor

    def _row_index(self, rows: Sequence[int]) -> torch.Tensor:
        index = torch.as_tensor(list(rows), dtype=torch.long).reshape(-1)
        num_rows = self._acting.num_rows if self._acting is not None else 0
        if len(index) and (int(index.min()) < 0 or int(index.max()) >= num_rows):
            raise ValueError(f"rows {index.tolist()} out of range: this recurrent policy acts for {num_rows} rows")
        return index.to(self.device)

    def _as_batch(self, obs: Any) -> tuple[torch.Tensor, bool]:
        """``obs`` as a batch tensor on the module's device in the stored dtype, and whether it was one observation."""
        if self._layout.flattens and isinstance(obs, (Mapping, tuple)):
            # A raw Dict (or Tuple) observation, or a batch of them: flattened as the env runner does.
            single = self._layout.batch_shape(obs) == ()
            flat = self._layout.flatten_one(obs)[None] if single else self._layout.flatten_batch(obs)
            return torch.as_tensor(flat, device=self.device), single
        stored = self._layout.stored_space
        space = observation_part(self.observation_space)
        if isinstance(obs, torch.Tensor):
            torch_dtype = torch.from_numpy(np.empty(0, stored.dtype)).dtype  # the space's numpy dtype as torch's
            tensor = obs.to(device=self.device, dtype=torch_dtype)
        else:
            tensor = torch.as_tensor(np.asarray(obs, dtype=stored.dtype), device=self.device)
        shape = tuple(stored.shape)
        if tuple(tensor.shape) == shape:
            return tensor.unsqueeze(0), True
        if tensor.dim() == len(shape) + 1 and tuple(tensor.shape[1:]) == shape:
            return tensor, False
        # A Dict's (Tuple's) stored layout, the shape above, is one accepted form; the raw observation the other.
        flat = f" in the flat layout, or pass the {type(space).__name__} observation itself"
        raise ValueError(
            f"observation of shape {tuple(tensor.shape)} does not fit the observation space {space}: "
            f"expected {shape} for one observation or (batch, {', '.join(map(str, shape))}) for a batch"
            + (flat if self._layout.flattens else "")
        )

    def __repr__(self) -> str:
        normalized = ", normalized observations" if self.observation_normalization is not None else ""
        return f"Policy({type(self.module).__name__}, {self.observation_space} -> {self.action_space}{normalized})"


def _observation_layout(observation_space: Any) -> ObservationLayout:
    if not isinstance(observation_space, _OBSERVATION_SPACES):
        raise ValueError(f"Policy needs a Box, Discrete, Dict or Tuple observation space, got {observation_space!r}")
    try:
        return ObservationLayout(observation_space)
    except ValueError as error:
        raise ValueError(f"Policy cannot act on this observation space: {error}") from None


def _check_action_space(action_space: Any) -> None:
    if not isinstance(action_space, _ACTION_SPACES):
        raise ValueError(f"Policy needs a Discrete, MultiDiscrete or Box action space, got {action_space!r}")


def _check_normalization(normalization: Any, observation_space: gym.Space) -> None:
    if not isinstance(normalization, ObservationNormalization):
        raise ValueError(
            f"observation_normalization must be an ObservationNormalization, got {type(normalization).__name__}"
        )
    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(f"observation_normalization needs a Box observation space, got {observation_space!r}")
    if tuple(normalization.mean.shape) != tuple(observation_space.shape):
        raise ValueError(
            f"observation_normalization has shape {tuple(normalization.mean.shape)}, "
            f"but the observation space has {tuple(observation_space.shape)}"
        )


def _whole_inference_copy(module: RLModule) -> RLModule:
    """An inference-only module of ``module``'s class with its whole weights (a collective call if sharded)."""
    # The copy's random initial weights are overwritten: drawing them must not move the global RNG.
    with torch.random.fork_rng(devices=[]):
        copy = RLModuleSpec(
            module_class=type(module),
            observation_space=module.observation_space,
            action_space=module.action_space,
            model_config=dict(module.model_config),
            inference_only=True,
        ).build()
    wanted = copy.state_dict().keys()
    copy.load_state_dict({name: whole(tensor) for name, tensor in module.state_dict().items() if name in wanted})
    device = next(iter(module.parameters())).device
    return copy.to(device).train(module.training)
