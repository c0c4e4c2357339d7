"""How an RLModule turns a batch of observations into actions: the one mechanism every actor shares.

The env runners (training rollouts and evaluation episodes), ``evaluate``/``record``,
``Policy.act`` and exported policy graphs all act through :class:`Acting` (which keeps a
recurrent module's state per row) and :func:`compute_actions` (one forward pass), so a greedy
action is the same wherever it is computed: ``forward_inference`` and the inference
distribution's ``deterministic_sample`` when the module returns distribution inputs (PPO, BC),
or the module's own ``actions`` (DQN, SAC). :func:`clip_actions` bounds Box actions as the env
runner does before stepping an env.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import torch

from lightning_rl.core.action_masks import check_maskable_action_space
from lightning_rl.core.columns import Columns
from lightning_rl.core.recurrent import batched_initial_state, pack_state
from lightning_rl.core.rl_modules import RLModule


def compute_actions(
    module: RLModule,
    obs: torch.Tensor,
    *,
    explore: bool,
    with_logp: bool = True,
    action_mask: torch.Tensor | None = None,
    extra_columns: Mapping[str, Any] | None = None,
) -> tuple[Mapping[str, Any], torch.Tensor]:
    """One forward pass of ``module`` on a batch of observations, and the actions it chooses.

    Args:
        module: A single-agent RLModule.
        obs: Observations ``[B, *obs_shape]`` on the module's device (of a masked space: the
            observation part).
        explore: ``forward_exploration`` and sampled actions; otherwise ``forward_inference``
            and the most likely actions (the greedy policy evaluation uses).
        with_logp: Add the actions' log-probability (what training stores); acting alone
            (``Policy``, an exported graph) leaves it out.
        action_mask: ``[B, n]``, true (or 1) where an action is legal; passed to the forward
            pass as the ``action_mask`` column, which masks the distribution inputs so that
            illegal actions are neither sampled nor chosen greedily. Required for a module on
            a masked observation space.
        extra_columns: More columns for the forward pass (a recurrent module's ``state_in``,
            ``prev_actions``, ``prev_rewards``: see :class:`Acting`).

    Returns:
        The forward pass's outputs (with ``action_logp`` added when the actions were drawn from
        the action distribution and ``with_logp``) and the actions ``[B, ...]``, not clipped.

    Raises:
        ValueError: If the forward pass returns neither ``actions`` nor ``action_dist_inputs``,
            ``action_mask`` is given to a module whose action space is not ``Discrete``, or (from
            the module) a masked module gets no ``action_mask``.
    """
    forward = module.forward_exploration if explore else module.forward_inference
    batch = {Columns.OBS: obs, **(extra_columns or {})}
    if action_mask is not None:
        # Here too, not only in the module's passes: a module that picks its actions itself
        # (SAC) never reaches RLModule.mask_action_dist_inputs.
        check_maskable_action_space(module.action_space, type(module).__name__)
        batch[Columns.ACTION_MASK] = action_mask
    out = forward(batch)
    actions = out.get(Columns.ACTIONS)
    if actions is not None:
        # The module chose its actions itself (Q-argmax, a squashed Gaussian's mean): only it
        # can honour a mask, so a module that ignores it fails here, not in the env. Not while
        # a graph is traced (export): the check's Python branch on tensor values cannot be traced.
        if action_mask is not None and not (torch.compiler.is_compiling() or torch.compiler.is_exporting()):
            _check_legal(module, actions, action_mask)
        return out, actions
    if Columns.ACTION_DIST_INPUTS not in out:
        raise ValueError(
            f"{type(module).__name__}'s forward pass returned neither "
            f"{Columns.ACTIONS!r} nor {Columns.ACTION_DIST_INPUTS!r}; got {sorted(out)}"
        )
    dist_cls = module.get_exploration_action_dist_cls() if explore else module.get_inference_action_dist_cls()
    dist = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
    actions = dist.sample() if explore else dist.deterministic_sample()
    if with_logp:
        out = dict(out)
        out[Columns.ACTION_LOGP] = dist.logp(actions)
    return out, actions


class Acting:
    """One module acting for a fixed set of rows (the envs of a vector env, or agent slots), step after step.

    A feed-forward module acts through :func:`compute_actions` as it is. A stateful
    (recurrent) module also gets, per row, its recurrent state and the previous step's action
    and reward; the forward pass runs on a time axis of one step, and the state it returns
    becomes the row's next state. Each step's outputs then hold the inputs the step was taken
    from: ``state_in`` (packed, :func:`~lightning_rl.core.recurrent.pack_state`),
    ``prev_actions`` and ``prev_rewards``, which episodes store so that the Learner replays
    every sequence from the state the actor had.

    The caller reports what the env did: :meth:`observe_rewards` after each step, and
    :meth:`start_episodes` for the rows whose episode (re)starts (a reset, an autoreset, a
    dropped episode), which puts them back to the initial state.

    The rows' state is kept in ordinary tensors (never inference tensors, detached from any
    graph), so the runners (under ``torch.inference_mode``) and ``Policy`` (under
    ``no_grad``) may build, step and reset it in whichever mode they act.

    Args:
        module: A single-agent RLModule.
        num_rows: How many rows (envs, agent slots) act; fixed for the object's life.
    """

    def __init__(self, module: RLModule, num_rows: int) -> None:
        self.module = module
        self.num_rows = int(num_rows)
        # Read once: start_episodes puts rows back to it after every episode end.
        self._initial_state = module.get_initial_state()
        self.stateful = bool(self._initial_state)
        self._state: dict[str, torch.Tensor] = {}
        self._prev_actions: torch.Tensor | None = None
        self._prev_rewards: torch.Tensor | None = None
        if self.stateful:
            # Normal tensors even when built under torch.inference_mode (as the env runners act):
            # start_episodes and observe_rewards update them in place outside that mode too.
            with torch.inference_mode(False):
                self._state = batched_initial_state(module, self.num_rows)
                self._prev_actions = self._zero_actions(self.num_rows)
                self._prev_rewards = torch.zeros(self.num_rows, device=self._device())

    def act(
        self,
        obs: torch.Tensor,
        *,
        explore: bool,
        rows: torch.Tensor | None = None,
        action_mask: torch.Tensor | None = None,
        with_logp: bool = True,
    ) -> tuple[dict[str, Any], torch.Tensor]:
        """Actions for the observations of ``rows``; a stateful module's state moves one step on.

        Args:
            obs: ``[B, *obs_shape]`` on the module's device.
            explore: As in :func:`compute_actions`.
            rows: ``[B]`` row indices the observations belong to; ``None`` for all rows in order.
            action_mask: As in :func:`compute_actions`.
            with_logp: As in :func:`compute_actions`.

        Returns:
            What :func:`compute_actions` returns, without the time axis; a stateful module's
            outputs also hold ``state_in`` ``[B, S]``, ``prev_actions`` and ``prev_rewards``.
        """
        if not self.stateful:
            out, actions = compute_actions(self.module, obs, explore=explore, with_logp=with_logp, action_mask=action_mask)
            return dict(out), actions
        index = slice(None) if rows is None else rows
        # Copies, not views: the rows' state moves on below, and the outputs keep what the step started from.
        state_in = {name: value[index].clone() for name, value in self._state.items()}
        prev_rewards = self._prev_rewards[index].clone()
        prev_actions = self._prev_actions[index].clone()
        columns = {
            Columns.STATE_IN: state_in,
            Columns.PREV_ACTIONS: prev_actions.unsqueeze(1),
            Columns.PREV_REWARDS: prev_rewards.unsqueeze(1),
        }
        mask = None if action_mask is None else action_mask.unsqueeze(1)
        out, actions = compute_actions(
            self.module, obs.unsqueeze(1), explore=explore, with_logp=with_logp, action_mask=mask, extra_columns=columns
        )
        state_out = out[Columns.STATE_OUT]
        out = {key: _drop_time_axis(value) for key, value in out.items() if key != Columns.STATE_OUT}
        actions = actions.squeeze(1)
        out[Columns.STATE_IN] = pack_state(state_in)
        out[Columns.PREV_ACTIONS] = prev_actions
        out[Columns.PREV_REWARDS] = prev_rewards
        for name, value in state_out.items():
            # Detached: acting outside no_grad must not chain one step's graph to the next.
            self._state[name][index] = value.detach().to(self._state[name].dtype)
        # The action the env executes (a Box action clipped to its bounds), which is also what a
        # deployed, exported policy's caller feeds back as the next prev_actions.
        self._prev_actions[index] = clip_actions(actions.detach(), self.module.action_space).to(self._prev_actions.dtype)
        return out, actions

    def observe_rewards(self, rewards: Any, rows: torch.Tensor | None = None) -> None:
        """Record the rewards of the step just taken (a stateful module's next ``prev_rewards``).

        Args:
            rewards: ``[B]`` rewards (numpy or tensor) of ``rows``.
            rows: As in :meth:`act`.
        """
        if self.stateful:
            index = slice(None) if rows is None else rows
            self._prev_rewards[index] = torch.as_tensor(rewards, dtype=self._prev_rewards.dtype).to(self._prev_rewards.device)

    def start_episodes(self, rows: Any = None) -> None:
        """Rows whose next observation starts an episode: back to the initial state, no previous action or reward.

        Args:
            rows: Row indices (a sequence, numpy array or tensor); ``None`` for every row.
        """
        if not self.stateful:
            return
        if rows is None:
            index: Any = slice(None)
        else:
            index = torch.as_tensor(rows, dtype=torch.long).reshape(-1)
            if len(index) == 0:
                return
            index = index.to(self._prev_rewards.device)
        for name, initial in self._initial_state.items():
            self._state[name][index] = initial.to(self._state[name].device, self._state[name].dtype)
        self._prev_rewards[index] = 0.0
        self._prev_actions[index] = 0

    def _zero_actions(self, count: int) -> torch.Tensor:
        space = self.module.action_space
        if isinstance(space, gym.spaces.Box):
            return torch.zeros((count, *space.shape), device=self._device())
        shape = space.shape if isinstance(space, gym.spaces.MultiDiscrete) else ()
        return torch.zeros((count, *shape), dtype=torch.long, device=self._device())

    def _device(self) -> torch.device:
        param = next(self.module.parameters(), None)
        return param.device if param is not None else torch.device("cpu")


def _drop_time_axis(value: Any) -> Any:
    # Outputs of a pass on one step are [B, 1, ...]; what acting stores is [B, ...].
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == 1:
        return value.squeeze(1)
    return value


def clip_actions(actions: torch.Tensor, action_space: gym.Space) -> torch.Tensor:
    """Clip actions to a Box space's bounds, as the env runner does before stepping; others pass unchanged.

    Args:
        actions: ``[B, *action_shape]`` actions.
        action_space: The module's action space.
    """
    if not isinstance(action_space, gym.spaces.Box):
        return actions
    low = torch.as_tensor(action_space.low, dtype=actions.dtype, device=actions.device)
    high = torch.as_tensor(action_space.high, dtype=actions.dtype, device=actions.device)
    return torch.maximum(torch.minimum(actions, high), low)


def _check_legal(module: RLModule, actions: torch.Tensor, action_mask: torch.Tensor) -> None:
    # Mask columns are action indices: a Discrete space starting at k has action k in column 0.
    indices = actions.long().reshape(-1, 1) - int(module.action_space.start)
    legal = action_mask.bool().gather(1, indices).squeeze(1)
    if not bool(legal.all()):
        row = int((~legal).nonzero()[0])
        raise ValueError(
            f"{type(module).__name__} chose the illegal action {int(actions.reshape(-1)[row])} in row {row} (its "
            "action_mask forbids it): this module picks its actions itself and does not honour action masks; "
            "act on masked observations with a module that returns action_dist_inputs (PPO, BC, MARWIL)"
        )
