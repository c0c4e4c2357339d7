"""Conservative Q-Learning (Kumar et al., 2020) on SAC: offline RL for Box actions.

SAC's three losses (see :mod:`lightning_rl.algorithms.sac`) plus a conservative penalty on
both critics, which pushes Q down on actions the data does not hold and up on the data's own.
Per minibatch of dataset rows ``(s, a, r, s')``, for each critic ``Q_i``:

    gap_i   = mean_s[ logsumexp_j (Q_i(s, a_j) - log mu(a_j | s)) - Q_i(s, a) ]
    penalty = cql_weight * mean_i gap_i                                   (added to the critic loss)

over ``3 * num_cql_actions`` sampled actions ``a_j`` per row: ``num_cql_actions`` uniform in
the module's normalized action range ``[-1, 1]^d`` (``log mu = -d log 2``), as many from the
policy at ``s`` and as many from the policy at ``s'`` (``log mu`` their log-probabilities), all
evaluated at ``s``. The sampled actions and their densities are constants: the penalty trains
the critics only, never the actor. All sampled actions go through each critic in one batched call.

With ``lagrangian=True`` the penalty's weight is tuned (dual gradient descent) to hold the gap
at ``lagrangian_threshold``: the critic loss gets ``alpha' * cql_weight * (mean_i gap_i - threshold)``
with ``alpha' = exp(log_alpha_prime)`` clamped to ``[0, 1e6]``, and ``log_alpha_prime`` (its own
optimizer, ``"alpha_prime"``) minimizes ``-alpha' * cql_weight * (mean_i gap_i - threshold)``: it
rises while the gap is above the threshold and falls while below.

**Formulation and defaults follow d3rlpy 2.8's ``CQL``** (the benchmark runs both side by side)
where it and RLlib's differ:

- the critics' Bellman target by default has no entropy term and takes the policy's mean action,
  ``y = r + gamma * (1 - terminated) * min_i Q'_i(s', tanh(mu(s')))`` (d3rlpy ``soft_q_backup=False``;
  RLlib's ``deterministic_backup`` also drops the entropy but samples ``a'``); ``soft_q_backup=True``
  is SAC's target;
- the uniform actions' log-density is ``-d log 2`` (RLlib uses ``log(sqrt(d))``), no ``temperature``
  and no ``bc_iters`` (RLlib's behaviour-cloning warm start of the actor);
- the Lagrange threshold applies to the unweighted gap (d3rlpy ``alpha_threshold``, RLlib
  ``lagrangian_thresh``, default 10 as d3rlpy's), the multiplier's loss is on ``alpha'``
  itself (not its log), clamped as d3rlpy and RLlib's old stack clamp it;
- learning rates: actor ``1e-4``, critics ``3e-4``, temperature ``1e-4``, ``alpha'`` ``1e-4``.

Scales: d3rlpy sums the critics' TD losses and their penalties; SAC's critic loss here is half
that sum, so the penalty is the *mean* over the critics: each term keeps d3rlpy's proportion,
which is what Adam's steps depend on. Update order: d3rlpy steps the critics, then the actor
against the updated critics; here that is ``update_order="critics_first"`` (the critics and
``alpha'`` in the first gradient phase, the actor and the temperature in the second), and the
default ``"joint"`` computes every loss from the weights the step starts from. What remains:
d3rlpy tunes the temperature (on ``alpha``, here on ``log_alpha``, as SAC here does) and
``alpha'`` before the losses that use them, here they step with them. d3rlpy's
non-Lagrangian mode (``alpha_learning_rate=0``) multiplies the penalty by its fixed ``initial_alpha``;
here ``lagrangian=False`` uses ``cql_weight`` alone, and d3rlpy's default is the Lagrangian mode.
RLlib names: ``cql_weight`` is ``min_q_weight``, ``num_cql_actions`` is ``num_actions``.
``benchmarks/cql_parity.py`` checks one step against d3rlpy's own code from the same weights and
batch: the same target and TD loss, gaps and gradients up to the sampling noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lightning_rl.algorithms.sac import (
    ACTION_LOGP_NEXT,
    QF_OPTIMIZER,
    QF_PREDS,
    QF_TARGET_NEXT,
    QF_TWIN_PREDS,
    SACLearner,
    SACModule,
    squashed_gaussian_logp,
)
from lightning_rl.core.arguments import ArgumentCheck, check_bool, check_int, check_number
from lightning_rl.core.columns import Columns
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.learner_config import LearnerConfig
from lightning_rl.core.schedules import ScheduleSetting, check_schedule
from lightning_rl.learner.learner import algorithm_module_spec
from lightning_rl.learner.optimizers import default_adam

# Optimizer of the Lagrange multiplier (RLlib's old stack calls it alpha_prime).
ALPHA_PRIME_OPTIMIZER = "alpha_prime"

# Result keys.
CQL_PENALTY_KEY = "cql_penalty"
CQL_ALPHA_KEY = "cql_alpha"
CQL_ALPHA_LOSS_KEY = "cql_alpha_loss"

# d3rlpy's (and RLlib's old stack's) bound on alpha' = exp(log_alpha_prime).
ALPHA_PRIME_MAX = 1e6


def conservative_gap(sampled_values: Tensor, data_values: Tensor) -> Tensor:
    """Each critic's conservative gap: the mean over rows of ``logsumexp_j(values) - Q(s, a_data)``.

    Args:
        sampled_values: ``[n_critics, B, K]``: each critic's Q-values of ``K`` sampled actions
            per row, minus the log-density each action was drawn with.
        data_values: ``[n_critics, B]``: each critic's Q-value of the row's own action.

    Returns:
        ``[n_critics]``, one gap per critic.
    """
    return (torch.logsumexp(sampled_values, dim=-1) - data_values).mean(dim=-1)


class CQLModule(SACModule):
    """SAC's networks plus the Lagrange multiplier of CQL's penalty, ``log_alpha_prime``.

    ``model_config`` keys are SAC's. ``log_alpha_prime`` is a 0-d parameter (``alpha' = 1`` at
    first; ``CQLLearner`` sets it from ``initial_lagrangian_alpha``), trained only with
    ``lagrangian=True`` and frozen otherwise; an ``inference_only`` module has the actor alone.

    ``forward_train`` is SAC's without the Bellman target of ``new_obs``, which ``CQLLearner``
    takes from :meth:`next_state_values` (soft or deterministic backup, as configured); the
    penalty's Q-values come from :meth:`conservative_q_values`.
    """

    def setup(self) -> None:
        super().setup()
        if not self.inference_only:
            self.log_alpha_prime = nn.Parameter(torch.zeros(()))

    def _forward_train(
        self, batch: dict[str, Any], *, gradient_phase: frozenset[str] | None = None
    ) -> dict[str, Any]:
        """SAC's train pass on ``obs`` and ``actions`` (``new_obs`` is left to :meth:`next_state_values`)."""
        without_next = {k: v for k, v in batch.items() if k != Columns.NEXT_OBS}
        return super()._forward_train(without_next, gradient_phase=gradient_phase)

    def next_state_values(self, next_obs: Tensor, *, soft: bool) -> tuple[Tensor, Tensor]:
        """The target critics' value of ``s'`` for the Bellman target, without gradients.

        Args:
            next_obs: ``new_obs``, ``[B, ...]``.
            soft: ``True`` for SAC's backup: ``a' ~ pi(s')`` and its log-probability (one draw of
                the global RNG); ``False`` for d3rlpy's default: ``a' = tanh(mu(s'))``, log-probability
                zero (no entropy term), no draw.

        Returns:
            ``min_i Q'_i(s', a')`` and ``log pi(a'|s')``, each ``[B]``.
        """
        with torch.no_grad():
            features = self.pi_obs_encoder(next_obs)
            if soft:
                actions, logp = self.sample_actions(features)
            else:
                mean, _ = self.action_dist_params(features)
                actions, logp = torch.tanh(mean), mean.new_zeros(mean.shape[0])
            q_in = torch.cat([self.critic_features(next_obs, target=True), actions], dim=-1)
            return torch.min(self.target_qf(q_in), self.target_qf_twin(q_in)).squeeze(-1), logp

    def conservative_q_values(self, obs: Tensor, next_obs: Tensor, num_actions: int) -> Tensor:
        """Both critics' Q-values at ``s`` of CQL's sampled actions, minus their log-densities.

        Draws (global RNG, in this order) ``num_actions`` uniform actions in ``[-1, 1]^d`` per row,
        shape ``[B, N, d]``, then the Gaussian noise of ``num_actions`` policy samples at each of
        ``s`` and ``s'``, shape ``[2B, N, d]`` (rows of ``s`` first). The samples and densities are
        constants; only the critics' weights get gradients.

        Args:
            obs: Observations ``s``, ``[B, ...]``.
            next_obs: Next observations ``s'``, ``[B, ...]``.
            num_actions: ``N``, samples of each kind per row.

        Returns:
            ``[2, B, 3N]``: for ``qf`` and ``qf_twin``, the values of the uniform actions, then the
            policy's at ``s``, then the policy's at ``s'``.
        """
        features = self.critic_features(obs)
        rows, dim = features.shape[0], self.action_dim
        with torch.no_grad():
            uniform = torch.empty(rows, num_actions, dim, device=features.device).uniform_(-1.0, 1.0)
            # One actor pass over s and s' together.
            both = self.pi_obs_encoder(torch.cat([obs, next_obs]))
            mean, log_std = (x.unsqueeze(1) for x in self.action_dist_params(both))
            pre_tanh = mean + log_std.exp() * torch.randn(2 * rows, num_actions, dim, device=mean.device)
            policy_logp = squashed_gaussian_logp(pre_tanh, mean, log_std, self.tanh_epsilon)  # [2B, N]
            policy_actions = torch.tanh(pre_tanh)
            actions = torch.cat([uniform, policy_actions[:rows], policy_actions[rows:]], dim=1)  # [B, 3N, d]
            uniform_logp = policy_logp.new_full((rows, num_actions), -dim * math.log(2.0))
            log_density = torch.cat([uniform_logp, policy_logp[:rows], policy_logp[rows:]], dim=1)  # [B, 3N]
        samples = actions.shape[1]
        q_in = torch.cat([features.unsqueeze(1).expand(rows, samples, features.shape[1]), actions], dim=-1)
        q_in = q_in.reshape(rows * samples, -1)
        values = torch.stack([self.qf(q_in).view(rows, samples), self.qf_twin(q_in).view(rows, samples)])
        return values - log_density


