"""``OffPolicyLearner``: the update loop of Learners that train from a replay buffer.

``lightning_rl.data.OffPolicyDataModule`` adds ``train_freq`` new env steps to its replay
buffer per train item and hands the buffer to the Learner (``TrainingData(replay=buffer)``). The
Learner then takes ``gradient_steps`` gradient steps, each on a minibatch sampled fresh from
the buffer, as RLlib's DQN and SAC do: every step is one update (``before`` / ``after``
``gradient_based_update`` hooks included), so target networks move and priorities change
between steps, and the next minibatch is drawn with the new priorities. The results of all
steps of one item are reduced together.

Until ``learning_starts`` env steps were sampled the item carries no buffer (``None``): the
Learner then takes an update without gradient steps, so its hooks still see the timesteps
(exploration schedules keep moving) and the sampling statistics are logged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from functools import partial
from typing import Any, ClassVar

import torch
from lightning.pytorch import Callback
from torch import Tensor

from lightning_rl.callbacks.target_network import TargetNetworkUpdate
from lightning_rl.core.action_masks import NEXT_ACTION_MASK, is_action_masked_space
from lightning_rl.core.arguments import ArgumentCheck, check_int, check_number, check_probability
from lightning_rl.core.columns import Columns
from lightning_rl.core.data_contract import DataRequirements
from lightning_rl.core.observation_layout import ObservationLayout
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.data.prioritized_replay import PrioritizedReplayBuffer
from lightning_rl.data.replay_n_step import BATCH_INDEXES, N_STEP, WEIGHTS
from lightning_rl.data.uniform_replay import ReplayBuffer
from lightning_rl.learner.learner import Learner

# The key of a step's TD errors in ``StepRunner.step_outputs``: ``(TD_ERRORS, module_id)``.
TD_ERRORS = "td_errors"

__all__ = ["BATCH_INDEXES", "N_STEP", "WEIGHTS", "OffPolicyLearner", "bootstrap_discounts", "row_weights"]


class OffPolicyLearner(Learner):
    """Base of Learners that train from replay (``DQNLearner``, ``SACLearner``).

    Subclasses write the loss as any Learner does; a loss that knows per-row TD errors
    reports them with :meth:`record_td_errors`, which a prioritized buffer turns into new
    priorities after the step.

    Args:
        module_spec: What to build, as for ``Learner``.
        gamma: Discount factor.
        n_step: Steps summed into each return before bootstrapping (the buffer computes
            them at sample time, cut short at episode ends).
        gradient_steps: Gradient steps per train item, each on a fresh replay minibatch.
        minibatch_size: Rows per replay minibatch.
        tau: Step size of the target-network update: 1 copies the online weights, a small
            value averages them in (Polyak).
        target_network_update_freq: Gradient steps between target-network updates.
        **kwargs: The other ``Learner`` arguments (``lr``, ``grad_clip``, ...).
    """

    #: The target networks' ``tau`` and update interval are one callback's, for every module. A
    #: module's own ``minibatch_size`` is taken (``update_from_replay`` asks all modules to agree).
    learner_wide_hyperparameters: ClassVar[frozenset[str]] = (
        Learner.learner_wide_hyperparameters - {"minibatch_size"}
    ) | {"tau", "target_network_update_freq"}

    hyperparameter_checks: ClassVar[Mapping[str, ArgumentCheck]] = {
        "gamma": check_probability,
        "n_step": check_int,
        "gradient_steps": check_int,
        "minibatch_size": check_int,  # a replay minibatch has a size: no None, as the Learner allows
        "tau": partial(check_number, low=0, high=1, low_open=True),
        "target_network_update_freq": check_int,
    }

    masked_observations_refused: ClassVar[str | None] = None
    """Why this Learner cannot train on action-masked observations; ``None`` where it can (DQN).

    A subclass that sets it (SAC, IQL and CQL, whose actors pick continuous actions) refuses a
    module on PettingZoo's ``{"action_mask", "observation"}`` space in ``build`` and ``add_module``.
    """

    def __init__(
        self,
        module_spec: RLModuleSpec | MultiRLModuleSpec | None = None,
        *,
        gamma: float = 0.99,
        n_step: int = 1,
        gradient_steps: int = 1,
        minibatch_size: int = 256,
        tau: float = 1.0,
        target_network_update_freq: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(module_spec, minibatch_size=minibatch_size, **kwargs)
        # The stored layout of each masked module's observations, by module id (see _module_columns).
        self._masked_layouts: dict[str, ObservationLayout] = {}

    def build(self) -> None:
        """Build as ``Learner.build`` does, first refusing masked observations where the Learner cannot use them.

        Raises:
            ValueError: See :attr:`masked_observations_refused`.
        """
        spec = self.spec_to_build
        if spec is not None:
            for module_id, module_spec in spec.rl_module_specs.items():
                self._refuse_masked_observations(module_id, module_spec)
        super().build()

    def add_module(self, *, module_id: str, module_spec: RLModuleSpec, **kwargs: Any) -> MultiRLModuleSpec:
        """Add a module (see ``Learner.add_module``), refusing masked observations as :meth:`build` does."""
        self._refuse_masked_observations(module_id, module_spec)
        return super().add_module(module_id=module_id, module_spec=module_spec, **kwargs)

    def _refuse_masked_observations(self, module_id: str, module_spec: RLModuleSpec) -> None:
        reason = self.masked_observations_refused
        if reason is not None and is_action_masked_space(module_spec.observation_space):
            raise ValueError(
                f"{type(self).__name__} cannot train module {module_id!r} on action-masked observations "
                f"('action_mask' and 'observation'): {reason}; use DQNLearner, PPOLearner, BC or MARWIL for masked "
                "Discrete actions"
            )

    def cuda_graph_key(self) -> Hashable:
        """The off-policy losses read no Python number but constant hyperparameters: CUDA graphs last across updates."""
        return ()

    def configure_callbacks(self) -> list[Callback]:
        """Adds ``TargetNetworkUpdate`` with this Learner's ``tau`` and update frequency."""
        return [TargetNetworkUpdate(update_interval=self.hparams.target_network_update_freq, tau=self.hparams.tau)]

    def data_requirements(self) -> DataRequirements:
        """The Learner's requirements (see ``Learner.data_requirements``), training from replay.

        A replay buffer (``OffPolicyDataModule``), or transitions as batches or batch iterators
        (``OfflineDataModule``); not episodes, whose train batch holds no ``new_obs`` to
        bootstrap from. The minibatches are sampled from the buffer, so an off-policy data
        module offers no train batch to check ``minibatch_size`` against.
        """
        return dataclasses.replace(
            super().data_requirements(),
            sources=frozenset({"replay", "batch", "batches", "data_iterators"}),
            suggestion="use lightning_rl.data.OffPolicyDataModule (or lightning_rl.data.OfflineDataModule for a dataset)",
        )

    def required_batch_columns(self, module_id: str) -> list[str]:
        """One-step transitions; a replay buffer adds ``n_step`` and ``weights`` (rows without them are 1-step, weight 1)."""
        return [
            Columns.OBS,
            Columns.ACTIONS,
            Columns.REWARDS,
            Columns.NEXT_OBS,
            Columns.TERMINATEDS,
        ]

    def record_td_errors(self, module_id: str, td_errors: Tensor) -> None:
        """Report this step's TD error of every minibatch row, for prioritized replay.

        Call it from the loss; after the step the buffer sets each sampled row's priority
        to ``|td_error| + epsilon``. A uniform buffer ignores it.

        Args:
            module_id: The module whose minibatch the errors belong to.
            td_errors: ``[B]``, one per row, in the minibatch's order.
        """
        self.step_runner.step_outputs[(TD_ERRORS, module_id)] = td_errors.detach()

    def _recorded_td_errors(self) -> dict[str, Tensor]:
        """The TD errors the last gradient step recorded, by module."""
        return {key[1]: value for key, value in self.step_runner.step_outputs.items() if key[0] == TD_ERRORS}

    def update_from_replay(self, replay: Any, *, timesteps: Mapping[str, float] | None = None) -> dict[str, dict[str, float]]:
        """Take ``gradient_steps`` gradient steps, each on a minibatch sampled from ``replay``.

        A replay buffer holds one agent's transitions. With several modules (a Q-network and
        a curiosity model beside it, say) every module gets the same sampled minibatch in each
        step, under its own id, and ``compute_losses`` sees them all; their sampling settings
        (``minibatch_size``, ``n_step``, ``gamma``, ``gradient_steps``) must agree.

        Args:
            replay: A ``ReplayBuffer`` (or anything with its ``sample`` and
                ``update_priorities``), or ``None`` before learning starts: then the update
                takes no gradient step but runs its hooks.
            timesteps: Lifetime counters, as in ``update_from_batch``.

        Returns:
            The results of all steps, reduced together, as ``update_from_batch`` returns them.

        Raises:
            ValueError: If the modules' sampling settings differ (naming them), or, with a
                prioritized replay, more than one module records TD errors in a step (the
                buffer keeps one priority per row).
        """
        timesteps = dict(timesteps or {})
        module_ids = list(self.built_module.keys())
        if replay is None:
            return self.update(timesteps=timesteps)  # an update without data: hooks and schedules only
        config = self._sampling_config(module_ids)
        update = dict(timesteps=timesteps, num_epochs=1, minibatch_size=None, shuffle_batch_per_epoch=False)
        for _ in range(config.gradient_steps):
            sample = dict(replay.sample(config.minibatch_size, n_step=config.n_step, gamma=config.gamma))
            batch_indexes = sample.pop(BATCH_INDEXES)
            batch = {module_id: self._module_columns(module_id, sample) for module_id in module_ids}
            self._update(self._prepare_batch(batch), **update)
            recorded = self._recorded_td_errors()
            if not recorded or not _uses_priorities(replay):
                continue
            if len(recorded) > 1:
                raise ValueError(
                    f"modules {sorted(recorded)} each recorded TD errors, but a prioritized replay keeps one "
                    "priority per row: call record_td_errors for one module only"
                )
            (td_errors,) = recorded.values()
            replay.update_priorities(batch_indexes, td_errors.float().cpu().numpy())
        return self.metrics.reduce()

    def _module_columns(self, module_id: str, sample: Mapping[str, Any]) -> dict[str, Any]:
        """A module's copy of the replay minibatch; a masked module's rows split into observations and masks.

        The buffer stores an action-mask Dict observation flattened, its mask beside it (see
        :class:`~lightning_rl.core.observation_layout.ObservationLayout`), so ``new_obs`` brings
        the next state's mask along: here ``obs`` becomes ``obs`` and ``action_mask``, and
        ``new_obs`` becomes ``new_obs`` and ``next_action_mask``.
        """
        columns = dict(sample)
        space = self.module[module_id].observation_space
        if not is_action_masked_space(space) or Columns.ACTION_MASK in columns:
            return columns  # nothing to split, or a replay of the user's own kind that split them already
        layout = self._masked_layouts.get(module_id)
        if layout is None or layout.space is not space:  # read off the space once, not on every gradient step
            layout = self._masked_layouts[module_id] = ObservationLayout(space)
        columns[Columns.OBS], columns[Columns.ACTION_MASK] = layout.split_masked_batch(columns[Columns.OBS])
        columns[Columns.NEXT_OBS], columns[NEXT_ACTION_MASK] = layout.split_masked_batch(columns[Columns.NEXT_OBS])
        return columns

    def _sampling_config(self, module_ids: list[str]) -> Any:
        """The one config whose sampling settings every module shares; raise naming the modules that differ."""
        names = ("minibatch_size", "n_step", "gamma", "gradient_steps")
        configs = {module_id: self.config_for_module(module_id) for module_id in module_ids}
        settings = {module_id: tuple(getattr(config, name) for name in names) for module_id, config in configs.items()}
        if len(set(settings.values())) > 1:
            described = {module_id: dict(zip(names, values)) for module_id, values in settings.items()}
            raise ValueError(
                f"update_from_replay samples one minibatch for all modules, so their {', '.join(names)} must agree; "
                f"they differ: {described}"
            )
        return configs[module_ids[0]]


def _uses_priorities(replay: Any) -> bool:
    """Whether ``replay`` wants TD errors: a prioritized buffer, or a replay of the user's own kind."""
    return isinstance(replay, PrioritizedReplayBuffer) or not isinstance(replay, ReplayBuffer)


def bootstrap_discounts(batch: Mapping[str, Tensor], gamma: float) -> Tensor:
    """``gamma ** n_step``, zero where the n-step return ended in a termination.

    Multiplies the bootstrap value of each row's ``new_obs``: the sampled returns sum
    ``n_step`` rewards, and a terminated episode has no value after its end (a truncated
    one does, so it bootstraps from its final observation). Rows without ``n_step`` (an
    offline dataset's transitions) are one step.
    """
    not_terminated = ~batch[Columns.TERMINATEDS].bool()
    if N_STEP not in batch:
        return gamma * not_terminated.to(torch.float32)
    discounts = torch.pow(gamma, batch[N_STEP].to(torch.float32))
    return discounts * not_terminated.to(discounts.dtype)


def row_weights(batch: Mapping[str, Tensor]) -> Tensor | float:
    """The rows' importance weights (prioritized replay's ``weights``), or 1 for rows without them."""
    return batch.get(WEIGHTS, 1.0)
