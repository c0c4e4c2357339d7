"""Deep Q-Networks (Mnih et al., 2015) with double Q (van Hasselt et al., 2016) and dueling heads.

The Q network regresses ``Q(s, a)`` of replayed transitions onto the bootstrapped target

    y = r_n + gamma**n * (1 - terminated) * Q_target(s', a*)
    a* = argmax_a Q(s', a)          (double Q: the online network chooses, the target values)
    a* = argmax_a Q_target(s', a)   (vanilla DQN)

where ``r_n`` is the n-step discounted reward sum the replay buffer computes and ``s'`` the
observation after it. The loss is ``mean(w * L(Q(s, a) - y))`` with ``L`` the Huber loss
(delta 1) or the squared error, and ``w`` the importance weights of prioritized replay
(ones for uniform replay). ``Q_target`` is a frozen copy of the Q network that the
``TargetNetworkUpdate`` callback syncs every ``target_network_update_freq`` gradient steps.

Acting is epsilon-greedy: the module's ``epsilon`` buffer follows the Learner's schedule
over sampled env steps and is saved with the weights, so a resumed run explores as the
saved one did.

Action masks (PettingZoo's ``{"action_mask", "observation"}`` observations, see
:mod:`lightning_rl.core.action_masks`): with an ``action_mask`` column the greedy action is the
argmax over the legal actions and a random one is uniform over them; the target's ``a*`` is
chosen among the legal actions of ``s'`` (the ``next_action_mask`` column the replay rows carry),
so the Q values of illegal actions, which are never trained, never reach a target.

Names follow RLlib's DQN config (``double_q``, ``dueling``, ``td_error_loss_fn``, ``epsilon``,
``target_network_update_freq``, ``n_step``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any, ClassVar, Literal

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_rl.algorithms.off_policy import OffPolicyLearner, bootstrap_discounts, row_weights
from lightning_rl.core.action_masks import NEXT_ACTION_MASK, is_action_masked_space, masked_argmax, random_legal_actions
from lightning_rl.core.arguments import ArgumentCheck, check_bool, check_choice
from lightning_rl.core.columns import Columns
from lightning_rl.core.encoders import OBSERVATION_ENCODER_KEYS, ObservationEncoder, build_observation_encoder
from lightning_rl.core.mlp import DEFAULT_FCNET_HIDDENS, build_mlp
from lightning_rl.core.module_checks import ModelConfigKey
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.rl_modules import RLModule
from lightning_rl.core.schedules import ScheduleSetting, check_schedule
from lightning_rl.core.target_network import TargetNetworkAPI, make_target_network
from lightning_rl.core.learner_config import LearnerConfig
from lightning_rl.learner.learner import algorithm_module_spec

# Forward-pass outputs.
Q_VALUES = "q_values"
"""``Q(s, .)`` of ``obs``, ``[B, num_actions]`` (inference and train passes)."""
Q_VALUES_NEXT = "q_values_next"
"""The online network's ``Q(s', .)`` of ``new_obs`` (train pass; double Q's action choice)."""
Q_TARGET_NEXT = "q_target_next"
"""The target network's ``Q_target(s', .)`` of ``new_obs`` (``forward_target``)."""

# Result keys (RLlib's names).
QF_LOSS_KEY = "qf_loss"
QF_MEAN_KEY = "qf_mean"
QF_MAX_KEY = "qf_max"
QF_MIN_KEY = "qf_min"
TD_ERROR_MEAN_KEY = "td_error_mean"
# Not RLlib's: how far the target network has drifted from the online one since its last update.
TARGET_QF_GAP_KEY = "target_qf_gap_mean"
CURR_EPSILON_KEY = "curr_epsilon"

DEFAULT_DQN_ACTIVATION = "relu"
TD_ERROR_LOSS_FNS = ("huber", "mse")


class DQNModule(RLModule, TargetNetworkAPI):
    """A Q network for Discrete actions, its target copy, and epsilon-greedy acting.

    ``model_config`` keys:

        - ``fcnet_hiddens``: hidden layer sizes (default ``[256, 256]``).
        - ``fcnet_activation``: their activation (default ``"relu"``, as DQN implementations use).
        - ``dueling``: split the network into a state-value stream ``V(s)`` and an advantage
          stream ``A(s, a)``, combined as ``Q = V + A - mean_a A`` (Wang et al., 2016;
          default ``False``). All hidden layers but the last are shared; each stream has
          its own copy of the last one.
        - ``conv_filters``, ``conv_activation``, ``image_layout``: the CNN of image observations
          (:mod:`lightning_rl.core.encoders`), the first part of the Q network (and so of its
          target copy); the encoder of flat observations has no weights.

    The ``epsilon`` buffer (a float32 scalar, saved in checkpoints) is the probability that
    ``forward_exploration`` takes a uniformly random action; ``DQNLearner`` sets it from its
    schedule. It starts at 1 (all random). ``inference_only`` modules build no target network.

    Raises:
        ValueError: If the action space is not ``Discrete``.
    """

    model_config_keys = {
        "fcnet_hiddens": ModelConfigKey.layer_sizes(DEFAULT_FCNET_HIDDENS),
        "fcnet_activation": ModelConfigKey.activation(DEFAULT_DQN_ACTIVATION),
        "dueling": ModelConfigKey.flag(False),
        **OBSERVATION_ENCODER_KEYS,
    }

    @classmethod
    def check_action_space(cls, action_space: gym.Space) -> None:
        """Raise ``ValueError`` unless ``action_space`` is ``Discrete``, naming the algorithms that take it."""
        if not isinstance(action_space, gym.spaces.Discrete):
            # MultiDiscrete too: one Q value per joint action would grow as prod(nvec).
            raise ValueError(
                f"{cls.__name__} needs a Discrete action space (one Q value per action), got {action_space}; "
                "for MultiDiscrete or Box actions use PPO (PPOLearner), or SAC (SACLearner) for Box actions"
            )

    def setup(self) -> None:
        config = self.resolved_model_config()  # every key set: the defaults above fill the gaps
        self.num_actions = int(self.action_space.n)
        self.action_start = int(self.action_space.start)
        self.q_net = QNetwork(
            build_observation_encoder(self.observation_space, config),
            self.num_actions,
            hiddens=list(config["fcnet_hiddens"]),
            activation=config["fcnet_activation"],
            dueling=config["dueling"],
        )
        self.register_buffer("epsilon", torch.tensor(1.0, dtype=torch.float32))
        self.target_q_net: nn.Module | None = None
        if not self.inference_only:
            self.make_target_networks()

    def compute_q_values(self, obs: Tensor) -> Tensor:
        """``Q(s, .)`` of a batch of observations from the online network, ``[B, num_actions]``."""
        return self.q_net(obs)

    def forward_inference(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Greedy actions ``argmax_a Q(s, a)`` (over the legal actions with an ``action_mask``) and the Q values.

        Raises:
            ValueError: If the module is built on a masked observation space and the batch
                has no ``action_mask``, or the mask's shape is not ``[B, num_actions]``.
        """
        q_values = self.compute_q_values(batch[Columns.OBS])
        greedy = masked_argmax(q_values, self._action_mask(batch))
        return {Columns.ACTIONS: greedy + self.action_start, Q_VALUES: q_values}

    def forward_exploration(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Epsilon-greedy actions: uniformly random with probability ``epsilon``, else greedy.

        With an ``action_mask`` column both the random and the greedy action are legal ones.
        Uses torch's global generator (seeded by ``seed_everything``). Only the actions are
        returned: the env runner stores every per-row output of the acting pass, and replay
        does not need the Q values.

        Raises:
            ValueError: As :meth:`forward_inference`.
        """
        mask = self._action_mask(batch)
        greedy = masked_argmax(self.compute_q_values(batch[Columns.OBS]), mask)
        if mask is None:
            random_actions = torch.randint_like(greedy, self.num_actions)
        else:
            random_actions = random_legal_actions(mask.to(greedy.device))
        explore = torch.rand(greedy.shape, device=greedy.device) < self.epsilon
        return {Columns.ACTIONS: torch.where(explore, random_actions, greedy) + self.action_start}

    def _action_mask(self, batch: Mapping[str, Any]) -> Tensor | None:
        """The batch's ``action_mask`` (``None`` without one), after the base class's checks.

        The base class checks (and would apply to distribution inputs) the mask: it refuses a
        masked module's batch without one. DQN has no distribution inputs, so it masks its own
        argmax with what this returns.
        """
        self.mask_action_dist_inputs(batch, {})
        return batch.get(Columns.ACTION_MASK)

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``Q(s, .)`` of ``obs`` and, if the batch has ``new_obs``, the online ``Q(s', .)`` too.

        The online ``Q(s', .)`` only picks double Q's bootstrap action (an argmax, which has
        no gradient), so it is computed without autograd: one pass over ``obs`` and
        ``new_obs`` together would backpropagate through twice the rows, half of them with
        zero gradient, and cost more than the second forward pass it saves.
        """
        q_values = self.q_net(batch[Columns.OBS])
        if Columns.NEXT_OBS not in batch:
            return {Q_VALUES: q_values}
        with torch.no_grad():
            q_values_next = self.q_net(batch[Columns.NEXT_OBS])
        return {Q_VALUES: q_values, Q_VALUES_NEXT: q_values_next}

    def make_target_networks(self) -> None:
        """The target Q network: a frozen copy of the online one."""
        self.target_q_net = make_target_network(self.q_net)

    def get_target_network_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        """``[(q_net, target_q_net)]``; empty for an ``inference_only`` module."""
        return [] if self.target_q_net is None else [(self.q_net, self.target_q_net)]

    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``Q_target(s', .)`` of ``batch["new_obs"]`` from the target network.

        Raises:
            ValueError: For an ``inference_only`` module, which has no target network.
        """
        if self.target_q_net is None:
            raise ValueError("this DQNModule was built with inference_only=True and has no target network")
        return {Q_TARGET_NEXT: self.target_q_net(batch[Columns.NEXT_OBS])}


class QNetwork(nn.Module):
    """An observation encoder and an MLP from observations to one Q value per action, optionally dueling.

    Args:
        obs_encoder: The observation encoder (``obs_encoder``; its ``out_dim`` is the MLP's input size).
        num_actions: Number of actions (outputs).
        hiddens: Hidden layer sizes.
        activation: Their activation (see ``build_mlp``).
        dueling: Whether to end in a value and an advantage stream (each with its own copy
            of the last hidden layer) combined as ``V + A - mean(A)``.
    """

    def __init__(
        self, obs_encoder: ObservationEncoder, num_actions: int, *, hiddens: list[int], activation: str, dueling: bool
    ) -> None:
        super().__init__()
        self.dueling = dueling
        self.obs_encoder = obs_encoder
        obs_dim = obs_encoder.out_dim
        if not dueling:
            self.q = build_mlp(obs_dim, hiddens, activation, num_actions)
            return
        shared, stream = hiddens[:-1], hiddens[-1:]
        self.encoder = build_mlp(obs_dim, shared, activation)
        features = shared[-1] if shared else obs_dim
        self.value = build_mlp(features, stream, activation, 1)
        self.advantage = build_mlp(features, stream, activation, num_actions)

    def forward(self, obs: Tensor) -> Tensor:
        """``Q(s, .)`` of a batch of observations (the ``obs`` column), ``[B, num_actions]``."""
        obs = self.obs_encoder(obs)
        if not self.dueling:
            return self.q(obs)
        features = self.encoder(obs)
        advantages = self.advantage(features)
        # Subtracting the mean advantage makes V and A identifiable (Wang et al., eq. 9).
        return self.value(features) + advantages - advantages.mean(-1, keepdim=True)


class DQNLearner(OffPolicyLearner):
    """DQN's TD loss and epsilon schedule, on the off-policy update loop.

    Each train item of an ``OffPolicyDataModule`` brings the replay buffer; the
    Learner takes ``gradient_steps`` steps on ``minibatch_size`` rows sampled from it, and
    the target network is copied from the online one every ``target_network_update_freq``
    gradient steps (``tau=1``; a smaller ``tau`` averages instead).

    Args:
        module_spec: What to build; ``None`` builds a :class:`DQNModule` from ``model_config``
            with the spaces of the Trainer's data module.
        model_config: The ``DQNModule``'s settings when ``module_spec`` is ``None``
            (``fcnet_hiddens``, ``fcnet_activation``, ``dueling``, ``conv_filters``, ``conv_activation``,
            ``image_layout``).
        double_q: Whether the online network chooses the bootstrap action (double DQN)
            instead of the target network.
        td_error_loss_fn: ``"huber"`` (delta 1) or ``"mse"`` (the squared TD error).
        epsilon: Probability of a random action while sampling: a number or a schedule over
            ``num_env_steps_sampled_lifetime``, in [0, 1].
        lr, minibatch_size, target_network_update_freq, grad_clip: The ``OffPolicyLearner``'s,
            here with DQN's defaults: Adam at 1e-3 on 32-row minibatches, a hard target update
            every 500 gradient steps, gradients clipped to global norm 10.
        **kwargs: The other ``OffPolicyLearner`` and ``Learner`` arguments (``gamma``, ``n_step``,
            ``gradient_steps``, ``tau``, ``grad_clip_by``, ``config_overrides_per_module``, ...).

    Results per module, besides the Learner's: ``qf_loss``; ``qf_mean``, ``qf_max`` and ``qf_min``
    of the replayed ``Q(s, a)`` (mean over the update's minibatches, largest, smallest);
    ``td_error_mean`` (mean ``|Q(s, a) - y|``); ``target_qf_gap_mean``, the mean
    ``|Q(s', a) - Q_target(s', a)|`` over the minibatches' next observations and all actions,
    how far the target network lags the online one (0 right after a hard update, growing
    until the next); ``curr_epsilon``.
    """

    hyperparameter_checks: ClassVar[Mapping[str, ArgumentCheck]] = {
        "epsilon": partial(check_schedule, high=1),
        "double_q": check_bool,
        "td_error_loss_fn": partial(check_choice, choices=TD_ERROR_LOSS_FNS),
    }

    def __init__(
        self,
        module_spec: RLModuleSpec | MultiRLModuleSpec | None = None,
        *,
        model_config: dict[str, Any] | None = None,
        lr: ScheduleSetting = 1e-3,
        double_q: bool = True,
        td_error_loss_fn: Literal["huber", "mse"] = "huber",
        epsilon: ScheduleSetting = ((0, 1.0), (10000, 0.05)),
        minibatch_size: int = 32,
        target_network_update_freq: int = 500,
        grad_clip: float | None = 10.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            algorithm_module_spec(module_spec, model_config, DQNModule, kwargs.get("module")),
            lr=lr,
            minibatch_size=minibatch_size,
            target_network_update_freq=target_network_update_freq,
            grad_clip=grad_clip,
            **kwargs,
        )

    @classmethod
    def rl_module_required_apis(cls) -> list[type]:
        """DQN trains modules with target networks (``TargetNetworkAPI``)."""
        return [TargetNetworkAPI]

    def required_batch_columns(self, module_id: str) -> list[str]:
        """The transitions' columns; a module on a masked observation space also needs ``next_action_mask``.

        Its target maximizes over the legal actions of ``new_obs``; without their mask it
        would bootstrap from the never-trained Q values of illegal ones.
        """
        columns = super().required_batch_columns(module_id)
        # The spec, not the built module: the data contract asks before the modules are built.
        spec = self.module_spec.rl_module_specs.get(module_id)
        if spec is not None and is_action_masked_space(spec.observation_space):
            columns.append(NEXT_ACTION_MASK)
        return columns

    def build(self) -> None:
        """Build modules and optimizers, and set every module's epsilon for the current timestep.

        So the first rollout, sampled before any update, already explores as scheduled.
        """
        super().build()
        self._set_epsilons()

    def add_module(self, *, module_id: str, module_spec: RLModuleSpec, **kwargs: Any) -> MultiRLModuleSpec:
        """Add a module (see ``Learner.add_module``) and set its epsilon from the schedule."""
        spec = super().add_module(module_id=module_id, module_spec=module_spec, **kwargs)
        self._set_epsilons()
        return spec

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        """Set every module's exploration epsilon from the schedule at the current env step.

        Runs on every train item, before learning starts too, so the epsilon the next
        rollout uses always matches the timestep (also after resuming from a checkpoint).
        """
        super().before_gradient_based_update(timesteps=timesteps)
        for module_id, epsilon in self._set_epsilons().items():
            self.metrics.log_value((module_id, CURR_EPSILON_KEY), epsilon, window=1, clear_on_reduce=True)

    def _set_epsilons(self) -> dict[str, float]:
        epsilons = {}
        for module_id, module in self.module.items():
            epsilons[module_id] = self.current_scheduled_value(module_id, "epsilon")
            if isinstance(getattr(module, "epsilon", None), Tensor):
                module.epsilon.fill_(epsilons[module_id])
        return epsilons

    def compute_loss_for_module(
        self, *, module_id: str, config: LearnerConfig, batch: dict[str, Tensor], fwd_out: dict[str, Any]
    ) -> Tensor:
        module = self.module[module_id]
        actions = (batch[Columns.ACTIONS].long() - int(module.action_space.start)).unsqueeze(-1)
        q_selected = fwd_out[Q_VALUES].gather(-1, actions).squeeze(-1)

        with torch.no_grad():
            q_target_next = module.forward_target(batch)[Q_TARGET_NEXT]
            # Double Q: the online network picks the action, the target network values it,
            # which removes max's upward bias on noisy estimates. Either picks among the next
            # state's legal actions only; a terminal state without any is zeroed by its discount.
            chooser = fwd_out[Q_VALUES_NEXT] if config.double_q else q_target_next
            next_actions = masked_argmax(chooser, batch.get(NEXT_ACTION_MASK)).unsqueeze(-1)
            q_next = q_target_next.gather(-1, next_actions).squeeze(-1)
            targets = batch[Columns.REWARDS] + bootstrap_discounts(batch, config.gamma) * q_next

        td_errors = q_selected - targets
        if config.td_error_loss_fn == "huber":
            losses = F.huber_loss(q_selected, targets, reduction="none", delta=1.0)
        else:
            losses = td_errors.pow(2)
        qf_loss = (row_weights(batch) * losses).mean()

        self.record_td_errors(module_id, td_errors)
        log = self.metrics.log_value
        log((module_id, QF_LOSS_KEY), qf_loss, window=math.inf, clear_on_reduce=True)
        log((module_id, QF_MEAN_KEY), q_selected.detach().mean(), window=math.inf, clear_on_reduce=True)
        # Reduced on the device (no sync): the update's largest and smallest Q(s, a), where
        # overestimation shows first.
        log((module_id, QF_MAX_KEY), q_selected, reduce="max", window=math.inf, clear_on_reduce=True)
        log((module_id, QF_MIN_KEY), q_selected, reduce="min", window=math.inf, clear_on_reduce=True)
        log((module_id, TD_ERROR_MEAN_KEY), td_errors.detach().abs().mean(), window=math.inf, clear_on_reduce=True)
        if Q_VALUES_NEXT in fwd_out:  # both networks' Q(s', .) are at hand: the lag costs no forward pass
            gap = (fwd_out[Q_VALUES_NEXT] - q_target_next).abs().mean()
            log((module_id, TARGET_QF_GAP_KEY), gap, window=math.inf, clear_on_reduce=True)
        return qf_loss
