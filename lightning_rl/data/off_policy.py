"""``OffPolicyDataModule``: env steps added to a replay buffer that off-policy Learners sample.

Each train item adds ``train_freq`` new env steps (per rank) to this rank's replay buffer and
hands the buffer to the Learner, which samples its minibatches from it (with
``cycles_per_item=k``, an item holds k such cycles, each sampled after the Learner trained on
the one before):
``TrainItem(TrainingData(replay=buffer), timesteps={...}, env_runners={...})``, with
``replay=None`` until the buffers hold ``learning_starts`` env steps (the Learner then takes
no gradient step, but its schedules still move). Sampling, evaluation, counters and
checkpoints work as for ``OnPolicyDataModule``; the buffer's contents go into checkpoints
only with ``checkpoint_replay_buffer``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.core.arguments import check_int
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME, Columns
from lightning_rl.core.data_contract import ENV_STEPS, DataOffer
from lightning_rl.core.rl_modules import RLModule
from lightning_rl.core.schedules import Schedule, ScheduleSetting
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.data.env_datamodule import (
    ASYNC_SAMPLING_ARGUMENTS,
    ON_POLICY_ARGUMENTS,
    EnvDataModule,
    refuse_arguments_of,
)
from lightning_rl.data.prioritized_replay import PrioritizedReplayBuffer
from lightning_rl.data.uniform_replay import ReplayBuffer

# The replay buffer's and the warm-up actions' random generators, apart from the envs' seeds.
_REPLAY_SEED_OFFSET = 2_000_003


class OffPolicyDataModule(EnvDataModule):
    """Fills a replay buffer from a gymnasium environment for off-policy Learners (DQN, SAC).

    Args:
        env: A registered gymnasium id (``"CartPole-v1"``; ``"ale_py:ALE/Pong-v5"`` imports
            ``ale_py`` first), the import path of an env factory (``"my_package.envs.make_env"``),
            or a zero-argument callable that returns a ``gym.Env``.
        replay_buffer_capacity: The replay buffer's size in env steps (per rank).
        prioritized_replay: Sample rows in proportion to their TD errors (proportional
            prioritized replay) instead of uniformly.
        prioritized_replay_alpha: How strongly priorities shape sampling (0 is uniform).
        prioritized_replay_beta: The importance-weight exponent: a number or a schedule over
            env steps (usually annealed to 1).
        prioritized_replay_eps: Added to each ``|td_error|`` so no row's priority is zero.
        train_freq: Env steps added to the buffer per cycle (per rank; a multiple of
            ``num_envs``); a train item is one cycle unless ``cycles_per_item`` says more.
        cycles_per_item: ``train_freq`` cycles per train item (opt-in; default 1). Each cycle
            adds ``train_freq`` env steps and the Learner then takes its ``gradient_steps``,
            so the env steps of a cycle act with the weights after the previous cycle's
            gradient steps, exactly as with one cycle per item (and as Stable-Baselines3
            does): a seeded run trains the same weights. What changes is the bookkeeping
            per item: Lightning's loop, logging, progress bar and callbacks run once per k
            cycles (worth it when a cycle is cheap, e.g. SAC's 1 env step + 1 gradient step);
            ``rollouts_per_epoch``, ``log_every_n_steps``, ``max_steps`` and checkpoint
            intervals in train steps count items of k cycles; an item logs its last cycle's
            results. The last item ends early at ``max_env_steps``.
        learning_starts: Env steps (over all ranks) in the buffers before the Learner gets
            replay; until then items carry ``replay=None``.
        random_actions_before_learning_starts: Act uniformly at random until learning starts
            (as Stable-Baselines3 does) instead of with the module.
        checkpoint_replay_buffer: Save the buffer's contents in checkpoints, so a resumed run
            replays what it had (checkpoints grow by the buffer's size). Without it a resumed
            run refills the buffer up to ``learning_starts`` before learning on.
        **kwargs: The arguments every environment data module takes (``num_envs``, ``seed``,
            ``rollouts_per_epoch``, ``max_env_steps``, ``evaluation_num_episodes``, ...): see
            ``EnvDataModule``.

    Raises:
        ValueError: Naming the argument, for invalid values, and naming ``OnPolicyDataModule``
            for its arguments (``rollout_fragment_length``) and ``AsyncSamplingDataModule`` for
            its (``num_env_runners``, ...).
    """

    def __init__(
        self,
        env: str | Callable[[], gym.Env] = "CartPole-v1",
        *,
        replay_buffer_capacity: int = 1_000_000,
        prioritized_replay: bool = False,
        prioritized_replay_alpha: float = 0.6,
        prioritized_replay_beta: ScheduleSetting = 0.4,
        prioritized_replay_eps: float = 1e-6,
        train_freq: int = 1,
        cycles_per_item: int = 1,
        learning_starts: int = 1000,
        random_actions_before_learning_starts: bool = True,
        checkpoint_replay_buffer: bool = False,
        **kwargs: Any,
    ) -> None:
        refuse_arguments_of("OnPolicyDataModule", ON_POLICY_ARGUMENTS, kwargs)
        refuse_arguments_of("AsyncSamplingDataModule", ASYNC_SAMPLING_ARGUMENTS, kwargs)
        check_int("replay_buffer_capacity", replay_buffer_capacity)
        check_int("train_freq", train_freq)
        check_int("cycles_per_item", cycles_per_item)
        check_int("learning_starts", learning_starts, minimum=0)
        beta_schedule = Schedule(prioritized_replay_beta, name="prioritized_replay_beta")
        # The buffer checks alpha and eps; build one now so bad values fail at construction.
        if prioritized_replay:
            PrioritizedReplayBuffer(1, alpha=prioritized_replay_alpha, epsilon=prioritized_replay_eps)
        super().__init__(env, **kwargs)
        if train_freq % self.hparams.num_envs:
            raise ValueError(
                f"train_freq ({train_freq}) must be a multiple of num_envs ({self.hparams.num_envs}): every env "
                "steps the same number of times per train item"
            )
        self._beta_schedule = beta_schedule
        self._replay_buffer: ReplayBuffer | None = None
        # Restored buffer contents (tensors), loaded into the buffer when it is built.
        self._saved_replay_buffer: dict[str, Any] | None = None
        self._random_module: _UniformRandomModule | None = None

    @property
    def train_batch_size(self) -> int:
        """Env steps per train item on one rank: ``train_freq``."""
        return self.hparams.train_freq

    @property
    def replay_buffer(self) -> ReplayBuffer:
        """This rank's replay buffer (built on first use, from restored contents if there are any)."""
        if self._replay_buffer is None:
            hparams = self.hparams
            seed = self.rank_seed(_REPLAY_SEED_OFFSET)
            if hparams.prioritized_replay:
                buffer: ReplayBuffer = PrioritizedReplayBuffer(
                    hparams.replay_buffer_capacity,
                    alpha=hparams.prioritized_replay_alpha,
                    beta=self._beta_schedule.value(self.num_env_steps_sampled_lifetime),
                    epsilon=hparams.prioritized_replay_eps,
                    seed=seed,
                )
            else:
                buffer = ReplayBuffer(hparams.replay_buffer_capacity, seed=seed)
            if self._saved_replay_buffer is not None:
                # The restored contents are this module's alone (a checkpoint read for it):
                # the buffer consumes them, so their memory is reused or freed column by
                # column instead of being held beside a second full copy.
                saved = _to_numpy(self._saved_replay_buffer)
                self._saved_replay_buffer = None
                buffer.load_state_dict(saved, consume=True)
            self._replay_buffer = buffer
        return self._replay_buffer

    def sample_train_item(self) -> TrainItem:
        """Add ``train_freq`` env steps to this rank's buffer; return the item that hands it over.

        On several ranks this is a collective call (one ``all_gather`` of a small vector):
        every rank must call it the same number of times.

        Returns:
            A ``TrainItem``: the replay buffer once learning started (``None`` before),
            ``{"num_env_steps_sampled_lifetime": sum over ranks}`` as timesteps, and
            statistics over all ranks as ``env_runners``. With ``cycles_per_item > 1`` its
            ``next_cycle`` samples the item's next cycle (see ``TrainItem.next_cycle``).

        Raises:
            RuntimeError: If the Trainer runs several processes without ``torch.distributed``.
        """
        return self._sample_cycle(cycles_left=self.hparams.cycles_per_item - 1)

    def _sample_cycle(self, *, cycles_left: int) -> TrainItem:
        """One cycle's item; its ``next_cycle`` samples the next while ``cycles_left`` and the budget last.

        Every rank decides alike (the budget and the counter are global), so all ranks sample
        the same cycles. A cycle that uses up ``max_env_steps`` stops the fit after this item,
        as ``Rollouts`` does for an item's first cycle.
        """
        with self.acting_module() as acting:  # checked even while random actions stand in for it
            if self.hparams.random_actions_before_learning_starts and not self._learning_started():
                acting = self._uniform_random_module()
            episodes, metrics = self.sampling.sample(acting, self._gather)
        buffer = self.replay_buffer
        buffer.add_episodes(episodes)
        if isinstance(buffer, PrioritizedReplayBuffer):
            buffer.beta = self._beta_schedule.value(self.num_env_steps_sampled_lifetime)
        replay = buffer if self._learning_started() else None
        timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: metrics[NUM_ENV_STEPS_SAMPLED_LIFETIME]}
        budget = self.hparams.max_env_steps
        out_of_budget = budget is not None and self.num_env_steps_sampled_lifetime >= budget
        next_cycle = None
        if cycles_left > 0 and not out_of_budget:
            next_cycle = partial(self._sample_cycle, cycles_left=cycles_left - 1)
        elif out_of_budget and self.trainer is not None:
            self.trainer.should_stop = True  # the update on this cycle still runs; then the fit ends (as Rollouts)
        return TrainItem(TrainingData(replay=replay), timesteps=timesteps, env_runners=metrics, next_cycle=next_cycle)

    def _rollouts_left(self) -> int:
        """Train items in the next epoch: ``rollouts_per_epoch``, fewer when ``max_env_steps`` nears.

        An item samples up to ``cycles_per_item * train_freq`` env steps per rank.
        """
        cycles = self.hparams.cycles_per_item
        if self.hparams.max_env_steps is None or cycles == 1:
            return super()._rollouts_left()
        remaining = self.hparams.max_env_steps - self.num_env_steps_sampled_lifetime
        per_item = cycles * self.env_steps_per_rollout * self.placement()[1]
        return max(0, min(self.hparams.rollouts_per_epoch, math.ceil(remaining / per_item)))

    def state_dict(self) -> dict[str, Any]:
        """The sampling state (see ``EnvDataModule.state_dict``), plus ``"replay_buffer"``.

        The buffer (this rank's, as tensors, so checkpoints load with
        ``torch.load(weights_only=True)``) is saved only with ``checkpoint_replay_buffer``.
        Its tensors share the buffer's memory (no copy is made, so saving a large buffer
        costs little beyond the file): save the state before the buffer changes again.
        """
        state = super().state_dict()
        if self.hparams.checkpoint_replay_buffer:
            if self._replay_buffer is not None:
                state["replay_buffer"] = _to_tensors(self._replay_buffer.state_dict())
            elif self._saved_replay_buffer is not None:
                state["replay_buffer"] = self._saved_replay_buffer
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()``; the buffer is rebuilt on first use, from the saved contents if any.

        A saved buffer is restored on every rank (each then adds its own new steps), so all
        ranks start learning again together.
        """
        super().load_state_dict(state_dict)
        self._saved_replay_buffer = state_dict.get("replay_buffer")
        self._replay_buffer = None

    def _learning_started(self) -> bool:
        """Whether this rank's buffer holds its share of ``learning_starts`` (or is full).

        Every rank adds the same number of steps per item, so all ranks agree. A run resumed
        without the buffer's contents refills its share first.
        """
        world_size = self.placement()[1]
        share = min(-(-self.hparams.learning_starts // world_size), self.hparams.replay_buffer_capacity)
        return len(self.replay_buffer) >= max(share, 1)

    def _uniform_random_module(self) -> _UniformRandomModule:
        if self._random_module is None:
            seed = self.rank_seed(_REPLAY_SEED_OFFSET + 1)
            self._random_module = _UniformRandomModule(self.observation_space, self.action_space, seed=seed)
        return self._random_module

    def data_offer(self) -> DataOffer:
        """The replay buffer, and the env's spaces (``DataSource``).

        No train batch: the Learner samples its minibatches from the buffer, so an item's
        ``train_freq`` new env steps are no batch it cuts into minibatches. Its step count is env steps.
        """
        return DataOffer(frozenset({"replay"}), spaces=self._offered_spaces, step_name=ENV_STEPS)


class _UniformRandomModule(RLModule):
    """Acts uniformly at random in the action space: off-policy warm-up before learning starts.

    With an ``action_mask`` column (a masked observation space), uniformly among the legal actions.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, *, seed: int) -> None:
        super().__init__(observation_space, action_space)
        self._rng = np.random.default_rng(seed)

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        num_rows = len(batch[Columns.OBS])
        space = self.action_space
        mask = batch.get(Columns.ACTION_MASK)
        if mask is not None:
            # A random score per legal action, -1 for illegal ones: the argmax is uniform over the legal.
            scores = self._rng.random((num_rows, space.n))
            scores[~mask.bool().cpu().numpy()] = -1.0
            actions = space.start + scores.argmax(axis=1)
        elif isinstance(space, gym.spaces.Discrete):
            actions = space.start + self._rng.integers(0, space.n, size=num_rows)
        elif isinstance(space, gym.spaces.Box) and space.is_bounded():
            actions = self._rng.uniform(space.low, space.high, size=(num_rows, *space.shape)).astype(space.dtype)
        else:  # unbounded boxes and the other spaces: the space's own sampler, seeded alike
            space.seed(int(self._rng.integers(2**31)))
            actions = np.stack([space.sample() for _ in range(num_rows)])
        return {Columns.ACTIONS: torch.from_numpy(np.asarray(actions))}


def _to_tensors(value: Any) -> Any:
    """numpy arrays in a nested state become tensors (plain data for ``weights_only`` loading).

    Contiguous arrays (the buffer's row slices) become tensors on the same memory, not copies.
    """
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, dict):
        return {key: _to_tensors(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_tensors(item) for item in value)
    return value


def _to_numpy(value: Any) -> Any:
    """The inverse of ``_to_tensors``, again without copying: arrays on the tensors' memory."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict):
        return {key: _to_numpy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_numpy(item) for item in value)
    return value
