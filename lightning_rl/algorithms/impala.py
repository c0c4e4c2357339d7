"""IMPALA (Espeholt et al., 2018): an actor-critic trained with V-trace on data from lagging policies.

Samplers act with weights that lag the Learner's (the behaviour policy ``mu``); V-trace
(:mod:`lightning_rl.core.vtrace`) corrects the value targets ``vs`` and the policy-gradient
advantages for the difference between ``mu`` and the Learner's current policy ``pi``. Per
minibatch the loss is

    pi_loss  = -mean(log pi(a_t|x_t) * A_t)                   A_t: V-trace's pg_advantages
    vf_loss  = 0.5 * mean((V(x_t) - vs_t)^2)
    total    = pi_loss + vf_loss_coeff * vf_loss - entropy_coeff * mean(entropy)

with ``log mu`` the ``action_logp`` the acting policy recorded, and discounts
``gamma * (1 - terminated)``. Names follow RLlib's IMPALA config (``vtrace_clip_rho_threshold``,
``vtrace_clip_pg_rho_threshold``, ``vf_loss_coeff``, ``entropy_coeff``, ``grad_clip``, and the
sampling settings ``circular_buffer_num_batches``, ``circular_buffer_iterations_per_batch``,
``broadcast_interval``, which the Learner hands to its data module).

V-trace runs on the time axis. The Learner connector's :class:`~lightning_rl.connectors.AddNextValues`
gives every row ``values_bootstrapped`` (``V(x_{t+1})``, with the weights of the moment the
batch was made) and ``last_in_chunk``. A feed-forward module's minibatch of rows is cut into
sequences where episode chunks end and at the minibatch's last row, each bootstrapped from its
last row's ``values_bootstrapped``; a stateful module's minibatch is sequences already
(``[S, T]`` with ``loss_mask``), each bootstrapped at its last real step. Inside a sequence,
``V(x_t)`` comes from the minibatch's own forward pass.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from functools import partial
from typing import Any, ClassVar

import torch
from torch import Tensor

from lightning_rl.algorithms.ppo import CURR_ENTROPY_COEFF_KEY, ENTROPY_KEY, POLICY_LOSS_KEY, VF_LOSS_KEY, PPOModule
from lightning_rl.connectors import AddNextValues, ConnectorPipeline
from lightning_rl.core.arguments import ArgumentCheck, check_int, check_number, check_probability
from lightning_rl.core.batch import masked_mean
from lightning_rl.core.columns import Columns
from lightning_rl.core.data_contract import DataRequirements, SampleReuse
from lightning_rl.core.learner_config import LearnerConfig
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.rl_modules import ValueFunctionAPI
from lightning_rl.core.schedules import ScheduleSetting, check_schedule
from lightning_rl.core.vtrace import VTraceReturns, vtrace_on_rows, vtrace_on_sequences
from lightning_rl.learner.learner import Learner, algorithm_module_spec

# Result keys (RLlib's names where RLlib has them; the policy, value and entropy keys are PPO's).
MEAN_VTRACE_RHO_KEY = "mean_vtrace_rho"
"""The mean importance ratio ``pi / mu`` of the minibatch's steps, before clipping: 1 when the data is on-policy."""