class CQLLearner(SACLearner):
    """CQL: SAC's losses plus the conservative penalty on both critics, optionally Lagrangian.

    Optimizers are SAC's ``"policy"``, ``"qf"`` and ``"alpha"``, and with ``lagrangian=True``
    ``"alpha_prime"`` for ``log_alpha_prime``. Results add ``cql_penalty`` (``cql_weight`` times the
    mean gap) and, Lagrangian, ``cql_alpha`` (``alpha'`` at the step) and ``cql_alpha_loss``;
    ``qf_loss`` stays SAC's TD loss. The penalty is not importance-weighted (replay ``weights``
    weigh the TD loss only). Batches need ``obs``, ``actions``, ``rewards``, ``new_obs`` and
    ``terminateds`` (dataset rows, or replay minibatches with ``n_step`` for the TD target).
    See the module docstring for the losses and where they follow d3rlpy rather than RLlib.

    Args:
        module_spec: What to build; ``None`` builds a :class:`CQLModule` from ``model_config`` with
            the spaces of the Trainer's data module.
        model_config: The ``CQLModule``'s settings when ``module_spec`` is ``None`` (SAC's keys).
        cql_weight: Weight of the conservative penalty (d3rlpy ``conservative_weight``, RLlib
            ``min_q_weight``); 0 trains SAC (with this Learner's backup) and draws no samples.
        num_cql_actions: Actions of each kind (uniform, policy at ``s``, policy at ``s'``) sampled
            per row for the penalty's logsumexp (d3rlpy ``n_action_samples``, RLlib ``num_actions``).
        lagrangian: Whether to tune the penalty's multiplier ``alpha'`` so that the gap stays at
            ``lagrangian_threshold``.
        lagrangian_threshold: The gap the multiplier steers to (d3rlpy ``alpha_threshold``, RLlib
            ``lagrangian_thresh``).
        lagrangian_lr: ``log_alpha_prime``'s learning rate: a number or a schedule; ``None`` uses the
            Learner's ``lr`` (d3rlpy ``alpha_learning_rate``).
        initial_lagrangian_alpha: ``alpha'`` to start from with ``lagrangian`` (> 0; d3rlpy ``initial_alpha``).
        soft_q_backup: ``True`` for SAC's entropy-regularized target from a sampled ``a'``;
            ``False`` (d3rlpy's default) for ``min_i Q'_i(s', tanh(mu(s')))`` without entropy.
        actor_lr: As in ``SACLearner``; d3rlpy's ``1e-4`` by default, ``None`` for the Learner's ``lr``.
        critic_lr: Likewise, ``3e-4``.
        alpha_lr: The temperature's, likewise, ``1e-4``.
        **kwargs: ``SACLearner``'s other arguments (``initial_alpha``, ``target_entropy``, ``gamma``,
            ``tau``, ``minibatch_size``, clips, ...) and the ``Learner``'s.

    Raises:
        ValueError: For an argument out of range, or ``lagrangian=True`` with ``cql_weight=0``
            (there would be no penalty to weigh).
    """

    hyperparameter_checks: ClassVar[Mapping[str, ArgumentCheck]] = {
        "cql_weight": partial(check_number, low=0, finite=True),
        "num_cql_actions": check_int,
        "lagrangian": check_bool,
        "soft_q_backup": check_bool,
        "lagrangian_threshold": partial(check_number, finite=True),
        "lagrangian_lr": partial(check_schedule, optional=True),
        "initial_lagrangian_alpha": partial(check_number, low=0, high=ALPHA_PRIME_MAX, low_open=True),
    }

    # With update_order="critics_first", the penalty's multiplier steps with the critics whose penalty it weighs.
    critic_phase_optimizers: ClassVar[frozenset[str]] = frozenset({QF_OPTIMIZER, ALPHA_PRIME_OPTIMIZER})

    def __init__(
        self,
        module_spec: RLModuleSpec | MultiRLModuleSpec | None = None,
        *,
        model_config: dict[str, Any] | None = None,
        cql_weight: float = 5.0,
        num_cql_actions: int = 10,
        lagrangian: bool = False,
        lagrangian_threshold: float = 10.0,
        lagrangian_lr: ScheduleSetting | None = 1e-4,
        initial_lagrangian_alpha: float = 1.0,
        soft_q_backup: bool = False,
        actor_lr: ScheduleSetting | None = 1e-4,
        critic_lr: ScheduleSetting | None = 3e-4,
        alpha_lr: ScheduleSetting | None = 1e-4,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            algorithm_module_spec(module_spec, model_config, CQLModule, kwargs.get("module")),
            actor_lr=actor_lr,
            critic_lr=critic_lr,
            alpha_lr=alpha_lr,
            **kwargs,
        )

    @classmethod
    def _check_config(cls, config: Mapping[str, Any], where: str) -> None:
        """The tables' checks, and that ``lagrangian`` has a penalty to weigh."""
        super()._check_config(config, where)
        if config["lagrangian"] and config["cql_weight"] == 0:
            raise ValueError(
                f"{where}: lagrangian=True tunes the weight of cql_weight * (gap - lagrangian_threshold), "
                "which is zero with cql_weight=0; set cql_weight > 0 or lagrangian=False"
            )

    def configure_optimizers_for_module(self, module_id: str, config: LearnerConfig) -> None:
        """SAC's three optimizers, and with ``lagrangian`` an ``"alpha_prime"`` Adam on ``log_alpha_prime``.

        Runs when a module is built, and again when sharding (FSDP2) rebuilds the optimizers; a
        checkpoint's weights are loaded after. Without ``lagrangian``, ``log_alpha_prime`` is frozen
        (``requires_grad=False``): no optimizer trains it and DDP/FSDP reduce no gradient of it.

        Raises:
            ValueError: If the module is not a training ``CQLModule``, or has trainable parameters
                outside the actor, the critics and the two multipliers.
        """
        module = self.module[module_id]
        if not isinstance(module, CQLModule) or module.inference_only:
            raise ValueError(
                f"module {module_id!r}: CQLLearner trains CQLModules built for training (inference_only=False), "
                f"got {type(module).__name__}" + (" with inference_only=True" if isinstance(module, CQLModule) else "")
            )
        log_alpha_prime = module.log_alpha_prime
        # Frozen while SAC's optimizers are registered: SACLearner refuses parameters none of its three trains.
        log_alpha_prime.requires_grad_(False)
        super().configure_optimizers_for_module(module_id, config)
        if not config.lagrangian:
            return
        log_alpha_prime.requires_grad_(True)
        with torch.no_grad():
            log_alpha_prime.fill_(math.log(config.initial_lagrangian_alpha))
        self.register_optimizer(
            module_id=module_id,
            optimizer_name=ALPHA_PRIME_OPTIMIZER,
            optimizer=default_adam([log_alpha_prime]),
            params=[log_alpha_prime],
            lr_or_lr_schedule=config.lr if config.lagrangian_lr is None else config.lagrangian_lr,
        )

    def compute_loss_for_module(
        self, *, module_id: str, config: LearnerConfig, batch: dict[str, Tensor], fwd_out: dict[str, Any]
    ) -> Tensor:
        module = self.module[module_id]
        critics = self.in_gradient_phase(QF_OPTIMIZER)  # False in update_order="critics_first"'s actor phase
        if critics:
            # SAC's loss reads the target's next-state value from fwd_out: the backup configured here.
            fwd_out = dict(fwd_out)
            fwd_out[QF_TARGET_NEXT], fwd_out[ACTION_LOGP_NEXT] = module.next_state_values(
                batch[Columns.NEXT_OBS], soft=config.soft_q_backup
            )
        loss = super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        if config.cql_weight == 0 or not critics:
            return loss

        sampled = module.conservative_q_values(batch[Columns.OBS], batch[Columns.NEXT_OBS], config.num_cql_actions)
        gap = conservative_gap(sampled, torch.stack([fwd_out[QF_PREDS], fwd_out[QF_TWIN_PREDS]])).mean()
        penalty = config.cql_weight * gap
        log = self.metrics.log_value
        log((module_id, CQL_PENALTY_KEY), penalty.detach(), window=math.inf, clear_on_reduce=True)
        if not config.lagrangian:
            return loss + penalty

        # Dual descent on alpha': the critics see it as a constant, its own loss sees the gap as one.
        alpha_prime = module.log_alpha_prime.exp().clamp(0.0, ALPHA_PRIME_MAX)
        violation = config.cql_weight * (gap - config.lagrangian_threshold)
        alpha_prime_loss = -(alpha_prime * violation.detach())
        log((module_id, CQL_ALPHA_KEY), alpha_prime.detach(), window=1, clear_on_reduce=True)
        log((module_id, CQL_ALPHA_LOSS_KEY), alpha_prime_loss.detach(), window=math.inf, clear_on_reduce=True)
        return loss + alpha_prime.detach() * violation + alpha_prime_loss
