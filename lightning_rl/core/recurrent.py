"""Recurrent modules: the ``model_config`` keys, the LSTM/GRU core, and a state's two layouts.

A *stateful* RLModule (``is_stateful()``, a non-empty ``get_initial_state()``) carries a
recurrent state from one env step to the next. Its three passes take batches with a time axis:

- ``obs``: ``[B, T, ...]`` (acting passes ``T = 1``; training passes sequences of up to
  ``max_seq_len`` steps, zero-padded, with ``loss_mask [B, T]``);
- ``state_in``: ``{name: Tensor[B, ...]}``, each row's state before its first step;
- ``prev_actions`` ``[B, T, ...]`` and ``prev_rewards`` ``[B, T]``: the action taken and the
  reward received just before each step (zeros at an episode's first step), which a module
  reads when ``lstm_use_prev_action`` / ``lstm_use_prev_reward`` are on.

and return outputs with the same ``[B, T]`` leading axes plus ``state_out``, the state after
each row's last step (RLlib's ``Columns.STATE_IN`` / ``STATE_OUT`` contract).

A state is a dict of tensors inside a module and one flat float vector per row where it is
stored (episodes, rollout buffers, train batches): :func:`pack_state` and :func:`unpack_state`
convert, in the fixed order of the sorted names.

:class:`RecurrentCore` is the LSTM (or GRU) the algorithm modules put between their observation
encoder and their MLPs, as RLlib's ``use_lstm`` and CleanRL's LSTM PPO do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import torch
from torch import Tensor, nn

from lightning_rl.core.action_masks import observation_part
from lightning_rl.core.module_checks import ModelConfigKey
from lightning_rl.core.observation_layout import stored_observation_space

if TYPE_CHECKING:
    from lightning_rl.core.rl_modules import RLModule

RECURRENT_CELLS: tuple[str, ...] = ("lstm", "gru")
"""The values of ``recurrent_cell``."""

DEFAULT_MAX_SEQ_LEN = 20
"""RLlib's default ``max_seq_len``: the longest sequence a stateful module trains on."""

DEFAULT_LSTM_CELL_SIZE = 256
"""RLlib's default ``lstm_cell_size``."""

RECURRENT_KEYS: dict[str, ModelConfigKey] = {
    "use_lstm": ModelConfigKey.flag(False),
    "recurrent_cell": ModelConfigKey.choice("lstm", RECURRENT_CELLS),
    "lstm_cell_size": ModelConfigKey(
        DEFAULT_LSTM_CELL_SIZE, "an int >= 1 (the recurrent cell's size)", lambda value: _is_positive_int(value)
    ),
    "max_seq_len": ModelConfigKey(
        DEFAULT_MAX_SEQ_LEN,
        "an int >= 1 (the longest training sequence, in env steps)",
        lambda value: _is_positive_int(value),
    ),
    "lstm_use_prev_action": ModelConfigKey.flag(False),
    "lstm_use_prev_reward": ModelConfigKey.flag(False),
}
"""The ``model_config`` keys of a module that can be recurrent (PPO, BC, MARWIL):

- ``use_lstm``: put a recurrent core between the observation encoder and the MLPs (default ``False``);
- ``recurrent_cell``: ``"lstm"`` (default) or ``"gru"``;
- ``lstm_cell_size``: the core's hidden size (default 256);
- ``max_seq_len``: the longest sequence the Learner cuts episodes into (default 20);
- ``lstm_use_prev_action`` / ``lstm_use_prev_reward``: feed the core the previous action
  (one-hot for discrete actions) and reward besides the observation features (default ``False``).
"""


def is_recurrent_config(model_config: Mapping[str, Any]) -> bool:
    """Whether a (resolved) ``model_config`` asks for a recurrent core."""
    return bool(model_config.get("use_lstm", False))


def max_seq_len_of(module: RLModule) -> int:
    """The sequence length a stateful module trains on: its ``max_seq_len`` key, or the default.

    Args:
        module: An RLModule; a class that does not declare ``max_seq_len`` gets :data:`DEFAULT_MAX_SEQ_LEN`.
    """
    return int(module.resolved_model_config().get("max_seq_len", DEFAULT_MAX_SEQ_LEN))


