"""APPO: asynchronous PPO, IMPALA's V-trace with PPO's clipped surrogate against an old (target) policy.

As RLlib's APPO: V-trace (:mod:`lightning_rl.core.vtrace`) evaluates an *old* copy of the
policy, ``pi_old``, that follows the trained one only every ``target_network_update_freq``
gradient steps; the behaviour policy ``mu`` is the one that acted (``action_logp``). Per minibatch

    is_ratio  = clip(mu(a|x) / pi_old(a|x), 0, 2)
    r         = is_ratio * pi(a|x) / mu(a|x)
    pi_loss   = -mean(min(A * r, A * clip(r, 1 - clip_param, 1 + clip_param)))     A: V-trace's pg_advantages
    vf_loss   = 0.5 * mean((V(x) - vs)^2)
    total     = pi_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy  [+ kl_coeff * KL(pi_old || pi)]

The old policy is the module's target network (:class:`APPOModule`, ``TargetNetworkAPI``),
moved by the package's ``TargetNetworkUpdate`` callback and saved with the module.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, ClassVar

import torch
from lightning.pytorch import Callback
from torch import Tensor, nn

from lightning_rl.algorithms.impala import IMPALALearner
from lightning_rl.algorithms.ppo import (
    CLIP_FRACTION_KEY,
    CURR_KL_COEFF_KEY,
    ENTROPY_KEY,
    MEAN_KL_KEY,
    POLICY_LOSS_KEY,
    VF_LOSS_KEY,
    AdaptiveKLCoeffMixin,
    KLCoeffAdaptation,
    KLCoefficients,
    PPOModule,
)
from lightning_rl.callbacks.target_network import TargetNetworkUpdate
from lightning_rl.core.arguments import ArgumentCheck, check_bool, check_int, check_number
from lightning_rl.core.batch import masked_mean
from lightning_rl.core.columns import Columns
from lightning_rl.core.learner_config import LearnerConfig
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.target_network import TargetNetworkAPI, make_target_network, update_target_networks

OLD_ACTION_DIST_INPUTS = "old_action_dist_inputs"
"""The old (target) policy's action-distribution inputs (``APPOModule.forward_target``)."""

#: The bound of the importance ratio ``mu / pi_old`` in APPO's surrogate (RLlib's constant).
IS_RATIO_CLIP = 2.0