class IMPALALearner(Learner):
    """IMPALA's V-trace actor-critic loss on the Learner's update loop.

    Args:
        module_spec: What to build; ``None`` builds a :class:`~lightning_rl.algorithms.ppo.PPOModule`
            (an actor-critic with ``compute_values``) from ``model_config`` with the spaces of the
            Trainer's data module.
        model_config: The ``PPOModule``'s settings when ``module_spec`` is ``None`` (``fcnet_hiddens``,
            ``vf_share_layers``, ``use_lstm``, ``max_seq_len``, ...).
        lr: The learning rate, a number or a schedule (RLlib's IMPALA default 0.0005).
        num_epochs, minibatch_size: The ``Learner``'s, with RLlib's IMPALA defaults: one pass over
            each train batch, whole (``minibatch_size=None``). A minibatch may end inside an
            episode chunk: it is bootstrapped there from ``values_bootstrapped``.
        shuffle_batch_per_epoch: Must stay ``False`` (RLlib's IMPALA default) for feed-forward
            modules: V-trace reads a minibatch's rows as consecutive steps, and shuffled rows are
            not, so ``True`` is refused with a one-line error (at ``build`` and at every update).
            Stateful modules' minibatches are whole sequences, which shuffling keeps intact.
        grad_clip: The global-norm gradient clip (RLlib's IMPALA default 40.0); ``None`` for none.
        gamma: Discount factor.
        vf_loss_coeff: Weight of the value loss.
        entropy_coeff: Weight of the entropy bonus: a number or an RLlib schedule ``[[timestep, value], ...]``.
        vtrace_clip_rho_threshold: ``rho_bar``, the clip of the importance ratios in the value
            targets' temporal differences (> 0; ``float("inf")`` does not clip).
        vtrace_clip_pg_rho_threshold: ``rho_pg_bar``, the clip of the ratios weighting the
            policy-gradient advantages (> 0).
        circular_buffer_num_batches: Rollouts an asynchronous data module keeps for reuse
            (RLlib's name; handed to the data module in ``data_requirements().sample_reuse``).
        circular_buffer_iterations_per_batch: Updates one rollout may feed at most (handed over alike).
        broadcast_interval: Updates between two sendings of the weights to the samplers (handed over alike).
        **kwargs: The other ``Learner`` arguments (``grad_clip_by``, ``policies_to_train``,
            ``config_overrides_per_module``, ``torch_compile``, ...).

    Raises:
        ValueError: One line naming the setting, for a value out of its range; for
            ``cuda_graphs=True`` (cutting rows into sequences depends on the data, which a
            captured graph cannot follow).
    """

    hyperparameter_checks: ClassVar[Mapping[str, ArgumentCheck]] = {
        "gamma": check_probability,
        "vf_loss_coeff": partial(check_number, low=0),
        "entropy_coeff": check_schedule,
        "vtrace_clip_rho_threshold": partial(check_number, low=0, low_open=True),
        "vtrace_clip_pg_rho_threshold": partial(check_number, low=0, low_open=True),
        "circular_buffer_num_batches": check_int,
        "circular_buffer_iterations_per_batch": check_int,
        "broadcast_interval": check_int,
    }

    #: The module class a Learner built from ``model_config`` trains.
    default_module_class: ClassVar[type[PPOModule]] = PPOModule

    def __init__(
        self,
        module_spec: RLModuleSpec | MultiRLModuleSpec | None = None,
        *,
        model_config: dict[str, Any] | None = None,
        lr: ScheduleSetting = 0.0005,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
        grad_clip: float | None = 40.0,
        gamma: float = 0.99,
        vf_loss_coeff: float = 0.5,
        entropy_coeff: ScheduleSetting = 0.01,
        vtrace_clip_rho_threshold: float = 1.0,
        vtrace_clip_pg_rho_threshold: float = 1.0,
        circular_buffer_num_batches: int = 1,
        circular_buffer_iterations_per_batch: int = 1,
        broadcast_interval: int = 1,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("cuda_graphs"):
            raise ValueError(
                f"{type(self).__name__} does not support cuda_graphs=True: V-trace cuts each minibatch into sequences "
                "where its episode chunks end, which a captured graph cannot follow; use torch_compile instead"
            )
        super().__init__(
            algorithm_module_spec(module_spec, model_config, self.default_module_class, kwargs.get("module")),
            lr=lr,
            num_epochs=num_epochs,
            minibatch_size=minibatch_size,
            shuffle_batch_per_epoch=shuffle_batch_per_epoch,
            grad_clip=grad_clip,
            **kwargs,
        )
        self._entropy_coeffs: dict[str, float] = {}

    @classmethod
    def rl_module_required_apis(cls) -> list[type]:
        """IMPALA trains modules with a state-value function (``ValueFunctionAPI``: ``compute_values``)."""
        return [ValueFunctionAPI]

    # ---- Data ------------------------------------------------------------------------------

    def build(self) -> None:
        """Build as the ``Learner`` does; then refuse shuffled minibatches of feed-forward modules.

        Raises:
            ValueError: If ``shuffle_batch_per_epoch`` is true and a module is feed-forward.
        """
        super().build()
        self._check_not_shuffled(self.hparams.shuffle_batch_per_epoch)

    def update_from_batch(
        self, batch: Mapping[str, Any], *, shuffle_batch_per_epoch: bool = False, **kwargs: Any
    ) -> dict[str, dict[str, float]]:
        """``Learner.update_from_batch``, refusing ``shuffle_batch_per_epoch=True`` for feed-forward modules.

        Raises:
            ValueError: As the ``Learner``'s, and for shuffled rows of a feed-forward module.
        """
        self._check_not_shuffled(shuffle_batch_per_epoch)
        return super().update_from_batch(batch, shuffle_batch_per_epoch=shuffle_batch_per_epoch, **kwargs)

    def _check_not_shuffled(self, shuffle: bool) -> None:
        feed_forward = sorted(mid for mid, module in self.built_module.items() if not module.is_stateful())
        if shuffle and feed_forward:
            raise ValueError(
                f"{type(self).__name__} needs shuffle_batch_per_epoch=False for feed-forward modules {feed_forward}: "
                "V-trace reads each minibatch's rows as consecutive steps, which shuffled rows are not"
            )

    def build_learner_connector(self) -> ConnectorPipeline:
        """The base pipeline, then ``AddNextValues`` (``values_bootstrapped`` and ``last_in_chunk``)."""
        pipeline = super().build_learner_connector()
        pipeline.append(AddNextValues())
        return pipeline

    def required_batch_columns(self, module_id: str) -> list[str]:
        """What the loss reads: the steps, the acting policy's ``action_logp``, and ``AddNextValues``'s two columns."""
        return [
            Columns.OBS,
            Columns.ACTIONS,
            Columns.ACTION_LOGP,
            Columns.REWARDS,
            Columns.TERMINATEDS,
            Columns.VALUES_BOOTSTRAPPED,
            Columns.LAST_IN_CHUNK,
        ]

    def data_requirements(self) -> DataRequirements:
        """The ``Learner``'s requirements, with RLlib's sample-reuse settings for an asynchronous data module.

        Returns:
            ``Learner.data_requirements()`` with ``sample_reuse`` set from
            ``circular_buffer_num_batches``, ``circular_buffer_iterations_per_batch`` and
            ``broadcast_interval`` (data modules that sample with the current weights ignore it).
        """
        hparams = self.hparams
        reuse = SampleReuse(
            circular_buffer_num_batches=hparams.circular_buffer_num_batches,
            circular_buffer_iterations_per_batch=hparams.circular_buffer_iterations_per_batch,
            broadcast_interval=hparams.broadcast_interval,
        )
        return dataclasses.replace(super().data_requirements(), sample_reuse=reuse)

    # ---- Coefficients ----------------------------------------------------------------------

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        """Sets this update's entropy coefficient of every module from its schedule."""
        super().before_gradient_based_update(timesteps=timesteps)
        for module_id in self.module.keys():
            coeff = self.current_scheduled_value(module_id, "entropy_coeff")
            self._entropy_coeffs[module_id] = coeff
            self.metrics.log_value((module_id, CURR_ENTROPY_COEFF_KEY), coeff, window=1, clear_on_reduce=True)

    def remove_module(self, module_id: str, **kwargs: Any) -> Any:
        """Remove ``module_id`` and forget its entropy coefficient (the ``Learner`` forgets its schedule)."""
        result = super().remove_module(module_id, **kwargs)
        self._entropy_coeffs.pop(module_id, None)
        return result

    # ---- Loss ------------------------------------------------------------------------------

    def compute_vtrace(
        self, *, config: LearnerConfig, batch: Mapping[str, Any], target_logp: Tensor, values: Tensor
    ) -> VTraceReturns:
        """V-trace's ``vs`` and ``pg_advantages`` for one module's minibatch, in its layout (no gradients).

        Args:
            config: The module's hyperparameters (``gamma`` and the clip thresholds).
            batch: The minibatch: rows ``[N]`` of consecutive steps, or sequences ``[S, T]`` with ``loss_mask``.
            target_logp: ``log pi(a_t|x_t)`` of the policy V-trace evaluates (IMPALA: the current one).
            values: ``V(x_t)`` from this minibatch's forward pass.

        Returns:
            ``VTraceReturns`` shaped like ``values``.
        """
        mask = batch.get(Columns.LOSS_MASK)
        common = dict(
            target_logp=target_logp.detach(),
            behaviour_logp=batch[Columns.ACTION_LOGP],
            rewards=batch[Columns.REWARDS],
            values=values.detach(),
            values_bootstrapped=batch[Columns.VALUES_BOOTSTRAPPED],
            # A terminal step's next value is 0; a truncated or cut one's is bootstrapped.
            discounts=config.gamma * (1.0 - batch[Columns.TERMINATEDS].float()),
            clip_rho_threshold=config.vtrace_clip_rho_threshold,
            clip_pg_rho_threshold=config.vtrace_clip_pg_rho_threshold,
        )
        if mask is None:
            return vtrace_on_rows(**common, sequence_ends=batch[Columns.LAST_IN_CHUNK])
        return vtrace_on_sequences(**common, loss_mask=mask)

    def compute_loss_for_module(
        self, *, module_id: str, config: LearnerConfig, batch: dict[str, Tensor], fwd_out: dict[str, Any]
    ) -> Tensor:
        """IMPALA's loss; every mean is over the real steps (``masked_mean``)."""
        mask = batch.get(Columns.LOSS_MASK)  # None for rows; [S, T] for a stateful module's sequences
        dist_class = self.module[module_id].get_train_action_dist_cls()
        target_dist = dist_class.from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        target_logp = target_dist.logp(batch[Columns.ACTIONS])
        values = fwd_out[Columns.VF_PREDS]

        vtrace_out = self.compute_vtrace(config=config, batch=batch, target_logp=target_logp, values=values)
        policy_loss = -masked_mean(target_logp * vtrace_out.pg_advantages, mask)
        vf_loss = 0.5 * masked_mean((values - vtrace_out.vs).pow(2), mask)
        entropy = masked_mean(target_dist.entropy(), mask)
        total_loss = policy_loss + config.vf_loss_coeff * vf_loss - self.entropy_coeff_now(module_id) * entropy

        self.log_loss_terms(module_id, {POLICY_LOSS_KEY: policy_loss, VF_LOSS_KEY: vf_loss, ENTROPY_KEY: entropy})
        self.log_mean_rho(module_id, mask, target_logp, batch[Columns.ACTION_LOGP])
        return total_loss

    def entropy_coeff_now(self, module_id: str) -> float:
        """The entropy coefficient this update's loss uses (set by ``before_gradient_based_update``)."""
        if module_id not in self._entropy_coeffs:  # a loss computed outside an update
            return self.current_scheduled_value(module_id, "entropy_coeff")
        return self._entropy_coeffs[module_id]

    def log_loss_terms(self, module_id: str, terms: Mapping[str, Tensor]) -> None:
        """Log each loss term, averaged over the update's minibatches, under ``(module_id, key)``."""
        for key, value in terms.items():
            self.metrics.log_value((module_id, key), value, window=math.inf, clear_on_reduce=True)

    def log_mean_rho(self, module_id: str, mask: Tensor | None, target_logp: Tensor, behaviour_logp: Tensor) -> None:
        """Log ``mean_vtrace_rho``, the mean unclipped ``pi / mu`` over the real steps: how far off-policy the data is."""
        with torch.no_grad():
            log_rho = target_logp - behaviour_logp
            if mask is not None:  # a padded step's ratio could overflow; it is not averaged anyway
                log_rho = torch.where(mask, log_rho, torch.zeros_like(log_rho))
            rho = masked_mean(torch.exp(log_rho), mask)
        self.log_loss_terms(module_id, {MEAN_VTRACE_RHO_KEY: rho})