class RecurrentCore(nn.Module):
    """An LSTM or GRU over features ``[B, T, F]``, from a given state, with optional previous actions and rewards.

    Weights start orthogonal (gain 1) with zero biases, as in CleanRL's LSTM PPO.

    Args:
        in_dim: Size of the features per step.
        config: A resolved ``model_config`` with the :data:`RECURRENT_KEYS`.
        action_space: The module's action space; its actions are one-hot (``Discrete``,
            ``MultiDiscrete``) or flattened (``Box``) when ``lstm_use_prev_action`` is on.
        prefix: Put before the state's names (``"h"``, ``"c"``), so that two cores of one
            module (a policy's and a value function's) keep states of their own.
    """

    def __init__(self, in_dim: int, config: Mapping[str, Any], action_space: gym.Space, prefix: str = "") -> None:
        super().__init__()
        self.cell_size = int(config["lstm_cell_size"])
        self.is_lstm = config["recurrent_cell"] == "lstm"
        self.action_space = action_space
        self.use_prev_action = bool(config["lstm_use_prev_action"])
        self.use_prev_reward = bool(config["lstm_use_prev_reward"])
        input_size = in_dim + (action_input_dim(action_space) if self.use_prev_action else 0) + int(self.use_prev_reward)
        rnn_class = nn.LSTM if self.is_lstm else nn.GRU
        self.rnn = rnn_class(input_size, self.cell_size, batch_first=True)
        self.state_names = (f"{prefix}h", f"{prefix}c") if self.is_lstm else (f"{prefix}h",)
        for name, param in self.rnn.named_parameters():
            if name.startswith("weight"):
                nn.init.orthogonal_(param, 1.0)
            else:
                nn.init.zeros_(param)

    @property
    def out_dim(self) -> int:
        """Size of the core's output per step."""
        return self.cell_size

    def initial_state(self) -> dict[str, Tensor]:
        """Zeros ``[cell_size]`` under each of this core's state names (no batch axis)."""
        weight = next(self.rnn.parameters())
        return {name: torch.zeros(self.cell_size, dtype=weight.dtype, device=weight.device) for name in self.state_names}

    def forward(self, features: Tensor, batch: Mapping[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        """Run the cell over ``features`` from ``batch["state_in"]``.

        Args:
            features: ``[B, T, in_dim]``.
            batch: The pass's batch: ``state_in`` (with this core's names, ``[B, cell_size]``
                each), and ``prev_actions`` / ``prev_rewards`` when the core uses them.

        Returns:
            The outputs ``[B, T, cell_size]`` and the state after the last step, ``{name: [B, cell_size]}``.

        Raises:
            ValueError: If the batch lacks the state, or a previous-step column the core needs.
        """
        state_in = batch.get("state_in")
        if not isinstance(state_in, Mapping) or any(name not in state_in for name in self.state_names):
            have = sorted(state_in) if isinstance(state_in, Mapping) else type(state_in).__name__
            raise ValueError(
                f"a recurrent module's batch needs 'state_in' with the names {list(self.state_names)} "
                f"({{name: Tensor[B, {self.cell_size}]}}); got {have}"
            )
        inputs = [features]
        if self.use_prev_action:
            inputs.append(action_inputs(_column(batch, "prev_actions"), self.action_space).to(features.dtype))
        if self.use_prev_reward:
            inputs.append(_column(batch, "prev_rewards").to(features.dtype).unsqueeze(-1))
        x = torch.cat(inputs, dim=-1) if len(inputs) > 1 else features
        if x.shape[1] == 1:
            return self._one_step(x, state_in)
        h = state_in[self.state_names[0]].unsqueeze(0).to(x.dtype).contiguous()
        if self.is_lstm:
            c = state_in[self.state_names[1]].unsqueeze(0).to(x.dtype).contiguous()
            out, (h, c) = self.rnn(x, (h, c))
            return out, {self.state_names[0]: h.squeeze(0), self.state_names[1]: c.squeeze(0)}
        out, h = self.rnn(x, h)
        return out, {self.state_names[0]: h.squeeze(0)}

    def _one_step(self, x: Tensor, state_in: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        # Acting steps one env step at a time: the cell function on the layer's own weights does
        # the same math as the layer without its per-call set-up, a third of acting's cost.
        rnn = self.rnn
        weights = (rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0)
        h = state_in[self.state_names[0]].to(x.dtype)
        if self.is_lstm:
            c = state_in[self.state_names[1]].to(x.dtype)
            h, c = torch.lstm_cell(x[:, 0], (h, c), *weights)
            return h.unsqueeze(1), {self.state_names[0]: h, self.state_names[1]: c}
        h = torch.gru_cell(x[:, 0], h, *weights)
        return h.unsqueeze(1), {self.state_names[0]: h}


def action_input_dim(action_space: gym.Space) -> int:
    """How many numbers :func:`action_inputs` makes of one action of ``action_space``.

    Raises:
        ValueError: For a space other than ``Discrete``, ``MultiDiscrete`` or ``Box``.
    """
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return int(action_space.nvec.sum())
    if isinstance(action_space, gym.spaces.Box):
        return int(math.prod(action_space.shape))
    raise ValueError(f"lstm_use_prev_action takes Discrete, MultiDiscrete or Box actions, got {action_space}")


def action_inputs(actions: Tensor, action_space: gym.Space) -> Tensor:
    """Actions ``[B, T, ...]`` as float inputs ``[B, T, action_input_dim]``: one-hot for discrete spaces."""
    if isinstance(action_space, gym.spaces.Discrete):
        return nn.functional.one_hot(actions.long().clamp(0, int(action_space.n) - 1), int(action_space.n)).float()
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        parts = [
            nn.functional.one_hot(actions[..., index].long().clamp(0, int(n) - 1), int(n)).float()
            for index, n in enumerate(action_space.nvec.reshape(-1))
        ]
        return torch.cat(parts, dim=-1)
    return actions.reshape(*actions.shape[:2], -1).float()


def pack_state(state: Mapping[str, Tensor]) -> Tensor:
    """A state ``{name: Tensor[B, ...]}`` as one float vector per row, ``[B, S]``, names in sorted order."""
    return torch.cat([state[name].reshape(state[name].shape[0], -1) for name in sorted(state)], dim=1)


def unpack_state(packed: Tensor, template: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of :func:`pack_state`.

    Args:
        packed: ``[B, S]``.
        template: The module's ``get_initial_state()`` (shapes without the batch axis).

    Raises:
        ValueError: If ``S`` is not the template's total size.
    """
    names = sorted(template)
    sizes = [template[name].numel() for name in names]
    if packed.shape[-1] != sum(sizes):
        raise ValueError(
            f"a packed state of {packed.shape[-1]} numbers per row does not fit the module's state "
            f"{ {name: tuple(template[name].shape) for name in names} } ({sum(sizes)} numbers)"
        )
    parts = torch.split(packed, sizes, dim=-1)
    return {
        name: part.reshape(*packed.shape[:-1], *template[name].shape) for name, part in zip(names, parts)
    }


def batched_initial_state(module: RLModule, batch_size: int) -> dict[str, Tensor]:
    """``module.get_initial_state()`` repeated for ``batch_size`` rows, ``{name: [batch_size, ...]}``."""
    return repeat_state(module.get_initial_state(), batch_size)


def repeat_state(state: dict[str, Tensor], batch_size: int) -> dict[str, Tensor]:
    """One row's state ``{name: [...]}`` repeated for ``batch_size`` rows, ``{name: [batch_size, ...]}`` (copies)."""
    return {name: value.unsqueeze(0).expand(batch_size, *value.shape).clone() for name, value in state.items()}


def encode_steps(encoder: nn.Module, obs: Tensor) -> Tensor:
    """Run a per-step observation encoder over ``obs [B, T, ...]``: features ``[B, T, out_dim]``.

    The encoder (a CNN, a Dict encoder, ...) sees ``[B * T, ...]``, one row per step, as a
    feed-forward module's encoder does; the recurrent core then runs over the time axis.
    """
    steps = obs.reshape(obs.shape[0] * obs.shape[1], *obs.shape[2:])
    return encoder(steps).reshape(obs.shape[0], obs.shape[1], -1)


def check_has_time_axis(obs: Tensor, observation_space: gym.Space, owner: str) -> None:
    """Raise if a stateful module's ``obs`` lacks the time axis.

    Args:
        obs: The pass's ``obs`` column.
        observation_space: The module's observation space (its stored layout sets the dims of one observation).
        owner: Names the module in the message.
    """
    observation_ndim = len(stored_observation_space(observation_part(observation_space)).shape)
    if obs.dim() != observation_ndim + 2:
        raise ValueError(
            f"{owner} is recurrent: its passes take obs [B, T, ...] (a time axis; T = 1 to act one step), "
            f"got shape {tuple(obs.shape)}"
        )


def _column(batch: Mapping[str, Any], name: str) -> Tensor:
    value = batch.get(name)
    if value is None:
        raise ValueError(f"this recurrent module reads {name!r} (lstm_use_prev_action/lstm_use_prev_reward); the batch lacks it")
    return value


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