class APPOModule(PPOModule, TargetNetworkAPI):
    """A :class:`~lightning_rl.algorithms.ppo.PPOModule` with a frozen copy of its policy: the old policy APPO evaluates.

    The copy, ``old_policy``, is an inference-only ``PPOModule`` of the same settings (with
    separate networks it has no value network), whose parameters need no gradients; it is
    a submodule, so checkpoints save and restore it. Its ``(online, target)`` pairs are the
    policy's parts: the observation encoder, recurrent core, MLP and head of the policy (the
    shared ones with ``vf_share_layers``) and the free log standard deviation.
    ``inference_only`` modules build no old policy. ``model_config`` takes ``PPOModule``'s keys.
    """

    def setup(self) -> None:
        super().setup()
        self.old_policy: PPOModule | None = None
        if not self.inference_only:
            self.make_target_networks()

    def make_target_networks(self) -> None:
        """The old policy: an inference-only ``PPOModule`` with this module's policy weights."""
        # Its initial weights are overwritten at once: drawing them must not move the global RNG.
        with torch.random.fork_rng(devices=[]):
            old_policy = PPOModule(self.observation_space, self.action_space, self.model_config, inference_only=True)
        self.old_policy = make_target_network(old_policy)
        update_target_networks(self, tau=1.0)

    def get_target_network_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        """The policy's parts and the old policy's; empty for an ``inference_only`` module."""
        if self.old_policy is None:
            return []
        return list(zip(policy_parts(self), policy_parts(self.old_policy)))

    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``{"old_action_dist_inputs": ...}``: the old policy's action-distribution inputs on ``batch`` (action masks applied).

        Raises:
            ValueError: For an ``inference_only`` module, which has no old policy.
        """
        if self.old_policy is None:
            raise ValueError("this APPOModule was built with inference_only=True and has no old (target) policy")
        return {OLD_ACTION_DIST_INPUTS: self.old_policy.forward_inference(batch)[Columns.ACTION_DIST_INPUTS]}


def policy_parts(module: PPOModule) -> list[nn.Module]:
    """The networks a ``PPOModule``'s action distribution depends on, in a fixed order.

    The free log standard deviation, a bare parameter, comes wrapped in a ``ParameterList``
    that holds the module's own parameter (not a copy), so a target update writes into it.
    """
    names = ("obs_encoder", "core", "encoder", "pi_obs_encoder", "pi_core", "pi")
    parts: list[nn.Module] = [getattr(module, name) for name in names if getattr(module, name) is not None]
    if module.free_log_std:
        parts.append(nn.ParameterList([module.log_std]))
    return parts


class APPOLearner(AdaptiveKLCoeffMixin, IMPALALearner):
    """APPO's loss (V-trace against an old policy, PPO's clipped surrogate) on the Learner's update loop.

    The old policy follows the trained one every ``target_network_update_freq`` gradient
    steps, counted by the Learner's lifetime ``weights_seq_no`` (so a resumed run keeps the
    phase): after the update whose steps reach a multiple of it, the ``TargetNetworkUpdate``
    callback moves the old policy by ``tau`` (1: a copy). At APPO's defaults
    (``num_epochs=1``, ``minibatch_size=None``) an update takes one gradient step, so this
    counts updates. RLlib counts the same setting in units of ``circular_buffer_num_batches *
    circular_buffer_iterations_per_batch`` updates: RLlib's ``2`` at its defaults (4 and 2) is
    ``16`` here, the default.

    With ``use_kl_loss``, the loss adds ``kl_coeff * KL(pi_old || pi)``, and the coefficient
    adapts after every update (``KLCoeffAdaptation``, PPO's rule; RLlib adapts it when the old
    policy is updated).

    Args:
        module_spec, model_config: As for ``IMPALALearner``; ``None`` builds an :class:`APPOModule`.
        clip_param: The surrogate's clip range epsilon (RLlib's APPO default 0.4).
        use_kl_loss: Whether to add the KL loss.
        kl_coeff: The KL coefficient to start from.
        kl_target: The KL divergence per update the adaptation aims at.
        target_network_update_freq: Gradient steps between two updates of the old policy (>= 1).
        tau: The old policy's Polyak step in ``(0, 1]``: ``old <- tau * pi + (1 - tau) * old``.
        circular_buffer_num_batches, circular_buffer_iterations_per_batch, broadcast_interval:
            As for ``IMPALALearner``, with RLlib's APPO defaults (4, 2, 1).
        **kwargs: The other ``IMPALALearner`` arguments (``gamma``, ``vf_loss_coeff``,
            ``entropy_coeff``, ``vtrace_clip_rho_threshold``, ``grad_clip``, ``lr``, ...).

    Raises:
        ValueError: One line naming the setting, for a value out of its range.
    """

    #: The target network's ``tau`` and update interval are one callback's, for every module.
    learner_wide_hyperparameters: ClassVar[frozenset[str]] = IMPALALearner.learner_wide_hyperparameters | {
        "tau",
        "target_network_update_freq",
    }

    hyperparameter_checks: ClassVar[Mapping[str, ArgumentCheck]] = {
        "clip_param": partial(check_number, low=0, low_open=True),
        "use_kl_loss": check_bool,
        "kl_coeff": partial(check_number, low=0),
        "kl_target": partial(check_number, low=0),
        "target_network_update_freq": check_int,
        "tau": partial(check_number, low=0, high=1, low_open=True),
    }
    default_module_class: ClassVar[type[PPOModule]] = APPOModule

    def __init__(
        self,
        module_spec: RLModuleSpec | MultiRLModuleSpec | None = None,
        *,
        model_config: dict[str, Any] | None = None,
        clip_param: float = 0.4,
        use_kl_loss: bool = False,
        kl_coeff: float = 1.0,
        kl_target: float = 0.01,
        target_network_update_freq: int = 16,
        tau: float = 1.0,
        circular_buffer_num_batches: int = 4,
        circular_buffer_iterations_per_batch: int = 2,
        broadcast_interval: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            module_spec,
            model_config=model_config,
            circular_buffer_num_batches=circular_buffer_num_batches,
            circular_buffer_iterations_per_batch=circular_buffer_iterations_per_batch,
            broadcast_interval=broadcast_interval,
            **kwargs,
        )
        self._curr_kl_coeffs = KLCoefficients(self._initial_kl_coeff)

    @classmethod
    def rl_module_required_apis(cls) -> list[type]:
        """APPO trains modules with a value function and an old policy (``ValueFunctionAPI``, ``TargetNetworkAPI``)."""
        return [*super().rl_module_required_apis(), TargetNetworkAPI]

    def configure_callbacks(self) -> list[Callback]:
        """The old policy's updates (``TargetNetworkUpdate``) and, with the KL loss, the coefficient's adaptation."""
        callbacks: list[Callback] = [
            TargetNetworkUpdate(update_interval=self.hparams.target_network_update_freq, tau=self.hparams.tau)
        ]
        if self.hparams.use_kl_loss:
            callbacks.append(KLCoeffAdaptation())
        return callbacks

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        """IMPALA's (the entropy coefficients), and logs each module's KL coefficient for this update."""
        super().before_gradient_based_update(timesteps=timesteps)
        for module_id in self.module.keys():
            coeff = self.curr_kl_coeff(module_id)
            self.metrics.log_value((module_id, CURR_KL_COEFF_KEY), coeff, window=1, clear_on_reduce=True)

    def compute_loss_for_module(
        self, *, module_id: str, config: LearnerConfig, batch: dict[str, Tensor], fwd_out: dict[str, Any]
    ) -> Tensor:
        """APPO's loss; every mean is over the real steps (``masked_mean``)."""
        mask = batch.get(Columns.LOSS_MASK)  # None for rows; [S, T] for a stateful module's sequences
        module = self.module[module_id]
        dist_class = module.get_train_action_dist_cls()
        actions, behaviour_logp = batch[Columns.ACTIONS], batch[Columns.ACTION_LOGP]
        curr_dist = dist_class.from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        with torch.no_grad():
            old_dist = dist_class.from_logits(module.forward_target(batch)[OLD_ACTION_DIST_INPUTS])
            old_logp = old_dist.logp(actions)
        curr_logp = curr_dist.logp(actions)
        values = fwd_out[Columns.VF_PREDS]

        # V-trace evaluates the old policy from the behaviour policy's steps.
        vtrace_out = self.compute_vtrace(config=config, batch=batch, target_logp=old_logp, values=values)
        advantages = vtrace_out.pg_advantages

        # The surrogate's ratio pi / pi_old, through mu: the behaviour-to-old weight is bounded.
        behaviour_minus_old, curr_minus_behaviour = behaviour_logp - old_logp, curr_logp - behaviour_logp
        if mask is not None:  # padded steps: ratio 1, so exp cannot overflow into the masked gradient
            behaviour_minus_old = torch.where(mask, behaviour_minus_old, torch.zeros_like(behaviour_minus_old))
            curr_minus_behaviour = torch.where(mask, curr_minus_behaviour, torch.zeros_like(curr_minus_behaviour))
        is_ratio = torch.exp(behaviour_minus_old).clamp(0.0, IS_RATIO_CLIP)
        logp_ratio = is_ratio * torch.exp(curr_minus_behaviour)
        clip = config.clip_param
        surrogate = torch.min(advantages * logp_ratio, advantages * logp_ratio.clamp(1 - clip, 1 + clip))
        policy_loss = -masked_mean(surrogate, mask)

        vf_loss = 0.5 * masked_mean((values - vtrace_out.vs).pow(2), mask)
        entropy = masked_mean(curr_dist.entropy(), mask)
        total_loss = policy_loss + config.vf_loss_coeff * vf_loss - self.entropy_coeff_now(module_id) * entropy

        if config.use_kl_loss:
            mean_kl = masked_mean(old_dist.kl(curr_dist), mask)
            total_loss = total_loss + self.curr_kl_coeff(module_id) * mean_kl
        else:
            with torch.no_grad():  # for logging only
                mean_kl = masked_mean(old_dist.kl(curr_dist), mask)

        with torch.no_grad():
            clip_fraction = masked_mean(((logp_ratio - 1).abs() > clip).float(), mask)
        terms = {POLICY_LOSS_KEY: policy_loss, VF_LOSS_KEY: vf_loss, ENTROPY_KEY: entropy, MEAN_KL_KEY: mean_kl}
        self.log_loss_terms(module_id, {**terms, CLIP_FRACTION_KEY: clip_fraction})
        self.log_mean_rho(module_id, mask, old_logp, behaviour_logp)
        return total_loss
