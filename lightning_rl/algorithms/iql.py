"""Implicit Q-Learning (Kostrikov et al., 2021): offline RL that never queries actions outside the data.

Three networks learn from dataset transitions ``(s, a, r, s', terminated)`` alone::

    V loss      = mean(|expectile - 1(u < 0)| * u^2),   u = min_i Q'_i(s, a) - V(s)
    Q loss      = sum_i mean((Q_i(s, a) - y)^2),        y = r + gamma * (1 - terminated) * V(s')
    actor loss  = -mean(min(exp(beta * (min_i Q'_i(s, a) - V(s))), max_weight) * log pi(a|s))

with ``Q'_i`` the Polyak-averaged target critics; the targets ``min_i Q'_i``, ``V(s')`` and the
actor's weights are constants. The value network fits an upper expectile of the target
critics' values of the data's actions (an in-sample maximum), the critics regress onto it, and
the actor is advantage-weighted behaviour cloning. Defaults, network shapes and the actor's
parameterization are d3rlpy 2.8's ``IQLConfig``: ReLU MLPs of ``[256, 256]``, expectile 0.7,
weight temperature 3, weights clipped at 100, ``tau`` 0.005, learning rates 3e-4; the actor a
Gaussian whose mean is ``tanh`` of an MLP and whose log standard deviation is one
state-independent parameter squashed into ``[-5, 2]`` by a sigmoid.

Unlike d3rlpy, which steps the critics and then the actor, every loss here is taken on the
same weights before one backward pass; each optimizer ("policy", "qf", "vf") still steps
with exactly the gradient of its own loss. Batches hold env-space actions; the module maps
them affinely to ``[-1, 1]`` (as ``SACModule`` does, d3rlpy's ``MinMaxActionScaler``) for the
critics and the actor's log-likelihood, and maps its actions back to the Box.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any, ClassVar

import gymnasium as gym
import torch
from torch import Tensor, nn

from lightning_rl.algorithms.box_twin_critics import BoxTwinCriticModule, check_bounded_box_actions
from lightning_rl.algorithms.off_policy import OffPolicyLearner, bootstrap_discounts, row_weights
from lightning_rl.core.arguments import ArgumentCheck, check_number
from lightning_rl.core.columns import Columns
from lightning_rl.core.distributions import DiagGaussian
from lightning_rl.core.encoders import OBSERVATION_ENCODER_KEYS, build_observation_encoder
from lightning_rl.core.mlp import build_mlp
from lightning_rl.core.module_checks import ModelConfigKey
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.schedules import ScheduleSetting, check_schedule
from lightning_rl.core.learner_config import LearnerConfig
from lightning_rl.learner.learner import algorithm_module_spec
from lightning_rl.learner.optimizers import default_adam

# d3rlpy's defaults: ReLU MLPs of [256, 256] (its VectorEncoderFactory), log std in [-5, 2].
IQL_FCNET_HIDDENS: tuple[int, ...] = (256, 256)
IQL_FCNET_ACTIVATION = "relu"
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0

# forward_train / forward_target outputs.
QF_PREDS = "qf_preds"
QF_TWIN_PREDS = "qf_twin_preds"
QF_TARGET_MIN = "qf_target_min"
VF_NEXT = "vf_next"

# Optimizer names ("policy" and "qf" as SAC's, "vf" for the state-value network).
POLICY_OPTIMIZER = "policy"
QF_OPTIMIZER = "qf"
VF_OPTIMIZER = "vf"

# Result keys.
QF_LOSS_KEY = "qf_loss"
VF_LOSS_KEY = "vf_loss"
POLICY_LOSS_KEY = "policy_loss"
QF_MEAN_KEY = "qf_mean"
VF_MEAN_KEY = "vf_mean"
ADVANTAGE_WEIGHT_MEAN_KEY = "advantage_weight_mean"


def expectile_loss(diff: Tensor, expectile: float) -> Tensor:
    """``mean(|expectile - 1(diff < 0)| * diff^2)``: asymmetric least squares (IQL's value loss).

    With ``expectile > 0.5`` positive differences (targets above the prediction) weigh more,
    so the minimizer is an upper expectile of the targets; ``0.5`` is half the mean squared error.

    Args:
        diff: ``target - prediction`` per row, ``[B]``.
        expectile: The expectile in ``(0, 1)``.
    """
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return (weight * diff.pow(2)).mean()


class IQLModule(BoxTwinCriticModule):
    """IQL's networks: a Gaussian actor, twin Q critics with target copies, a state-value network.

    ``model_config`` keys:

        - ``fcnet_hiddens``: hidden layer sizes of every network (default ``[256, 256]``).
        - ``fcnet_activation``: their activation (default ``"relu"``).
        - ``conv_filters``, ``conv_activation``, ``image_layout``: the CNN of image observations
          (:mod:`lightning_rl.core.encoders`).

    Observations go through an observation encoder first: ``pi_obs_encoder`` for the actor,
    ``qf_obs_encoder`` for both critics (its target copy ``target_qf_obs_encoder``) and
    ``vf_obs_encoder`` for the value network; those of flat observations have no weights.
    The actor ``pi`` maps observations to pre-``tanh`` means; its Gaussian has mean
    ``tanh(pi(s))`` in ``[-1, 1]`` and, per action dim, the state-independent log standard
    deviation ``-5 + 7 * sigmoid(log_std_logit)`` (d3rlpy's ``NormalPolicy`` with a std
    parameter; it starts at -1.5). The critics ``qf``, ``qf_twin`` map
    ``concat(obs, action in [-1, 1])`` to a Q-value (:class:`BoxTwinCriticModule`), ``vf`` maps
    observations to a value. An ``inference_only`` module has the actor alone.

    Actions leave and enter the module in env space: ``forward_inference`` returns the mean
    action, ``forward_exploration`` a Gaussian sample clipped to ``[-1, 1]``, both rescaled to
    the Box, and ``forward_train`` reads a batch's env-space ``actions``.

    Raises:
        ValueError: For an action space other than a ``Box`` with finite bounds.
    """

    model_config_keys = {
        "fcnet_hiddens": ModelConfigKey.layer_sizes(IQL_FCNET_HIDDENS),
        "fcnet_activation": ModelConfigKey.activation(IQL_FCNET_ACTIVATION),
        **OBSERVATION_ENCODER_KEYS,
    }

    @classmethod
    def check_action_space(cls, action_space: gym.Space) -> None:
        """Raise ``ValueError`` unless ``action_space`` is a ``Box`` (of any shape) with finite bounds."""
        check_bounded_box_actions(cls.__name__, action_space, otherwise="BC or MARWIL")

    def setup(self) -> None:
        config = self.resolved_model_config()
        hiddens, activation = list(config["fcnet_hiddens"]), config["fcnet_activation"]
        self.setup_action_bounds()
        self.pi_obs_encoder = build_observation_encoder(self.observation_space, config)
        self.pi = build_mlp(self.pi_obs_encoder.out_dim, hiddens, activation, self.action_dim)
        self.log_std_logit = nn.Parameter(torch.zeros(self.action_dim))
        if not self.inference_only:
            self.setup_twin_critics(config, hiddens, activation)
            self.vf_obs_encoder = build_observation_encoder(self.observation_space, config)
            self.vf = build_mlp(self.vf_obs_encoder.out_dim, hiddens, activation, 1)
            self.make_target_networks()

    # ---- Actions -------------------------------------------------------------------------

    def action_dist_params(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """The Gaussian's means ``tanh(pi(s))`` and its log standard deviations, each ``[B, d]``.

        Args:
            features: The actor's features of the observations, ``pi_obs_encoder(obs)`` (flat
                observations: the flattened observations), ``[B, pi_obs_encoder.out_dim]``.
        """
        mean = torch.tanh(self.pi(features))
        log_std = LOG_STD_MIN + torch.sigmoid(self.log_std_logit) * (LOG_STD_MAX - LOG_STD_MIN)
        return mean, log_std.expand_as(mean)

    # ---- Forward passes ------------------------------------------------------------------

    def forward_inference(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Greedy env-space ``actions``: the Gaussian's mean, rescaled to the Box."""
        mean, _ = self.action_dist_params(self.pi_obs_encoder(batch[Columns.OBS]))
        return {Columns.ACTIONS: self.unnormalize_actions(mean)}

    def forward_exploration(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Sampled env-space ``actions``: ``mean + std * noise`` clipped to ``[-1, 1]``, rescaled to the Box."""
        mean, log_std = self.action_dist_params(self.pi_obs_encoder(batch[Columns.OBS]))
        sample = (mean + log_std.exp() * torch.randn_like(mean)).clamp(-1.0, 1.0)
        return {Columns.ACTIONS: self.unnormalize_actions(sample)}

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        """What the three losses need from a batch of transitions.

        Args:
            batch: ``obs``, env-space ``actions`` and, for the critics' targets, ``new_obs``.

        Returns:
            ``action_dist_inputs`` (means, log stds; differentiable in the actor);
            ``qf_preds``, ``qf_twin_preds``: ``Q_i(s, a)`` (in the critics); ``vf_preds``:
            ``V(s)`` (in the value network); ``qf_target_min``: ``min_i Q'_i(s, a)`` without
            gradients; with ``new_obs``, ``vf_next``: ``V(s')`` without gradients.
        """
        if self.inference_only:
            raise ValueError("this IQLModule was built with inference_only=True and has no critics to train")
        obs = batch[Columns.OBS]
        q_in = self.critic_input(batch)
        mean, log_std = self.action_dist_params(self.pi_obs_encoder(obs))
        out = {
            Columns.ACTION_DIST_INPUTS: torch.cat([mean, log_std], dim=-1),
            QF_PREDS: self.qf(q_in).squeeze(-1),
            QF_TWIN_PREDS: self.qf_twin(q_in).squeeze(-1),
            Columns.VF_PREDS: self.vf(self.vf_obs_encoder(obs)).squeeze(-1),
        }
        with torch.no_grad():
            target_in = self.critic_input(batch, target=True)
            out[QF_TARGET_MIN] = torch.min(self.target_qf(target_in), self.target_qf_twin(target_in)).squeeze(-1)
            if Columns.NEXT_OBS in batch:
                out[VF_NEXT] = self.vf(self.vf_obs_encoder(batch[Columns.NEXT_OBS])).squeeze(-1)
        return out

class IQLLearner(OffPolicyLearner):
    """IQL's three losses and three optimizers, on the off-policy update loop.

    Each module gets three Adam optimizers: ``"policy"`` (the actor's MLP and log-std
    parameter), ``"qf"`` (both critics) and ``"vf"`` (the value network), each with its own
    learning rate. ``TargetNetworkUpdate`` (added by ``OffPolicyLearner``) Polyak-averages the
    target critics by ``tau`` every ``target_network_update_freq`` gradient steps. Offline,
    the data module yields one batch per gradient step; given a replay buffer
    (``OffPolicyDataModule``) it samples its minibatches like SAC.

    Args:
        module_spec: What to build; ``None`` builds an :class:`IQLModule` from ``model_config``
            with the spaces of the Trainer's data module.
        model_config: The ``IQLModule``'s settings when ``module_spec`` is ``None``
            (``fcnet_hiddens``, ``fcnet_activation``).
        expectile: The value network's expectile in ``(0, 1)`` (d3rlpy's ``expectile``).
        beta: Inverse temperature of the actor's advantage weights, >= 0 (d3rlpy's ``weight_temp``).
        max_weight: The advantage weights' upper clip, > 0.
        actor_lr: The actor's learning rate: a number or a schedule ``[[timestep, lr], ...]``;
            ``None`` uses the Learner's ``lr``.
        critic_lr: The critics' learning rate, likewise.
        value_lr: The value network's learning rate, likewise; ``None`` uses ``critic_lr``
            (d3rlpy trains it with the critics' optimizer), or ``lr`` if that is ``None`` too.
        tau: The target critics' Polyak step size (the ``OffPolicyLearner``'s, which copies by default).
        **kwargs: The other ``OffPolicyLearner`` and ``Learner`` arguments (``gamma``, ``n_step``,
            ``minibatch_size``, ``lr``, ``grad_clip``, ...); an offline data module sets its own
            batch size, and its dataset transitions are one step.

    Raises:
        ValueError: For a hyperparameter out of its range, naming it.
    """

    masked_observations_refused: ClassVar[str | None] = (
        "its actor picks continuous (Box) actions, which a mask of legal Discrete actions cannot restrict"
    )

    hyperparameter_checks: ClassVar[Mapping[str, ArgumentCheck]] = {
        **dict.fromkeys(("actor_lr", "critic_lr", "value_lr"), partial(check_schedule, optional=True)),
        "expectile": partial(check_number, low=0, high=1, low_open=True, high_open=True),
        "beta": partial(check_number, low=0, finite=True),
        "max_weight": partial(check_number, low=0, low_open=True, finite=True),
    }

    def __init__(
        self,
        module_spec: RLModuleSpec | MultiRLModuleSpec | None = None,
        *,
        model_config: dict[str, Any] | None = None,
        expectile: float = 0.7,
        beta: float = 3.0,
        max_weight: float = 100.0,
        actor_lr: ScheduleSetting | None = None,
        critic_lr: ScheduleSetting | None = None,
        value_lr: ScheduleSetting | None = None,
        tau: float = 0.005,
        **kwargs: Any,
    ) -> None:
        spec = algorithm_module_spec(module_spec, model_config, IQLModule, kwargs.get("module"))
        super().__init__(spec, tau=tau, **kwargs)

    def configure_optimizers_for_module(self, module_id: str, config: LearnerConfig) -> None:
        """Register the "policy", "qf" and "vf" Adams of one module.

        Raises:
            ValueError: If the module is not a training ``IQLModule``, or has trainable
                parameters outside the actor, the critics and the value network.
        """
        module = self.module[module_id]
        if not isinstance(module, IQLModule) or module.inference_only:
            raise ValueError(
                f"module {module_id!r}: IQLLearner trains IQLModules built for training (inference_only=False), "
                f"got {type(module).__name__}" + (" with inference_only=True" if isinstance(module, IQLModule) else "")
            )
        critic_lr = config.lr if config.critic_lr is None else config.critic_lr
        groups = {
            POLICY_OPTIMIZER: (
                self.get_parameters(module.pi_obs_encoder) + self.get_parameters(module.pi) + [module.log_std_logit],
                config.lr if config.actor_lr is None else config.actor_lr,
            ),
            QF_OPTIMIZER: (
                self.get_parameters(module.qf_obs_encoder)
                + self.get_parameters(module.qf)
                + self.get_parameters(module.qf_twin),
                critic_lr,
            ),
            VF_OPTIMIZER: (
                self.get_parameters(module.vf_obs_encoder) + self.get_parameters(module.vf),
                critic_lr if config.value_lr is None else config.value_lr,
            ),
        }
        covered = {id(param) for params, _ in groups.values() for param in params}
        uncovered = [
            name for name, param in module.named_parameters() if param.requires_grad and id(param) not in covered
        ]
        if uncovered:
            raise ValueError(
                f"module {module_id!r}: IQLLearner trains the actor (pi_obs_encoder, pi, log_std_logit), the critics "
                f"(qf_obs_encoder, qf, qf_twin) and the value network (vf_obs_encoder, vf); parameters {uncovered} "
                "belong to none of them"
            )
        for name, (params, lr) in groups.items():
            self.register_optimizer(
                module_id=module_id,
                optimizer_name=name,
                optimizer=default_adam(params),
                params=params,
                lr_or_lr_schedule=lr,
            )

    def compute_loss_for_module(
        self, *, module_id: str, config: LearnerConfig, batch: dict[str, Tensor], fwd_out: dict[str, Any]
    ) -> Tensor:
        module = self.module[module_id]
        q_target = fwd_out[QF_TARGET_MIN]  # min_i Q'_i(s, a), a constant
        values = fwd_out[Columns.VF_PREDS]

        # Value: an upper expectile of the target critics' values of the data's actions.
        vf_loss = expectile_loss(q_target - values, config.expectile)

        # Critics: one-step targets through V(s'), never through an action outside the data.
        with torch.no_grad():
            y = batch[Columns.REWARDS].float() + bootstrap_discounts(batch, config.gamma) * fwd_out[VF_NEXT]
        td_error = fwd_out[QF_PREDS] - y
        td_error_twin = fwd_out[QF_TWIN_PREDS] - y
        weights = row_weights(batch)
        qf_loss = (weights * td_error.pow(2)).mean() + (weights * td_error_twin.pow(2)).mean()

        # Actor: behaviour cloning weighted by exp(beta * advantage), clipped; the weights are constants.
        with torch.no_grad():
            advantage_weights = torch.exp(config.beta * (q_target - values)).clamp(max=config.max_weight)
        action_dist = DiagGaussian.from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        logp = action_dist.logp(module.normalize_actions(batch[Columns.ACTIONS]))
        policy_loss = -(advantage_weights * logp).mean()

        self.record_td_errors(module_id, 0.5 * (td_error.abs() + td_error_twin.abs()))
        log = self.metrics.log_value
        log((module_id, QF_LOSS_KEY), qf_loss, window=math.inf, clear_on_reduce=True)
        log((module_id, VF_LOSS_KEY), vf_loss, window=math.inf, clear_on_reduce=True)
        log((module_id, POLICY_LOSS_KEY), policy_loss, window=math.inf, clear_on_reduce=True)
        with torch.no_grad():
            q_mean = 0.5 * (fwd_out[QF_PREDS].mean() + fwd_out[QF_TWIN_PREDS].mean())
            log((module_id, QF_MEAN_KEY), q_mean, window=math.inf, clear_on_reduce=True)
            log((module_id, VF_MEAN_KEY), values.mean(), window=math.inf, clear_on_reduce=True)
            log((module_id, ADVANTAGE_WEIGHT_MEAN_KEY), advantage_weights.mean(), window=math.inf, clear_on_reduce=True)
        return qf_loss + vf_loss + policy_loss
