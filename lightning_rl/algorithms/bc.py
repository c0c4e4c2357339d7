"""Behaviour cloning: learn a policy by maximizing the likelihood of expert actions."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor

from lightning_rl.core.batch import masked_mean
from lightning_rl.core.columns import Columns
from lightning_rl.core.distributions import distribution_class_for_space
from lightning_rl.core.encoders import OBSERVATION_ENCODER_KEYS, build_observation_encoder
from lightning_rl.core.mlp import DEFAULT_FCNET_ACTIVATION, DEFAULT_FCNET_HIDDENS, build_mlp_from_config
from lightning_rl.core.module_checks import ModelConfigKey
from lightning_rl.core.recurrent import (
    RECURRENT_KEYS,
    RecurrentCore,
    check_has_time_axis,
    encode_steps,
    is_recurrent_config,
)
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.rl_modules import RLModule
from lightning_rl.core.learner_config import LearnerConfig
from lightning_rl.learner.learner import Learner, algorithm_module_spec


class BCModule(RLModule):
    """A policy: observations through an observation encoder ``pi_obs_encoder`` and an MLP ``pi`` to action inputs.

    ``model_config`` takes ``fcnet_hiddens`` and ``fcnet_activation``, and ``conv_filters``,
    ``conv_activation`` and ``image_layout`` for image observations
    (:mod:`lightning_rl.core.encoders`; the encoder of flat observations has no weights).
    Discrete actions get categorical logits; MultiDiscrete actions one categorical per dimension
    (``sum(nvec)`` logits); Box actions of any shape a diagonal Gaussian (a mean and a log-std per
    number of the flattened box).

    With ``use_lstm`` (and the other keys of :data:`~lightning_rl.core.recurrent.RECURRENT_KEYS`)
    a recurrent core ``pi_core`` sits between the encoder and the MLP, with the state names
    ``pi_h`` (and ``pi_c`` for an LSTM): the module is stateful, its passes take ``obs [B, T, ...]``
    and ``state_in`` and return ``state_out`` (:mod:`lightning_rl.core.recurrent`). Without it the
    module is exactly the feed-forward one (same layers, initial weights and ``state_dict`` keys).
    """

    model_config_keys = {
        "fcnet_hiddens": ModelConfigKey.layer_sizes(DEFAULT_FCNET_HIDDENS),
        "fcnet_activation": ModelConfigKey.activation(DEFAULT_FCNET_ACTIVATION),
        **OBSERVATION_ENCODER_KEYS,
        **RECURRENT_KEYS,
    }

    @classmethod
    def check_action_space(cls, action_space: gym.Space) -> None:
        """Raise ``ValueError`` for a space without an action distribution (``distribution_class_for_space``)."""
        distribution_class_for_space(action_space)

    def setup(self) -> None:
        out_dim = distribution_class_for_space(self.action_space).required_input_dim(self.action_space)
        config = self.resolved_model_config()
        self.recurrent = is_recurrent_config(config)
        self.pi_obs_encoder = build_observation_encoder(self.observation_space, config)
        pi_dim = self.pi_obs_encoder.out_dim
        # A plain attribute when feed-forward: no layer, so the state_dict keys stay as they were.
        self.pi_core: RecurrentCore | None = None
        if self.recurrent:
            self.pi_core = RecurrentCore(pi_dim, config, self.action_space, prefix="pi_")
            pi_dim = self.pi_core.out_dim
        self.pi = build_mlp_from_config(pi_dim, config, out_dim)

    def get_initial_state(self) -> dict[str, Tensor]:
        """The recurrent core's zero state (``pi_h``, and ``pi_c`` for an LSTM); empty without ``use_lstm``."""
        return self.pi_core.initial_state() if self.pi_core is not None else {}

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.recurrent:
            return self._recurrent_forward(batch, with_values=False)
        return {Columns.ACTION_DIST_INPUTS: self.pi(self.pi_obs_encoder(batch[Columns.OBS]))}

    def _recurrent_forward(self, batch: dict[str, Any], *, with_values: bool) -> dict[str, Any]:
        """The passes of a recurrent module: encoder per step, core over time, MLP per step.

        Args:
            batch: ``obs [B, T, ...]``, ``state_in`` (and ``prev_actions``/``prev_rewards`` when
                the core reads them).
            with_values: Whether to add value predictions; a policy alone has none, subclasses
                with a value network (``MARWILModule``) add them.

        Returns:
            ``action_dist_inputs [B, T, ...]`` and ``state_out {name: [B, cell_size]}``.
        """
        obs = batch[Columns.OBS]
        check_has_time_axis(obs, self.observation_space, type(self).__name__)
        core_out, state_out = self.pi_core(encode_steps(self.pi_obs_encoder, obs), batch)
        return {Columns.ACTION_DIST_INPUTS: self.pi(core_out), Columns.STATE_OUT: state_out}


class BCLearner(Learner):
    """Minimizes the negative log-likelihood of the batch's actions under the policy.

    Args:
        module_spec: What to build. May be left out when ``model_config`` or ``module`` is
            given, or a checkpoint provides it.
        model_config: Instead of ``module_spec``, the settings of a :class:`BCModule`
            (``fcnet_hiddens``, ``fcnet_activation``, the recurrent keys such as ``use_lstm``
            and ``max_seq_len``) built with the spaces of the Trainer's
            data module. Unlike the other algorithms, leaving out both builds no default
            module: behaviour cloning has no standard network to assume.
        **kwargs: The ``Learner`` arguments (``module``, ``lr``, ``num_epochs``, ...).
    """

    def __init__(
        self,
        module_spec: RLModuleSpec | MultiRLModuleSpec | None = None,
        *,
        model_config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if model_config is not None:
            module_spec = algorithm_module_spec(module_spec, model_config, BCModule, kwargs.get("module"))
        super().__init__(module_spec, **kwargs)

    def required_batch_columns(self, module_id: str) -> list[str]:
        return [Columns.OBS, Columns.ACTIONS]

    def cuda_graph_key(self) -> Hashable:
        """The loss reads no Python number but constant hyperparameters: CUDA graphs last across updates."""
        return ()

    def compute_loss_for_module(
        self, *, module_id: str, config: LearnerConfig, batch: dict[str, torch.Tensor], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        dist_class = self.module[module_id].get_train_action_dist_cls()
        action_dist = dist_class.from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        # Over the real steps only: a recurrent module's sequences are zero-padded (loss_mask).
        return -masked_mean(action_dist.logp(batch[Columns.ACTIONS]), batch.get(Columns.LOSS_MASK))
