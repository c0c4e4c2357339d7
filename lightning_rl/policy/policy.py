"""``Policy``: act with a trained module, from a checkpoint or a Learner, without a Trainer or an env.

    policy = Policy.from_checkpoint("lightning_logs/version_0/checkpoints/last.ckpt")
    action = policy.act(obs)                               # one observation -> one action, greedy
    actions = policy.act(batch_of_obs, deterministic=False)
    action = policy.act({"image": image, "mode": 2})       # a Dict observation, as the env returns it

Acting is :class:`PolicyNet`, a ``torch.nn.Module``: the saved observation normalization,
then :func:`~lightning_rl.core.acting.compute_actions` (what the env runner calls for training
and evaluation), then clipping Box actions to the space's bounds as the env runner does before
stepping. Export traces the same module, so a deployed graph acts exactly as ``Policy.act``.

A module on a Dict or Tuple observation space acts on the stored flat layout
(:mod:`lightning_rl.core.observation_layout`): ``Policy.act`` flattens a raw observation (a
dict, or a dict of batched arrays) as the env runner does, and also takes the flat rows
themselves, which is what :class:`PolicyNet` and an exported graph take.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from lightning_rl.core.acting import clip_actions, compute_actions
from lightning_rl.core.normalization import ObservationNormalization
from lightning_rl.core.observation_layout import ObservationLayout
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

    def forward(self, obs: torch.Tensor, explore: bool = False) -> torch.Tensor:
        """The actions for a batch of observations: greedy unless ``explore``."""
        if self.observation_normalization is not None:
            obs = self.observation_normalization(obs)
        _, actions = compute_actions(self.module, obs, explore=explore, with_logp=False)
        return clip_actions(actions, self.action_space)


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
            unsupported kind, or normalization of another shape than the observations.
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
        self._layout = _observation_layout(observation_space)
        _check_action_space(action_space)
        if observation_normalization is not None:
            _check_normalization(observation_normalization, observation_space)
        self.observation_space = observation_space
        self.action_space = action_space
        self.net = PolicyNet(module, action_space, observation_normalization)
        if observation_normalization is not None:
            observation_normalization.to(self.device)

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

    def act(self, obs: Any, deterministic: bool = True) -> Any:
        """The action(s) for one observation or a batch of them.

        Args:
            obs: One observation (the observation space's shape) or a batch ``[B, *shape]``;
                a numpy array (or anything ``np.asarray`` takes) or a tensor. For a Dict (or
                Tuple) observation space: one observation as the env returns it (a dict), a
                batch as a dict of arrays with a leading batch dimension (as a vector env
                returns it), or the stored flat layout (``[flatdim]`` or ``[B, flatdim]``,
                each row ``gym.spaces.flatten(space, obs)``).
            deterministic: The greedy action (what evaluation plays); otherwise one sampled as
                in training (PPO draws from its distribution, DQN explores with its epsilon).

        Returns:
            A numpy array for numpy input (and for a dict), a tensor (on the input's device)
            for a tensor; one action for one observation, ``[B, ...]`` for a batch (an action
            has the action space's shape: ``[k]`` int64 indices for ``MultiDiscrete``). Box
            actions lie within the space's bounds.

        Raises:
            ValueError: If the observation's shape is neither the space's nor a batch of it
                (for a dict: naming the key whose shape or value does not fit), or the batch
                is empty.
        """
        is_tensor = isinstance(obs, torch.Tensor)
        batch, single = self._as_batch(obs)
        if len(batch) == 0:
            raise ValueError("Policy.act got an empty batch of observations (shape (0, ...)); pass at least one")
        # no_grad, not inference_mode: the tensors returned stay usable in the caller's autograd code.
        with torch.no_grad():
            actions = self.net(batch, explore=not deterministic)
        if single:
            actions = actions[0]
        if is_tensor:
            return actions.to(obs.device)
        return actions.cpu().numpy()

    def _as_batch(self, obs: Any) -> tuple[torch.Tensor, bool]:
        """``obs`` as a batch tensor on the module's device in the stored dtype, and whether it was one observation."""
        if self._layout.flattens and isinstance(obs, (Mapping, tuple)):
            # A raw Dict (or Tuple) observation, or a batch of them: flattened as the env runner does.
            single = self._layout.batch_shape(obs) == ()
            flat = self._layout.flatten_one(obs)[None] if single else self._layout.flatten_batch(obs)
            return torch.as_tensor(flat, device=self.device), single
        stored = self._layout.stored_space
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
        flat = f" in the flat layout, or pass the {type(self.observation_space).__name__} observation itself"
        raise ValueError(
            f"observation of shape {tuple(tensor.shape)} does not fit the observation space {self.observation_space}: "
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
