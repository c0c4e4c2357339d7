"""Soft Actor-Critic (Haarnoja et al., 2018): off-policy maximum-entropy RL for Box actions.

A squashed Gaussian actor ``a = tanh(u), u ~ N(mu(s), sigma(s))``, twin Q critics with
Polyak-averaged target copies, and an entropy temperature ``alpha`` tuned towards a target
entropy. Per replay minibatch ``(s, a, r, s')`` (``r`` an n-step return)::

    y            = r + gamma^n * (1 - terminated) * (min_i Q'_i(s', a') - alpha * log pi(a'|s')),  a' ~ pi(s')
    critic loss  = 0.5 * sum_i mean(w * (Q_i(s, a) - y)^2)
    actor loss   = mean(alpha * log pi(a~|s) - min_i Q_i(s, a~)),   a~ ~ pi(s) reparameterized
    alpha loss   = -mean(log_alpha * (log pi(a~|s) + target_entropy))

with ``w`` the replay's importance weights (ones when uniform). By default
(``update_order="joint"``, RLlib's) the Learner backpropagates the sum once, so each loss is
written to reach only its own parameters: the actor loss evaluates the critics with detached
weights, ``alpha`` enters the actor loss and the target detached, and the alpha loss uses a
detached log-probability. Each optimizer ("policy", "qf", "alpha", RLlib's names) therefore
steps with exactly the gradient of its own loss, and all three losses see the weights the
step started from. With ``update_order="critics_first"`` (Stable-Baselines3's and d3rlpy's
order) a minibatch step has two gradient phases: the critics step first, then a second
forward pass trains the actor, and the temperature, against the updated critics
(``Learner.gradient_phases``); ``SACModule``'s train pass is told the phase
(``gradient_phase=``) and computes only what its losses read. The alpha loss is on
``log_alpha`` (as in Stable-Baselines3, CleanRL and RLlib).

The policy acts in ``[-1, 1]^d``, ``d = prod(shape)`` numbers of a Box of any shape; the
module rescales its actions affinely to the Box's ``[low, high]`` and reshapes them to the
Box's shape for the environment, so batches hold env-space actions, and maps them back to
flat ``[-1, 1]^d`` for the critics, which take them concatenated with the flat observation.
Names follow RLlib's SAC config (``initial_alpha``, ``target_entropy``, ``actor_lr``,
``critic_lr``, ``alpha_lr``, ``tau``, ``n_step``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any, ClassVar, Literal, get_args

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_rl.algorithms.box_twin_critics import BoxTwinCriticModule, check_bounded_box_actions
from lightning_rl.algorithms.off_policy import OffPolicyLearner, bootstrap_discounts, row_weights
from lightning_rl.core.arguments import ArgumentCheck, check_choice, check_number, is_real
from lightning_rl.core.columns import Columns
from lightning_rl.core.encoders import OBSERVATION_ENCODER_KEYS, build_observation_encoder
from lightning_rl.core.mlp import build_mlp
from lightning_rl.core.module_checks import ModelConfigKey
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.schedules import ScheduleSetting, check_schedule
from lightning_rl.core.learner_config import LearnerConfig
from lightning_rl.learner.learner import algorithm_module_spec
from lightning_rl.learner.optimizers import default_adam

# SAC's defaults differ from the other modules' (tanh): ReLU MLPs as in the SAC paper and SB3.
SAC_FCNET_HIDDENS: tuple[int, ...] = (256, 256)
SAC_FCNET_ACTIVATION = "relu"
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0

# forward_train / forward_target outputs (RLlib's names where RLlib has them).
QF_PREDS = "qf_preds"
QF_TWIN_PREDS = "qf_twin_preds"
ACTION_LOGP_RESAMPLED = "logp_resampled"
QF_RESAMPLED = "qf_resampled"
QF_TARGET_NEXT = "qf_target_next"
ACTION_LOGP_NEXT = "logp_next"

# Optimizer names (RLlib's).
POLICY_OPTIMIZER = "policy"
QF_OPTIMIZER = "qf"
ALPHA_OPTIMIZER = "alpha"

# Result keys.
QF_LOSS_KEY = "qf_loss"
POLICY_LOSS_KEY = "policy_loss"
ALPHA_LOSS_KEY = "alpha_loss"
ALPHA_VALUE_KEY = "alpha_value"
LOG_ALPHA_VALUE_KEY = "log_alpha_value"
TARGET_ENTROPY_KEY = "target_entropy"
QF_MEAN_KEY = "qf_mean"
LOGP_MEAN_KEY = "logp_mean"

TargetEntropy = float | Literal["auto"]
UpdateOrder = Literal["joint", "critics_first"]
UPDATE_ORDERS = get_args(UpdateOrder)


def check_target_entropy(name: str, value: Any, *, where: str = "") -> None:
    """Raise unless ``value`` is ``"auto"`` or a finite number (a ``TargetEntropy``); an ``ArgumentCheck``."""
    if value != "auto" and not (is_real(value) and math.isfinite(value)):
        prefix = f"{where}: " if where else ""
        raise ValueError(f"{prefix}{name} must be a finite number or 'auto', got {value!r}")


def squashed_gaussian_logp(pre_tanh: Tensor, mean: Tensor, log_std: Tensor, tanh_epsilon: float = 0.0) -> Tensor:
    """``log pi(tanh(u))`` of a tanh-squashed diagonal Gaussian, summed over the action dims.

    The change of variables subtracts ``log(1 - tanh(u)^2)``. With ``tanh_epsilon=0`` it is
    exact, computed as ``2 * (log 2 - u - softplus(-2u))``, which stays finite where ``tanh(u)``
    rounds to +-1: the entropy term keeps pulling a saturated action back from the bound.
    With ``tanh_epsilon > 0`` it is ``log(1 - tanh(u)^2 + tanh_epsilon)``, as Stable-Baselines3,
    RLlib and CleanRL compute it (``1e-6``): bounded, so the pull fades once ``1 - tanh(u)^2``
    falls below ``tanh_epsilon`` and a policy may settle on the bounds.

    Args:
        pre_tanh: The Gaussian samples ``u``, ``[B, d]``.
        mean: The Gaussian's means, ``[B, d]``.
        log_std: Its log standard deviations, ``[B, d]``.
        tanh_epsilon: ``0`` for the exact log-density, else the constant added inside the log.

    Returns:
        ``[B]`` log-densities of the squashed actions ``tanh(u)``.
    """
    normal_logp = -0.5 * ((pre_tanh - mean) / log_std.exp()).pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    if tanh_epsilon > 0:
        log_det_jacobian = torch.log(1 - torch.tanh(pre_tanh).pow(2) + tanh_epsilon)
    else:
        log_det_jacobian = 2 * (math.log(2) - pre_tanh - F.softplus(-2 * pre_tanh))
    return (normal_logp - log_det_jacobian).sum(-1)


class SACModule(BoxTwinCriticModule):
    """SAC's networks: a squashed Gaussian actor, twin Q critics, their targets, ``log_alpha``.

    ``model_config`` keys:

        - ``fcnet_hiddens``: hidden layer sizes of the actor and of each critic (default ``[256, 256]``).
        - ``fcnet_activation``: their activation (default ``"relu"``).
        - ``tanh_epsilon``: ``0`` (default) for the exact log-density of a squashed action;
          ``1e-6`` for Stable-Baselines3's, RLlib's and CleanRL's ``log(1 - tanh(u)^2 + 1e-6)``,
          whose entropy term stops pulling saturated actions back from the bounds
          (:func:`squashed_gaussian_logp`).
        - ``conv_filters``, ``conv_activation``, ``image_layout``: the CNN of image observations
          (:mod:`lightning_rl.core.encoders`).

    The actor (``pi_obs_encoder``, then the MLP ``pi``) maps observations to means and log
    standard deviations (clamped to ``[-20, 2]``) of a Gaussian whose samples are squashed by
    ``tanh`` into ``[-1, 1]``; each critic (``qf``, ``qf_twin``) maps ``concat(features, action
    in [-1, 1])`` to a Q-value, the features from the critics' one observation encoder
    ``qf_obs_encoder`` (shared by the twins, as in Stable-Baselines3; its target copy is
    ``target_qf_obs_encoder``; :class:`BoxTwinCriticModule`). Observation encoders of flat
    observations have no weights.
    ``log_alpha`` starts at 0 (``alpha = 1``); ``SACLearner`` sets it from its
    ``initial_alpha``. An ``inference_only`` module has the actor alone.

    Actions leave and enter the module in env space: ``forward_exploration`` and
    ``forward_inference`` return ``actions`` in the Box's bounds, and ``forward_train`` and
    ``forward_target`` read a batch's env-space ``actions``.

    Raises:
        ValueError: For an action space other than a ``Box`` with finite bounds.
    """

    model_config_keys = {
        "fcnet_hiddens": ModelConfigKey.layer_sizes(SAC_FCNET_HIDDENS),
        "fcnet_activation": ModelConfigKey.activation(SAC_FCNET_ACTIVATION),
        "tanh_epsilon": ModelConfigKey.number(0.0, minimum=0.0),
        **OBSERVATION_ENCODER_KEYS,
    }

    @classmethod
    def check_action_space(cls, action_space: gym.Space) -> None:
        """Raise ``ValueError`` unless ``action_space`` is a ``Box`` (of any shape) with finite bounds."""
        check_bounded_box_actions(cls.__name__, action_space, otherwise="PPO (PPOLearner)")

    def setup(self) -> None:
        config = self.resolved_model_config()  # every key set: the defaults above fill the gaps
        hiddens = list(config["fcnet_hiddens"])
        activation = config["fcnet_activation"]
        self.tanh_epsilon = float(config["tanh_epsilon"])
        self.setup_action_bounds()
        self.pi_obs_encoder = build_observation_encoder(self.observation_space, config)
        self.pi = build_mlp(self.pi_obs_encoder.out_dim, hiddens, activation, 2 * self.action_dim)
        if not self.inference_only:
            self.setup_twin_critics(config, hiddens, activation)
            self.log_alpha = nn.Parameter(torch.zeros(()))
            self.make_target_networks()

    # ---- Actions -------------------------------------------------------------------------

    def action_dist_params(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """The Gaussian's means and clamped log standard deviations, each ``[B, d]``.

        Args:
            features: The actor's features of the observations, ``pi_obs_encoder(obs)`` (flat
                observations: the flattened observations), ``[B, pi_obs_encoder.out_dim]``.
        """
        mean, log_std = self.pi(features).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample_actions(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """Reparameterized squashed actions in ``[-1, 1]`` and their log-probabilities.

        Args:
            features: The actor's features of the observations, as for :meth:`action_dist_params`.

        Returns:
            Actions ``[B, d]`` (differentiable in the actor's weights) and ``[B]`` log-probs.
        """
        mean, log_std = self.action_dist_params(features)
        pre_tanh = _gaussian_sample(mean, log_std)
        return torch.tanh(pre_tanh), squashed_gaussian_logp(pre_tanh, mean, log_std, self.tanh_epsilon)

    # ---- Forward passes ------------------------------------------------------------------

    def forward_inference(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Greedy env-space ``actions``: ``tanh`` of the Gaussian's mean, rescaled to the Box."""
        mean, _ = self.action_dist_params(self.pi_obs_encoder(batch[Columns.OBS]))
        return {Columns.ACTIONS: self.unnormalize_actions(torch.tanh(mean))}

    def forward_exploration(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Sampled env-space ``actions``: ``tanh(u)``, ``u ~ N(mean, std)``, rescaled to the Box."""
        mean, log_std = self.action_dist_params(self.pi_obs_encoder(batch[Columns.OBS]))
        return {Columns.ACTIONS: self.unnormalize_actions(torch.tanh(_gaussian_sample(mean, log_std)))}

    def _forward_train(
        self, batch: dict[str, Any], *, gradient_phase: frozenset[str] | None = None
    ) -> dict[str, Any]:
        """What the three losses need from a replay minibatch, or what one gradient phase's losses need.

        Args:
            batch: ``obs``, env-space ``actions`` and, for the critic target, ``new_obs``.
            gradient_phase: The optimizers the running gradient phase steps
                (``SACLearner.gradient_phases``); ``None``, a step of one phase, for everything.
                With ``update_order="critics_first"`` the critics' phase gets the critics' outputs
                only and the actor's phase the actor's (and temperature's) only.

        Returns:
            For the critics: ``qf_preds`` and ``qf_twin_preds``, the critics' ``Q_i(s, a)``
            (differentiable in the critics), and with ``new_obs`` also ``logp_next`` of
            ``a' ~ pi(s')`` and ``qf_target_next``, ``min_i Q'_i(s', a')``, both without
            gradients. For the actor and temperature: ``action_dist_inputs`` (means, log stds) of
            ``pi(s)``, ``logp_resampled`` of a reparameterized ``a~ ~ pi(s)`` and
            ``qf_resampled``, ``min_i Q_i(s, a~)`` through critics with detached weights
            (differentiable in the actor only). ``a~`` is drawn before ``a'`` when both are.
        """
        if self.inference_only:
            raise ValueError("this SACModule was built with inference_only=True and has no critics to train")
        critics = gradient_phase is None or QF_OPTIMIZER in gradient_phase
        actor = gradient_phase is None or not gradient_phase.isdisjoint({POLICY_OPTIMIZER, ALPHA_OPTIMIZER})
        obs = batch[Columns.OBS]
        features = self.critic_features(obs)
        out = {}
        if critics:
            q_in = torch.cat([features, self.normalize_actions(batch[Columns.ACTIONS])], dim=-1)
            out[QF_PREDS] = self.qf(q_in).squeeze(-1)
            out[QF_TWIN_PREDS] = self.qf_twin(q_in).squeeze(-1)
        if actor:
            mean, log_std = self.action_dist_params(self.pi_obs_encoder(obs))
            pre_tanh = _gaussian_sample(mean, log_std)
            # Detached features: the actor loss reaches neither the critics nor their encoder.
            resampled = torch.cat([features.detach(), torch.tanh(pre_tanh)], dim=-1)
            out[Columns.ACTION_DIST_INPUTS] = torch.cat([mean, log_std], dim=-1)
            out[ACTION_LOGP_RESAMPLED] = squashed_gaussian_logp(pre_tanh, mean, log_std, self.tanh_epsilon)
            # Detached critic weights: the actor loss moves the actor, never the critics.
            out[QF_RESAMPLED] = torch.min(
                _with_detached_weights(self.qf, resampled), _with_detached_weights(self.qf_twin, resampled)
            )
        if critics and Columns.NEXT_OBS in batch:
            with torch.no_grad():
                next_obs = batch[Columns.NEXT_OBS]
                next_actions, out[ACTION_LOGP_NEXT] = self.sample_actions(self.pi_obs_encoder(next_obs))
                next_in = torch.cat([self.critic_features(next_obs, target=True), next_actions], dim=-1)
                out[QF_TARGET_NEXT] = torch.min(self.target_qf(next_in), self.target_qf_twin(next_in)).squeeze(-1)
        return out


def _gaussian_sample(mean: Tensor, log_std: Tensor) -> Tensor:
    """``mean + std * noise``: a Gaussian sample that is differentiable in ``mean`` and ``log_std``."""
    return mean + log_std.exp() * torch.randn_like(mean)


def _with_detached_weights(network: nn.Sequential, inputs: Tensor) -> Tensor:
    """``network(inputs).squeeze(-1)`` with the weights as constants: gradients reach ``inputs`` only.

    Layer by layer with detached ``Linear`` weights, which costs less than
    ``torch.func.functional_call`` (it swaps every parameter in and out on each call); the
    critics are ``build_mlp`` stacks, whose other layers are parameter-free activations.
    """
    features = inputs
    for layer in network:
        if isinstance(layer, nn.Linear):
            bias = None if layer.bias is None else layer.bias.detach()
            features = F.linear(features, layer.weight.detach(), bias)
        else:
            features = layer(features)
    return features.squeeze(-1)


class SACLearner(OffPolicyLearner):
    """SAC's three losses and three optimizers, on the off-policy update loop.

    Each module gets three Adam optimizers, registered under RLlib's names: ``"policy"``
    (the actor), ``"qf"`` (both critics) and ``"alpha"`` (``log_alpha``), each with its own
    learning rate and gradient clip. ``TargetNetworkUpdate`` (added by ``OffPolicyLearner``)
    Polyak-averages the target critics by ``tau`` every ``target_network_update_freq``
    gradient steps.

    Args:
        module_spec: What to build; ``None`` builds a :class:`SACModule` from ``model_config``
            with the spaces of the Trainer's data module.
        model_config: The ``SACModule``'s settings when ``module_spec`` is ``None``
            (``fcnet_hiddens``, ``fcnet_activation``).
        actor_lr: The actor's learning rate: a number or a schedule ``[[timestep, lr], ...]``;
            ``None`` uses the Learner's ``lr``.
        critic_lr: The critics' learning rate, likewise.
        alpha_lr: ``log_alpha``'s learning rate, likewise.
        actor_grad_clip: Clip threshold of the actor's gradients (by ``grad_clip_by``);
            ``None`` uses the Learner's ``grad_clip`` (itself ``None``, no clipping, by default).
        critic_grad_clip: The critics' clip threshold, likewise.
        alpha_grad_clip: ``log_alpha``'s clip threshold, likewise.
        initial_alpha: The entropy temperature ``alpha`` to start from (> 0); each module's
            ``log_alpha`` is set to ``log(initial_alpha)`` when the Learner builds it.
        target_entropy: The entropy the temperature steers the policy towards; ``"auto"``
            for ``-dim(A)`` (minus the number of action dims).
        tau: The target critics' Polyak step size (the ``OffPolicyLearner``'s, which copies by default).
        update_order: ``"joint"`` (RLlib's): one backward pass of the three losses, all computed
            from the weights the step starts from. ``"critics_first"`` (Stable-Baselines3's and
            d3rlpy's): the critics step first, then the actor and the temperature step
            against the updated critics, after a second forward pass; each pass computes only
            its own losses' inputs (1.00-1.09x the time of a "joint" gradient step on CPU,
            ``benchmarks/sac_update_order.py``). The same for every module (not overridable per module);
            not with ``cuda_graphs``.
        **kwargs: The other ``OffPolicyLearner`` and ``Learner`` arguments (``gamma``, ``n_step``,
            ``minibatch_size``, ``lr``, ``grad_clip``, ``grad_clip_by``, ``config_overrides_per_module``, ...).
    """

    masked_observations_refused: ClassVar[str | None] = (
        "its actor picks continuous (Box) actions, which a mask of legal Discrete actions cannot restrict"
    )

    hyperparameter_checks: ClassVar[Mapping[str, ArgumentCheck]] = {
        **dict.fromkeys(("actor_lr", "critic_lr", "alpha_lr"), partial(check_schedule, optional=True)),
        **dict.fromkeys(
            ("actor_grad_clip", "critic_grad_clip", "alpha_grad_clip"),
            partial(check_number, low=0, low_open=True, optional=True),
        ),
        "initial_alpha": partial(check_number, low=0, low_open=True, finite=True),
        "target_entropy": check_target_entropy,
        "update_order": partial(check_choice, choices=UPDATE_ORDERS),
    }

    #: Every module's minibatch steps follow one order.
    learner_wide_hyperparameters: ClassVar[frozenset[str]] = OffPolicyLearner.learner_wide_hyperparameters | {
        "update_order"
    }

    #: The optimizers of the first (critic) phase with ``update_order="critics_first"``; the
    #: second steps "policy" and "alpha". A subclass adds the optimizers that belong with the critics.
    critic_phase_optimizers: ClassVar[frozenset[str]] = frozenset({QF_OPTIMIZER})

    def __init__(
        self,
        module_spec: RLModuleSpec | MultiRLModuleSpec | None = None,
        *,
        model_config: dict[str, Any] | None = None,
        actor_lr: ScheduleSetting | None = None,
        critic_lr: ScheduleSetting | None = None,
        alpha_lr: ScheduleSetting | None = None,
        actor_grad_clip: float | None = None,
        critic_grad_clip: float | None = None,
        alpha_grad_clip: float | None = None,
        initial_alpha: float = 1.0,
        target_entropy: TargetEntropy = "auto",
        tau: float = 0.005,
        update_order: UpdateOrder = "joint",
        **kwargs: Any,
    ) -> None:
        spec = algorithm_module_spec(module_spec, model_config, SACModule, kwargs.get("module"))
        super().__init__(spec, tau=tau, **kwargs)

    @classmethod
    def _check_config(cls, config: Mapping[str, Any], where: str) -> None:
        """The tables' checks, and that ``update_order="critics_first"`` comes without ``cuda_graphs``."""
        super()._check_config(config, where)
        if config["update_order"] == "critics_first" and config["cuda_graphs"]:
            raise ValueError(
                f"{where}: update_order='critics_first' takes two forward and backward passes per gradient step, "
                "the second through the critics the first stepped, which cuda_graphs=True cannot replay; "
                "set cuda_graphs=False or update_order='joint'"
            )

    def gradient_phases(self) -> tuple[frozenset[str] | None, ...]:
        """One phase for ``update_order="joint"``; the critics', then the actor's and temperature's, for
        ``"critics_first"``."""
        if self.config.update_order == "joint":
            return (None,)
        return (self.critic_phase_optimizers, frozenset({POLICY_OPTIMIZER, ALPHA_OPTIMIZER}))

    def configure_optimizers_for_module(self, module_id: str, config: LearnerConfig) -> None:
        """Set ``log_alpha`` to ``log(initial_alpha)``; register the "policy", "qf" and "alpha" Adams.

        Runs when a module is built, and again when sharding (FSDP2) rebuilds the optimizers, which then
        loads the weights back; a checkpoint's weights are loaded after.

        Raises:
            ValueError: If the module is not a training ``SACModule``, or has trainable
                parameters outside the actor, the critics and ``log_alpha`` (no optimizer
                would train them).
        """
        module = self.module[module_id]
        if not isinstance(module, SACModule) or module.inference_only:
            raise ValueError(
                f"module {module_id!r}: SACLearner trains SACModules built for training (inference_only=False), "
                f"got {type(module).__name__}" + (" with inference_only=True" if isinstance(module, SACModule) else "")
            )
        with torch.no_grad():
            module.log_alpha.fill_(math.log(config.initial_alpha))
        groups = {
            POLICY_OPTIMIZER: (
                self.get_parameters(module.pi_obs_encoder) + self.get_parameters(module.pi),
                config.actor_lr,
                config.actor_grad_clip,
            ),
            QF_OPTIMIZER: (
                self.get_parameters(module.qf_obs_encoder)
                + self.get_parameters(module.qf)
                + self.get_parameters(module.qf_twin),
                config.critic_lr,
                config.critic_grad_clip,
            ),
            ALPHA_OPTIMIZER: ([module.log_alpha], config.alpha_lr, config.alpha_grad_clip),
        }
        covered = {id(param) for params, _, _ in groups.values() for param in params}
        uncovered = [
            name for name, param in module.named_parameters() if param.requires_grad and id(param) not in covered
        ]
        if uncovered:
            raise ValueError(
                f"module {module_id!r}: SACLearner trains the actor (pi_obs_encoder, pi), the critics "
                f"(qf_obs_encoder, qf, qf_twin) and log_alpha; parameters {uncovered} belong to none of them"
            )
        for name, (params, lr, grad_clip) in groups.items():
            self.register_optimizer(
                module_id=module_id,
                optimizer_name=name,
                optimizer=default_adam(params),
                params=params,
                lr_or_lr_schedule=config.lr if lr is None else lr,
                grad_clip="module" if grad_clip is None else grad_clip,
            )

    def target_entropy(self, module_id: str) -> float:
        """The target entropy of ``module_id``: ``target_entropy``, or ``-dim(A)`` for ``"auto"``."""
        target = self.config_for_module(module_id).target_entropy
        if target == "auto":
            return -float(self.module[module_id].action_dim)
        return float(target)

    def compute_loss_for_module(
        self, *, module_id: str, config: LearnerConfig, batch: dict[str, Tensor], fwd_out: dict[str, Any]
    ) -> Tensor:
        """The losses of the optimizers the current gradient phase steps, summed (all three with ``"joint"``)."""
        log_alpha = self.module[module_id].log_alpha
        alpha = log_alpha.exp().detach()  # a constant in the critic target and the actor loss
        log = self.metrics.log_value
        losses = []

        if self.in_gradient_phase(QF_OPTIMIZER):
            # Critics: soft Bellman targets from the target critics at a' ~ pi(s').
            with torch.no_grad():
                next_value = fwd_out[QF_TARGET_NEXT] - alpha * fwd_out[ACTION_LOGP_NEXT]
                q_target = batch[Columns.REWARDS] + bootstrap_discounts(batch, config.gamma) * next_value
            td_error = fwd_out[QF_PREDS] - q_target
            td_error_twin = fwd_out[QF_TWIN_PREDS] - q_target
            weights = row_weights(batch)
            qf_loss = 0.5 * ((weights * td_error.pow(2)).mean() + (weights * td_error_twin.pow(2)).mean())
            losses.append(qf_loss)
            self.record_td_errors(module_id, 0.5 * (td_error.abs() + td_error_twin.abs()))
            log((module_id, QF_LOSS_KEY), qf_loss, window=math.inf, clear_on_reduce=True)
            with torch.no_grad():
                q_mean = 0.5 * (fwd_out[QF_PREDS].mean() + fwd_out[QF_TWIN_PREDS].mean())
            log((module_id, QF_MEAN_KEY), q_mean, window=math.inf, clear_on_reduce=True)

        logp = fwd_out.get(ACTION_LOGP_RESAMPLED)  # absent in the critics' phase (update_order="critics_first")
        if self.in_gradient_phase(POLICY_OPTIMIZER):
            # Actor: reparameterized a~ ~ pi(s) against the (weight-detached) critics.
            policy_loss = (alpha * logp - fwd_out[QF_RESAMPLED]).mean()
            losses.append(policy_loss)
            log((module_id, POLICY_LOSS_KEY), policy_loss, window=math.inf, clear_on_reduce=True)
            log((module_id, LOGP_MEAN_KEY), logp.detach().mean(), window=math.inf, clear_on_reduce=True)

        if self.in_gradient_phase(ALPHA_OPTIMIZER):
            # Temperature: raise alpha while the policy's entropy (-logp) is below the target.
            target_entropy = self.target_entropy(module_id)
            alpha_loss = -(log_alpha * (logp + target_entropy).detach()).mean()
            losses.append(alpha_loss)
            log((module_id, ALPHA_LOSS_KEY), alpha_loss, window=math.inf, clear_on_reduce=True)
            log((module_id, ALPHA_VALUE_KEY), alpha, window=1, clear_on_reduce=True)
            # A copy: the optimizer step changes the parameter in place before the values are reduced.
            log((module_id, LOG_ALPHA_VALUE_KEY), log_alpha.detach().clone(), window=1, clear_on_reduce=True)
            log((module_id, TARGET_ENTROPY_KEY), target_entropy, window=1, clear_on_reduce=True)
        return sum(losses[1:], losses[0])
