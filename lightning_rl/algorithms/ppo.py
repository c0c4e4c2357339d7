"""Proximal Policy Optimization (Schulman et al., 2017): the clipped surrogate objective.

The Learner connector computes the value of every observation with the current module and
generalized advantage estimates (GAE); the loss is

    -min(A * r, A * clip(r, 1 - eps, 1 + eps))  +  c_vf * min((V - V_target)^2, vf_clip)
        -  c_ent * entropy  [+  c_kl * KL(pi_old || pi)]

per minibatch, with ``r = pi(a|s) / pi_old(a|s)`` and the advantages normalized per
minibatch. Names follow RLlib's PPO config (``clip_param``, ``vf_clip_param``,
``vf_loss_coeff``, ``entropy_coeff``, ``kl_coeff``, ``kl_target``); RLlib's ``lambda_`` is
``gae_lambda`` here.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from functools import partial
from typing import Any, ClassVar

import gymnasium as gym
import torch
from lightning.pytorch import Callback, Trainer
from torch import Tensor, nn

from lightning_rl.connectors import ConnectorPipeline, GeneralAdvantageEstimation, TrainBatch
from lightning_rl.core.arguments import ArgumentCheck, check_number, check_probability
from lightning_rl.core.batch import masked_mean
from lightning_rl.core.columns import Columns
from lightning_rl.core.distributions import distribution_class_for_space
from lightning_rl.core.metrics import MetricsLogger
from lightning_rl.core.encoders import OBSERVATION_ENCODER_KEYS, build_observation_encoder
from lightning_rl.core.mlp import DEFAULT_FCNET_ACTIVATION, DEFAULT_FCNET_HIDDENS, build_mlp, separate_network_layers
from lightning_rl.core.module_checks import ModelConfigKey
from lightning_rl.core.recurrent import (
    RECURRENT_KEYS,
    RecurrentCore,
    check_has_time_axis,
    encode_steps,
    is_recurrent_config,
)
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.rl_modules import MultiRLModule, RLModule, ValueFunctionAPI
from lightning_rl.core.schedules import ScheduleSetting, check_schedule
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.learner.callback import LearnerCallback
from lightning_rl.core.learner_config import LearnerConfig
from lightning_rl.learner.learner import Learner, algorithm_module_spec
from lightning_rl.learner.optimizers import default_adam
from lightning_rl.learner.state import learner_state_of

# Result keys (RLlib's names where RLlib has them).
POLICY_LOSS_KEY = "policy_loss"
VF_LOSS_KEY = "vf_loss"
VF_LOSS_UNCLIPPED_KEY = "vf_loss_unclipped"
VF_EXPLAINED_VAR_KEY = "vf_explained_var"
ENTROPY_KEY = "entropy"
MEAN_KL_KEY = "mean_kl_loss"
CLIP_FRACTION_KEY = "clip_fraction"
CURR_KL_COEFF_KEY = "curr_kl_coeff"
CURR_ENTROPY_COEFF_KEY = "curr_entropy_coeff"
CURR_CLIP_PARAM_KEY = "curr_clip_param"


class PPOModule(RLModule):
    """An actor-critic: a policy head and a state-value head, on observation encoders and MLPs.

    ``model_config`` keys:

        - ``fcnet_hiddens``, ``fcnet_activation``: the MLPs' hidden layers (defaults as for all modules).
        - ``vf_share_layers``: one observation encoder and hidden stack for both heads (default
          ``False``: an encoder and an MLP each).
        - ``pi_fcnet_hiddens``, ``pi_fcnet_activation``, ``vf_fcnet_hiddens``,
          ``vf_fcnet_activation``: the hidden layers of the separate policy and value MLPs,
          when they differ (default ``None``: ``fcnet_hiddens`` and ``fcnet_activation``);
          an error with ``vf_share_layers: True``. SB3's ``net_arch=dict(pi=..., vf=...)``.
        - ``free_log_std``: for Box actions, learn one state-independent log standard deviation
          per action number (``prod(shape)`` of them) (default ``True``) instead of predicting
          it from the observation.
        - ``log_std_init``: for Box actions, the log standard deviation at the start (default
          0): the free log std's value, or else the bias of the policy outputs that predict it.
          An error for other action spaces. SB3's ``log_std_init``.
        - ``ortho_init``: orthogonal initial weights, with the gains below (default ``True``);
          ``False`` keeps PyTorch's default initialization of every layer. SB3's ``ortho_init``.
        - ``conv_filters``, ``conv_activation``, ``image_layout``: the CNN of image observations
          (:mod:`lightning_rl.core.encoders`).

    Action spaces: ``Discrete`` (a categorical), ``MultiDiscrete`` (one categorical per
    dimension, :class:`~lightning_rl.core.distributions.MultiCategorical`) and ``Box`` of any
    shape (a diagonal Gaussian over the flattened box, whose actions have the box's shape).

    Shared, the networks are ``obs_encoder`` -> ``encoder`` (the MLP) -> ``pi`` and ``vf``;
    separate, ``pi_obs_encoder`` -> ``pi`` and ``vf_obs_encoder`` -> ``vf`` (``pi`` and ``vf``
    whole MLPs). Observation encoders of flat observations have no weights.
    With ``ortho_init`` (the default), weights start orthogonal (gain sqrt(2) for hidden and
    convolution layers, 0.01 for the policy output, 1 for the value output) and biases at 0,
    as in the PPO implementations that tuned these settings (SB3; CleanRL's Atari PPO for the
    convolutions). ``inference_only`` modules with separate networks skip the value encoder
    and MLP.

    Raises:
        ValueError: Besides the base's: for ``pi_``/``vf_`` network keys with
            ``vf_share_layers: True``, and for ``log_std_init`` with an action space other than Box.
    """

    model_config_keys = {
        "fcnet_hiddens": ModelConfigKey.layer_sizes(DEFAULT_FCNET_HIDDENS),
        "fcnet_activation": ModelConfigKey.activation(DEFAULT_FCNET_ACTIVATION),
        "vf_share_layers": ModelConfigKey.flag(False),
        "pi_fcnet_hiddens": ModelConfigKey.layer_sizes(()).or_none("fcnet_hiddens"),
        "pi_fcnet_activation": ModelConfigKey.activation(DEFAULT_FCNET_ACTIVATION).or_none("fcnet_activation"),
        "vf_fcnet_hiddens": ModelConfigKey.layer_sizes(()).or_none("fcnet_hiddens"),
        "vf_fcnet_activation": ModelConfigKey.activation(DEFAULT_FCNET_ACTIVATION).or_none("fcnet_activation"),
        "free_log_std": ModelConfigKey.flag(True),
        "log_std_init": ModelConfigKey.number(0.0),
        "ortho_init": ModelConfigKey.flag(True),
        **OBSERVATION_ENCODER_KEYS,
        **RECURRENT_KEYS,
    }

    @classmethod
    def check_model_config(
        cls, model_config: Mapping[str, Any] | None, observation_space: gym.Space | None = None
    ) -> None:
        """The base's checks, then that the separate networks' keys come without ``vf_share_layers``.

        Raises:
            ValueError: As ``RLModule.check_model_config``; for ``pi_fcnet_*`` or ``vf_fcnet_*``
                keys set beside ``vf_share_layers: True`` (one shared network has no separate sizes).
        """
        super().check_model_config(model_config, observation_space)
        config = model_config or {}
        separate = [key for key in _SEPARATE_NETWORK_KEYS if config.get(key) is not None]
        if config.get("vf_share_layers") and separate:
            raise ValueError(
                f"{cls.__name__}: model_config keys {separate} shape separate policy and value networks, "
                "but vf_share_layers=True shares one: drop them or set vf_share_layers to False"
            )

    @classmethod
    def check_action_space(cls, action_space: gym.Space) -> None:
        """Raise ``ValueError`` for a space without an action distribution (``distribution_class_for_space``)."""
        distribution_class_for_space(action_space)

    def setup(self) -> None:
        if "log_std_init" in self.model_config and not isinstance(self.action_space, gym.spaces.Box):
            raise ValueError(
                f"{type(self).__name__}: model_config['log_std_init'] is the log std of a Gaussian over Box "
                f"actions, but the action space is {self.action_space}; drop the key"
            )
        config = self.resolved_model_config()  # every key set: the defaults above fill the gaps
        hiddens = list(config["fcnet_hiddens"])
        activation = config["fcnet_activation"]
        pi_hiddens, pi_activation = separate_network_layers(config, "pi")
        vf_hiddens, vf_activation = separate_network_layers(config, "vf")
        self.vf_share_layers = config["vf_share_layers"]
        self.recurrent = is_recurrent_config(config)
        dist_inputs = distribution_class_for_space(self.action_space).required_input_dim(self.action_space)
        self.free_log_std = isinstance(self.action_space, gym.spaces.Box) and config["free_log_std"]
        pi_out = dist_inputs // 2 if self.free_log_std else dist_inputs

        self.obs_encoder = self.pi_obs_encoder = self.vf_obs_encoder = None
        self.core = self.pi_core = self.vf_core = None
        if self.vf_share_layers:
            self.obs_encoder = build_observation_encoder(self.observation_space, config)
            obs_dim = self.obs_encoder.out_dim
            if self.recurrent:
                self.core = RecurrentCore(obs_dim, config, self.action_space)
                obs_dim = self.core.out_dim
            last_hidden = hiddens[-1] if hiddens else obs_dim
            self.encoder = build_mlp(obs_dim, hiddens, activation)
            self.pi = nn.Linear(last_hidden, pi_out)
            self.vf = nn.Linear(last_hidden, 1)
        else:
            self.encoder = None
            self.pi_obs_encoder = build_observation_encoder(self.observation_space, config)
            pi_dim = self.pi_obs_encoder.out_dim
            if self.recurrent:
                self.pi_core = RecurrentCore(pi_dim, config, self.action_space, prefix="pi_")
                pi_dim = self.pi_core.out_dim
            self.pi = build_mlp(pi_dim, pi_hiddens, pi_activation, pi_out)
            self.vf = None
            if not self.inference_only:
                self.vf_obs_encoder = build_observation_encoder(self.observation_space, config)
                vf_dim = self.vf_obs_encoder.out_dim
                if self.recurrent:
                    self.vf_core = RecurrentCore(vf_dim, config, self.action_space, prefix="vf_")
                    vf_dim = self.vf_core.out_dim
                self.vf = build_mlp(vf_dim, vf_hiddens, vf_activation, 1)
        if self.free_log_std:
            self.log_std = nn.Parameter(torch.full((pi_out,), float(config["log_std_init"])))
        if config["ortho_init"]:
            self._orthogonal_init()
        if isinstance(self.action_space, gym.spaces.Box) and not self.free_log_std:
            # The second half of the policy's outputs is the log std (DiagGaussian's layout):
            # its bias is where the log std starts (the output weights, 0.01-gain with
            # ortho_init, add little to it at first).
            with torch.no_grad():
                _weight_layers(self.pi)[-1].bias[pi_out // 2 :].fill_(float(config["log_std_init"]))

    def _orthogonal_init(self) -> None:
        # The observation encoders first: on flat observations they have no layers, so the
        # MLPs draw exactly the initial weights they drew before encoders existed.
        for part in (self.obs_encoder, self.pi_obs_encoder, self.vf_obs_encoder, self.encoder, self.pi, self.vf):
            for layer in _weight_layers(part):
                nn.init.orthogonal_(layer.weight, math.sqrt(2))
                nn.init.zeros_(layer.bias)
        # The output layers: a near-uniform policy and a unit-scale value at the start.
        nn.init.orthogonal_(_weight_layers(self.pi)[-1].weight, 0.01)
        if self.vf is not None:
            nn.init.orthogonal_(_weight_layers(self.vf)[-1].weight, 1.0)

    def get_initial_state(self) -> dict[str, Tensor]:
        """The recurrent cores' zero states (``h``, ``c``; ``pi_``/``vf_`` ones for separate networks); empty without ``use_lstm``."""
        state: dict[str, Tensor] = {}
        for core in (self.core, self.pi_core, self.vf_core):
            if core is not None:
                state.update(core.initial_state())
        return state

    def _action_dist_inputs(self, features: Tensor) -> Tensor:
        out = self.pi(features)
        if self.free_log_std:
            out = torch.cat([out, self.log_std.expand_as(out)], dim=-1)
        return out

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.recurrent:
            return self._recurrent_forward(batch, with_values=False)
        obs = batch[Columns.OBS]
        if self.vf_share_layers:
            features = self.encoder(self.obs_encoder(obs))
        else:
            features = self.pi_obs_encoder(obs)
        return {Columns.ACTION_DIST_INPUTS: self._action_dist_inputs(features)}

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.recurrent:
            return self._recurrent_forward(batch, with_values=True)
        obs = batch[Columns.OBS]
        if self.vf_share_layers:
            features = self.encoder(self.obs_encoder(obs))
            return {
                Columns.ACTION_DIST_INPUTS: self._action_dist_inputs(features),
                Columns.VF_PREDS: self.vf(features).squeeze(-1),
            }
        return {
            Columns.ACTION_DIST_INPUTS: self._action_dist_inputs(self.pi_obs_encoder(obs)),
            Columns.VF_PREDS: self.vf(self.vf_obs_encoder(obs)).squeeze(-1),
        }

    def compute_values(self, batch: dict[str, Any]) -> Tensor:
        """State values ``V(s)`` of ``batch["obs"]``: shape ``[B]``, or ``[B, T]`` for a recurrent module.

        Args:
            batch: ``{"obs": Tensor[B, ...]}``; a recurrent module's ``{"obs": Tensor[B, T, ...],
                "state_in": {...}}`` (and ``prev_actions``/``prev_rewards`` when it reads them).
        """
        if self.vf is None:
            raise ValueError("this PPOModule was built with inference_only=True and has no value network")
        if self.recurrent:
            return self._recurrent_forward(batch, with_values=True)[Columns.VF_PREDS]
        obs = batch[Columns.OBS]
        if self.vf_share_layers:
            return self.vf(self.encoder(self.obs_encoder(obs))).squeeze(-1)
        return self.vf(self.vf_obs_encoder(obs)).squeeze(-1)

    def _recurrent_forward(self, batch: dict[str, Any], *, with_values: bool) -> dict[str, Any]:
        """The passes of a recurrent module: encoder per step, core over time, MLPs and heads per step.

        Separate networks step the value core too when acting, so that the state stored for
        every step holds the value network's part (what training and GAE start from).
        """
        obs = batch[Columns.OBS]
        check_has_time_axis(obs, self.observation_space, type(self).__name__)
        if self.vf_share_layers:
            core_out, state_out = self.core(encode_steps(self.obs_encoder, obs), batch)
            features = self.encoder(core_out)
            out = {Columns.ACTION_DIST_INPUTS: self._action_dist_inputs(features), Columns.STATE_OUT: state_out}
            if with_values:
                out[Columns.VF_PREDS] = self.vf(features).squeeze(-1)
            return out
        pi_out, state_out = self.pi_core(encode_steps(self.pi_obs_encoder, obs), batch)
        out = {Columns.ACTION_DIST_INPUTS: self._action_dist_inputs(pi_out)}
        if self.vf_core is not None:
            vf_out, vf_state_out = self.vf_core(encode_steps(self.vf_obs_encoder, obs), batch)
            state_out = {**state_out, **vf_state_out}
            if with_values:
                out[Columns.VF_PREDS] = self.vf(vf_out).squeeze(-1)
        elif with_values:
            raise ValueError("this PPOModule was built with inference_only=True and has no value network")
        out[Columns.STATE_OUT] = state_out
        return out


class AdaptiveKLCoeffMixin:
    """The per-module KL coefficient of Learners with RLlib's adaptive KL loss (PPO, APPO).

    Each module's coefficient starts at its ``kl_coeff`` and is moved by ``KLCoeffAdaptation``
    after updates; it is part of the Learner's state (``get_state()["curr_kl_coeffs"]``). A
    Learner using it lists it before ``Learner`` among its bases and sets
    ``self._curr_kl_coeffs = KLCoefficients(self._initial_kl_coeff)`` in its ``__init__``.
    """

    _curr_kl_coeffs: KLCoefficients

    def _initial_kl_coeff(self, module_id: str) -> float:
        return self.config_for_module(module_id).kl_coeff

    def curr_kl_coeff(self, module_id: str) -> float:
        """The KL coefficient ``module_id`` uses now (``kl_coeff`` until adapted)."""
        return float(self._curr_kl_coeffs[module_id])

    def set_curr_kl_coeff(self, module_id: str, value: float) -> None:
        """Set ``module_id``'s KL coefficient (what ``KLCoeffAdaptation`` calls)."""
        self._curr_kl_coeffs[module_id] = torch.tensor(float(value))

    @property
    def curr_kl_coeffs_per_module(self) -> dict[str, Tensor]:
        """RLlib's name: ``{module_id: 0-dim tensor}``, each module's KL coefficient now.

        A module read for the first time starts at its ``kl_coeff``. Changing a tensor in
        place (``.data *= 1.5``, as RLlib's ``_update_module_kl_coeff`` rewrites do) or
        assigning a new value is what ``set_curr_kl_coeff`` does: the loss reads it from the
        next update on (``before_gradient_based_update`` fixes each update's coefficients).
        """
        return self._curr_kl_coeffs

    def get_state(self, components: Any = None, *, not_components: Any = None) -> dict[str, Any]:
        """The Learner's state plus each module's current KL coefficient."""
        state = super().get_state(components, not_components=not_components)
        state["curr_kl_coeffs"] = {module_id: float(value) for module_id, value in self._curr_kl_coeffs.items()}
        return state

    def set_state(self, state: Any) -> None:
        """Restore ``get_state``'s output, KL coefficients included."""
        super().set_state(state)
        for module_id, value in learner_state_of(state).get("curr_kl_coeffs", {}).items():
            if module_id in self.module:
                self._curr_kl_coeffs[module_id] = torch.tensor(float(value))

    def remove_module(self, module_id: str, **kwargs: Any) -> Any:
        """Remove ``module_id`` and forget its KL coefficient."""
        result = super().remove_module(module_id, **kwargs)
        self._curr_kl_coeffs.pop(module_id, None)
        return result


class PPOLearner(AdaptiveKLCoeffMixin, Learner):
    """PPO's loss, GAE connector and schedules, on the Learner's update loop.

    Args:
        module_spec: What to build; ``None`` builds a :class:`PPOModule` from ``model_config``
            with the spaces of the Trainer's data module.
        model_config: The ``PPOModule``'s settings when ``module_spec`` is ``None``
            (``fcnet_hiddens``, ``fcnet_activation``, ``vf_share_layers``, ``pi_fcnet_hiddens``,
            ``pi_fcnet_activation``, ``vf_fcnet_hiddens``, ``vf_fcnet_activation``, ``free_log_std``,
            ``log_std_init``, ``ortho_init``, ``conv_filters``, ``conv_activation``, ``image_layout``
            and the recurrent keys: see :class:`PPOModule`).
        num_epochs, minibatch_size, shuffle_batch_per_epoch, grad_clip: The ``Learner``'s, here
            with PPO's usual defaults (10 shuffled passes of 64-row minibatches, global norm 0.5).
        gamma: Discount factor.
        gae_lambda: GAE's lambda (RLlib's ``lambda_``).
        clip_param: The surrogate's clip range epsilon: a number or a schedule.
        vf_clip_param: Upper bound on each step's squared value error, or ``None`` not to clip.
        vf_loss_coeff: Weight of the value loss.
        entropy_coeff: Weight of the entropy bonus: a number or a schedule.
        use_kl_loss: Whether to add ``kl_coeff * KL(pi_old || pi)`` to the loss; the coefficient
            then adapts after every update towards ``kl_target`` (``KLCoeffAdaptation``).
        kl_coeff: The KL coefficient to start from.
        kl_target: The KL divergence per update the adaptation aims at.
        normalize_advantages: Whether to standardize advantages per minibatch too (GAE already
            leaves them standardized over each module's batch, as RLlib's GAE piece does).
        use_critic: RLlib's setting; only ``True`` (a value function and GAE) is supported.
        **kwargs: The other ``Learner`` arguments (``lr``, ``grad_clip_by``, ``policies_to_train``,
            ``config_overrides_per_module``, ``torch_compile``, ...).
    """

    hyperparameter_checks: ClassVar[Mapping[str, ArgumentCheck]] = {
        "clip_param": check_schedule,
        "entropy_coeff": check_schedule,
        "gamma": check_probability,
        "gae_lambda": check_probability,
        "vf_loss_coeff": partial(check_number, low=0),
        "kl_coeff": partial(check_number, low=0),
        "kl_target": partial(check_number, low=0),
        "vf_clip_param": partial(check_number, low=0, low_open=True, optional=True),
    }

    def __init__(
        self,
        module_spec: RLModuleSpec | MultiRLModuleSpec | None = None,
        *,
        model_config: dict[str, Any] | None = None,
        num_epochs: int = 10,
        minibatch_size: int | None = 64,
        shuffle_batch_per_epoch: bool = True,
        grad_clip: float | None = 0.5,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        clip_param: ScheduleSetting = 0.2,
        vf_clip_param: float | None = 10.0,
        vf_loss_coeff: float = 0.5,
        entropy_coeff: ScheduleSetting = 0.0,
        use_kl_loss: bool = False,
        kl_coeff: float = 0.2,
        kl_target: float = 0.01,
        normalize_advantages: bool = True,
        use_critic: bool = True,
        **kwargs: Any,
    ) -> None:
        if "lambda_" in kwargs:
            raise ValueError(
                f"PPOLearner takes gae_lambda, RLlib's lambda_: pass gae_lambda={kwargs['lambda_']!r} "
                "(self.config.lambda_ reads it back under RLlib's name)"
            )
        if use_critic is not True:
            raise ValueError(
                "PPOLearner(use_critic=False) is not supported: its advantages always come from GAE over the module's "
                "value function (RLlib's use_critic=True); use_critic stays a hyperparameter so that RLlib loss "
                "rewrites reading self.config.use_critic run"
            )
        super().__init__(
            algorithm_module_spec(module_spec, model_config, PPOModule, kwargs.get("module")),
            num_epochs=num_epochs,
            minibatch_size=minibatch_size,
            shuffle_batch_per_epoch=shuffle_batch_per_epoch,
            grad_clip=grad_clip,
            **kwargs,
        )
        self._curr_kl_coeffs = KLCoefficients(self._initial_kl_coeff)
        self._current: dict[str, dict[str, float]] = {}

    @classmethod
    def rl_module_required_apis(cls) -> list[type]:
        """PPO trains modules with a state-value function (``ValueFunctionAPI``: ``compute_values``)."""
        return [ValueFunctionAPI]

    def configure_optimizers_for_module(self, module_id: str, config: LearnerConfig) -> None:
        """One Adam over the module, with ``eps=1e-5`` as in the PPO implementations whose
        tuned settings users copy (OpenAI Baselines, Stable-Baselines3, CleanRL)."""
        params = self.get_parameters(self.module[module_id])
        self.register_optimizer(
            module_id=module_id, optimizer=default_adam(params, eps=1e-5), params=params, lr_or_lr_schedule=config.lr
        )

    def configure_callbacks(self) -> list[Callback]:
        """Adds the KL coefficient's adaptation when the KL loss is on (a Trainer merges it in)."""
        return [KLCoeffAdaptation()] if self.hparams.use_kl_loss else []

    def required_batch_columns(self, module_id: str) -> list[str]:
        columns = [Columns.OBS, Columns.ACTIONS, Columns.ACTION_LOGP, Columns.ADVANTAGES, Columns.VALUE_TARGETS]
        if self.config_for_module(module_id).use_kl_loss:
            columns.append(Columns.ACTION_DIST_INPUTS)
        return columns

    def build_learner_connector(self) -> ConnectorPipeline:
        """The base pipeline, then GAE (values, advantages, value targets) and the values' explained variance.

        GAE reads ``gamma`` and ``gae_lambda`` from each module's config at every call, so
        per-module overrides and modules added later are honored.
        """
        pipeline = super().build_learner_connector()
        gae = GeneralAdvantageEstimation(gamma=self._gamma_for_module, gae_lambda=self._gae_lambda_for_module)
        pipeline.append(gae)
        pipeline.append(log_vf_explained_var)
        return pipeline

    def _gamma_for_module(self, module_id: str) -> float:
        return self.config_for_module(module_id).gamma

    def _gae_lambda_for_module(self, module_id: str) -> float:
        return self.config_for_module(module_id).gae_lambda

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        """Sets this update's clip range and entropy coefficient from their schedules."""
        super().before_gradient_based_update(timesteps=timesteps)
        for module_id in self.module.keys():
            current = {
                CURR_CLIP_PARAM_KEY: self.current_scheduled_value(module_id, "clip_param"),
                CURR_ENTROPY_COEFF_KEY: self.current_scheduled_value(module_id, "entropy_coeff"),
                CURR_KL_COEFF_KEY: self.curr_kl_coeff(module_id),
            }
            self._current[module_id] = current
            for key, value in current.items():
                self.metrics.log_value((module_id, key), value, window=1, clear_on_reduce=True)

    @property
    def entropy_coeff_schedulers_per_module(self) -> dict[str, ScheduledValue]:
        """RLlib's name: ``{module_id: scheduler}`` whose ``get_current_value()`` is the entropy coefficient now.

        The value at the last timesteps the Learner was given, from ``entropy_coeff`` (a number
        or a piecewise schedule): what the loss uses in this update.
        """
        return {module_id: ScheduledValue(self, module_id, "entropy_coeff") for module_id in self.built_module.keys()}

    def cuda_graph_key(self) -> Hashable:
        """This update's clip range and entropy and KL coefficients per module, the numbers the loss reads."""
        return tuple(sorted((module_id, tuple(sorted(current.items()))) for module_id, current in self._current.items()))

    def compute_loss_for_module(
        self, *, module_id: str, config: LearnerConfig, batch: dict[str, Tensor], fwd_out: dict[str, Any]
    ) -> Tensor:
        """PPO's loss; every mean is over the real steps (``masked_mean``), so a recurrent
        module's zero-padded sequence steps add nothing to the loss or its gradients."""
        current = self._current[module_id]
        clip = current[CURR_CLIP_PARAM_KEY]
        # None for a feed-forward module's rows; [S, T] for a stateful module's sequences.
        mask = batch.get(Columns.LOSS_MASK)
        dist_class = self.module[module_id].get_train_action_dist_cls()
        curr_dist = dist_class.from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        log_ratio = curr_dist.logp(batch[Columns.ACTIONS]) - batch[Columns.ACTION_LOGP]
        if mask is not None:
            # A padded step's ratio is 1: exp of an arbitrary log-probability could overflow, and
            # inf times the zero gradient masked_mean gives it would still be NaN.
            log_ratio = torch.where(mask, log_ratio, torch.zeros_like(log_ratio))
        logp_ratio = torch.exp(log_ratio)

        advantages = batch[Columns.ADVANTAGES]
        if config.normalize_advantages:
            advantages = _normalized(advantages, mask)
        surrogate = torch.min(advantages * logp_ratio, advantages * logp_ratio.clamp(1 - clip, 1 + clip))
        policy_loss = -masked_mean(surrogate, mask)

        vf_preds = fwd_out[Columns.VF_PREDS]
        vf_loss_unclipped = (vf_preds - batch[Columns.VALUE_TARGETS]).pow(2)
        vf_loss = vf_loss_unclipped if config.vf_clip_param is None else vf_loss_unclipped.clamp(max=config.vf_clip_param)
        vf_loss = masked_mean(vf_loss, mask)

        entropy = masked_mean(curr_dist.entropy(), mask)
        total_loss = policy_loss + config.vf_loss_coeff * vf_loss - current[CURR_ENTROPY_COEFF_KEY] * entropy

        if config.use_kl_loss:
            old_dist = dist_class.from_logits(batch[Columns.ACTION_DIST_INPUTS])
            mean_kl = masked_mean(old_dist.kl(curr_dist), mask)
            total_loss = total_loss + current[CURR_KL_COEFF_KEY] * mean_kl
        else:
            with torch.no_grad():  # for logging only: the usual estimator E[(r - 1) - log r]
                mean_kl = masked_mean((logp_ratio - 1) - torch.log(logp_ratio), mask)

        log = self.metrics.log_value
        log((module_id, POLICY_LOSS_KEY), policy_loss, window=math.inf, clear_on_reduce=True)
        log((module_id, VF_LOSS_KEY), vf_loss, window=math.inf, clear_on_reduce=True)
        log((module_id, VF_LOSS_UNCLIPPED_KEY), masked_mean(vf_loss_unclipped, mask), window=math.inf, clear_on_reduce=True)
        log((module_id, ENTROPY_KEY), entropy, window=math.inf, clear_on_reduce=True)
        log((module_id, MEAN_KL_KEY), mean_kl, window=math.inf, clear_on_reduce=True)
        with torch.no_grad():
            clipped = ((logp_ratio - 1).abs() > clip).float()
            log((module_id, CLIP_FRACTION_KEY), masked_mean(clipped, mask), window=math.inf, clear_on_reduce=True)
        return total_loss

    def remove_module(self, module_id: str, **kwargs: Any) -> Any:
        """Remove ``module_id`` and forget its current values (the ``Learner`` forgets its schedules, and
        ``AdaptiveKLCoeffMixin`` its KL coefficient)."""
        result = super().remove_module(module_id, **kwargs)
        self._current.pop(module_id, None)
        return result


class ScheduledValue:
    """One module's scheduled hyperparameter, with RLlib's ``Scheduler.get_current_value()``."""

    def __init__(self, learner: PPOLearner, module_id: str, name: str) -> None:
        self._learner, self._module_id, self._name = learner, module_id, name

    def get_current_value(self) -> float:
        """The value at the last timesteps the Learner was given."""
        return self._learner.current_scheduled_value(self._module_id, self._name)


class KLCoefficients(dict):
    """``{module_id: 0-dim tensor}``; a module read for the first time gets ``initial(module_id)``."""

    def __init__(self, initial: Any) -> None:
        super().__init__()
        self._initial = initial

    def __missing__(self, module_id: str) -> Tensor:
        value = self[module_id] = torch.tensor(float(self._initial(module_id)))
        return value


def log_vf_explained_var(
    *,
    rl_module: MultiRLModule,
    batch: TrainBatch,
    episodes: Sequence[SingleAgentEpisode],
    shared_data: dict[str, Any],
    metrics: MetricsLogger,
) -> TrainBatch:
    """Connector piece: how well the values before this update predicted the targets.

    Logged once per update (as SB3 does) for every module, from the ``vf_preds`` and
    ``value_targets`` that ``GeneralAdvantageEstimation`` added before it. A module whose
    rows lack them (GAE removed, or replaced by a piece appended after this one) is skipped.
    """
    for module_id, module_batch in batch.items():
        if Columns.VF_PREDS not in module_batch or Columns.VALUE_TARGETS not in module_batch:
            continue
        metrics.log_value(
            (module_id, VF_EXPLAINED_VAR_KEY),
            _explained_variance(module_batch[Columns.VF_PREDS], module_batch[Columns.VALUE_TARGETS]),
            window=math.inf,
            clear_on_reduce=True,
        )
    return batch


def _normalized(advantages: Tensor, mask: Tensor | None) -> Tensor:
    """Advantages standardized over the minibatch's real steps (all rows without a mask); as they are for one step.

    Args:
        advantages: ``[B]`` rows, or ``[S, T]`` sequences.
        mask: ``loss_mask [S, T]`` of sequences; ``None`` for rows.
    """
    if mask is None:
        if len(advantages) <= 1:
            return advantages
        return (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    count = mask.sum()
    mean = masked_mean(advantages, mask)
    # The unbiased std over the real steps, as Tensor.std() of rows; no host sync for the count.
    variance = torch.where(mask, (advantages - mean).pow(2), torch.zeros_like(advantages)).sum() / (count - 1).clamp(min=1)
    normalized = (advantages - mean) / (variance.sqrt() + 1e-8)
    return torch.where(count > 1, normalized, advantages)


def _explained_variance(predictions: Tensor, targets: Tensor) -> Tensor:
    """1 - Var(targets - predictions) / Var(targets); 1 is perfect, <= 0 no better than a constant."""
    target_var = targets.var(unbiased=False)
    return 1 - (targets - predictions).var(unbiased=False) / target_var.clamp(min=1e-8)


_SEPARATE_NETWORK_KEYS = ("pi_fcnet_hiddens", "pi_fcnet_activation", "vf_fcnet_hiddens", "vf_fcnet_activation")


def _weight_layers(part: nn.Module | None) -> list[nn.Linear | nn.Conv2d]:
    if part is None:
        return []
    return [layer for layer in part.modules() if isinstance(layer, (nn.Linear, nn.Conv2d))]


class KLCoeffAdaptation(LearnerCallback):
    """After each update, move every module's KL coefficient towards its ``kl_target``.

    The rule of the PPO paper (and RLlib): if the update's mean KL divergence exceeded twice
    the target, the coefficient grows by half; if it stayed under half the target, the
    coefficient halves. ``PPOLearner(use_kl_loss=True)`` adds this callback itself, to a
    Trainer and to standalone updates alike; the coefficients are part of the Learner's state.

    Args:
        increase: Factor applied when the KL divergence is too large.
        decrease: Factor applied when it is too small.
    """

    def __init__(self, increase: float = 1.5, decrease: float = 0.5) -> None:
        if not (increase >= 1 and 0 < decrease <= 1):
            raise ValueError(f"need increase >= 1 and 0 < decrease <= 1, got increase={increase}, decrease={decrease}")
        self.increase = increase
        self.decrease = decrease

    def on_after_gradient_based_update(self, trainer: Trainer, learner: PPOLearner, timesteps: dict[str, Any]) -> None:
        """Adapt the coefficient of every module that trained with the KL loss in this update."""
        for module_id in list(learner.module.keys()):
            config = learner.config_for_module(module_id)
            if not config.use_kl_loss:
                continue
            try:
                # The KL over all ranks, so that every data-parallel rank keeps the same coefficient.
                kl = learner.metrics.peek((module_id, MEAN_KL_KEY), across_ranks=True)
            except KeyError:  # the module did not train in this update
                continue
            coeff = learner.curr_kl_coeff(module_id)
            if kl > 2.0 * config.kl_target:
                coeff *= self.increase
            elif kl < 0.5 * config.kl_target:
                coeff *= self.decrease
            learner.set_curr_kl_coeff(module_id, coeff)
            learner.metrics.log_value((module_id, CURR_KL_COEFF_KEY), coeff, window=1, clear_on_reduce=True)
