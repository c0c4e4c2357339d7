"""MARWIL (Wang et al., 2018): monotonic advantage re-weighted imitation learning, as RLlib has it.

Behaviour cloning whose log-likelihood terms are weighted by how much better than expected
each recorded action turned out. Per batch of dataset rows ``(s, a, R)``, with ``R`` the
discounted return of the rest of the recorded episode (``value_targets``), completed by the
value of its final observation ``s_T`` if the episode did not terminate (it was truncated):

    R            = value_targets + bootstrap_discount * V(s_T)     (gamma^(T - t), or 0; detached)
    A            = R - V(s)
    ma          <- ma + rate * (mean(A^2) - ma)                  (a moving average, per module)
    w            = exp(beta * A / (1e-8 + sqrt(ma)))              (detached)
    policy loss  = -mean(w * log pi(a|s))
    value loss   = 0.5 * mean(A^2)
    loss         = policy loss + vf_coeff * value loss

This is RLlib's target (GAE with ``lambda = 1`` over the episode plus one step), computed per
minibatch with the value network of the moment. A recurrent module values ``s_T`` as RLlib
does once it has added that step to the episode: its value core runs from the initial state
over the episode's last chunk of ``max_seq_len`` steps, which ends in ``s_T``
(``Columns.BOOTSTRAP_STEPS``), as every training sequence starts from it.

With ``beta == 0`` it is behaviour cloning, as in RLlib: no advantages, no value loss (the
value network gets no gradient) and weights of one, so the policy takes exactly
``BCLearner``'s steps. The moving average ``ma`` normalizes the advantages' scale; it lives
in the module as a buffer, so ``get_state`` and checkpoints carry it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from functools import partial
from typing import Any, ClassVar

import torch
from torch import Tensor

from lightning_rl.algorithms.bc import BCModule
from lightning_rl.core.arguments import ArgumentCheck, check_number
from lightning_rl.core.batch import masked_mean
from lightning_rl.core.columns import Columns
from lightning_rl.core.encoders import build_observation_encoder
from lightning_rl.core.mlp import build_mlp_from_config
from lightning_rl.core.recurrent import RecurrentCore, batched_initial_state, check_has_time_axis, encode_steps
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.learner_config import LearnerConfig
from lightning_rl.learner.learner import Learner, algorithm_module_spec

# Result keys (RLlib's).
POLICY_LOSS_KEY = "policy_loss"
VF_LOSS_KEY = "vf_loss"
MOVING_AVG_SQD_ADV_NORM_KEY = "moving_avg_sqd_adv_norm"
VF_EXPLAINED_VAR_KEY = "vf_explained_var"

# The module buffer holding the moving average of the squared advantages.
MOVING_AVG_BUFFER = "moving_avg_sqd_adv_norm"


class MARWILModule(BCModule):
    """BC's policy and a separate state value: its own observation encoder and MLP.

    The policy (``pi_obs_encoder``, ``pi``) is built first and exactly as :class:`BCModule`
    builds it, so under the same seed a ``MARWILModule`` starts with a ``BCModule``'s policy.
    Then come the value network's observation encoder ``vf_obs_encoder`` and MLP ``vf`` (same
    ``fcnet_hiddens`` and ``fcnet_activation``, one output) and the buffer
    ``moving_avg_sqd_adv_norm`` (a 0-d tensor; ``MARWILLearner`` sets its start value). An
    ``inference_only`` module has the policy alone.

    ``model_config`` takes ``BCModule``'s keys; Discrete and MultiDiscrete actions get
    categorical logits, Box actions a diagonal Gaussian, as for ``BCModule``. With ``use_lstm``
    the value network has a recurrent core of its own, ``vf_core`` (state names ``vf_h``, and
    ``vf_c`` for an LSTM, beside the policy's ``pi_`` ones), between its encoder and its MLP. It
    steps in every pass, acting included, so that a state recorded while acting would hold the
    value network's part too (as ``PPOModule``'s separate networks do).
    """

    def setup(self) -> None:
        super().setup()
        self.vf_core: RecurrentCore | None = None
        if not self.inference_only:
            config = self.resolved_model_config()
            self.vf_obs_encoder = build_observation_encoder(self.observation_space, config)
            vf_dim = self.vf_obs_encoder.out_dim
            if self.recurrent:
                self.vf_core = RecurrentCore(vf_dim, config, self.action_space, prefix="vf_")
                vf_dim = self.vf_core.out_dim
            self.vf = build_mlp_from_config(vf_dim, config, 1)
            # Persistent: the moving average is training state that checkpoints must carry.
            self.register_buffer(MOVING_AVG_BUFFER, torch.tensor(100.0))

    def get_initial_state(self) -> dict[str, Tensor]:
        """The policy core's zero state and the value core's (``vf_h``, ``vf_c``); empty without ``use_lstm``."""
        state = super().get_initial_state()
        if self.vf_core is not None:
            state.update(self.vf_core.initial_state())
        return state

    def compute_values(self, batch: dict[str, Any]) -> Tensor:
        """State values ``V(s)`` of ``batch["obs"]``: shape ``[B]``, or ``[B, T]`` for a recurrent module.

        A recurrent module runs its value core alone (the policy's is not needed).

        Args:
            batch: ``{"obs": Tensor[B, ...]}``; a recurrent module's ``{"obs": Tensor[B, T, ...],
                "state_in": {...}}`` (the value core's names at least; and ``prev_actions`` /
                ``prev_rewards`` when it reads them).

        Raises:
            ValueError: For an ``inference_only`` module, which has no value network.
        """
        if self.inference_only:
            raise ValueError("this MARWILModule was built with inference_only=True and has no value network")
        if self.recurrent:
            check_has_time_axis(batch[Columns.OBS], self.observation_space, type(self).__name__)
            return self._recurrent_values(batch)[0]
        return self.vf(self.vf_obs_encoder(batch[Columns.OBS])).squeeze(-1)

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The policy's ``action_dist_inputs`` and the values ``vf_preds`` of ``batch["obs"]`` (and ``state_out`` if recurrent)."""
        if self.inference_only:
            raise ValueError("this MARWILModule was built with inference_only=True and has no value network to train")
        if self.recurrent:
            return self._recurrent_forward(batch, with_values=True)
        obs = batch[Columns.OBS]
        return {
            Columns.ACTION_DIST_INPUTS: self.pi(self.pi_obs_encoder(obs)),
            Columns.VF_PREDS: self.vf(self.vf_obs_encoder(obs)).squeeze(-1),
        }

    def _recurrent_forward(self, batch: dict[str, Any], *, with_values: bool) -> dict[str, Any]:
        """The policy's recurrent pass (``BCModule``'s), then the value core's over the same steps.

        Args:
            batch: As ``BCModule._recurrent_forward`` takes it; ``state_in`` holds both cores' names.
            with_values: Whether to add ``vf_preds [B, T]``.

        Raises:
            ValueError: If ``with_values`` and the module is ``inference_only`` (no value network).
        """
        out = super()._recurrent_forward(batch, with_values=False)
        if self.vf_core is None:
            if with_values:
                raise ValueError("this MARWILModule was built with inference_only=True and has no value network")
            return out
        values, vf_state_out = self._recurrent_values(batch)
        out[Columns.STATE_OUT] = {**out[Columns.STATE_OUT], **vf_state_out}
        if with_values:
            out[Columns.VF_PREDS] = values
        return out

    def _recurrent_values(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        """The value network's pass over time: values ``[B, T]`` and the value core's ``state_out``."""
        vf_out, vf_state_out = self.vf_core(encode_steps(self.vf_obs_encoder, batch[Columns.OBS]), batch)
        return self.vf(vf_out).squeeze(-1), vf_state_out


class MARWILLearner(Learner):
    """MARWIL's advantage-weighted log-likelihood and value regression (RLlib's loss).

    One Adam per module trains the policy and the value network together (as in RLlib).
    Each data-parallel rank updates its module's moving average from its own minibatches, as
    each of RLlib's learners does; a checkpoint keeps rank 0's (with the default rate of
    ``1e-8`` the average stays at its start value in any case).

    Args:
        module_spec: What to build; ``None`` builds a :class:`MARWILModule` from
            ``model_config`` with the spaces of the Trainer's data module.
        model_config: The ``MARWILModule``'s settings when ``module_spec`` is ``None``
            (``fcnet_hiddens``, ``fcnet_activation``, the recurrent keys such as ``use_lstm``
            and ``max_seq_len``).
        beta: The advantages' inverse temperature (>= 0); 0 is behaviour cloning.
        vf_coeff: The value loss's weight in the total loss (>= 0).
        moving_average_sqd_adv_norm_update_rate: The step size ``rate`` in ``[0, 1]`` of the
            moving average of the squared advantages, taken once per minibatch.
        moving_average_sqd_adv_norm_start: The moving average's start value (> 0), set when
            a module is built.
        gamma: The discount of the ``value_targets`` (discounted returns-to-go) that the data
            module computes for this Learner; the loss itself does not use it.
        **kwargs: The ``Learner`` arguments (``lr``, ``grad_clip``, ``module``, ...).

    Raises:
        ValueError: For a hyperparameter out of its range, naming it.
    """

    hyperparameter_checks: ClassVar[Mapping[str, ArgumentCheck]] = {
        "beta": partial(check_number, low=0, finite=True),
        "vf_coeff": partial(check_number, low=0, finite=True),
        "moving_average_sqd_adv_norm_update_rate": partial(check_number, low=0, high=1),
        "moving_average_sqd_adv_norm_start": partial(check_number, low=0, low_open=True, finite=True),
        # Not check_probability: MARWIL's message has always said "a number in [0, 1]".
        "gamma": partial(check_number, low=0, high=1),
    }

    def __init__(
        self,
        module_spec: RLModuleSpec | MultiRLModuleSpec | None = None,
        *,
        model_config: dict[str, Any] | None = None,
        beta: float = 1.0,
        vf_coeff: float = 1.0,
        moving_average_sqd_adv_norm_update_rate: float = 1e-8,
        moving_average_sqd_adv_norm_start: float = 100.0,
        gamma: float = 0.99,
        **kwargs: Any,
    ) -> None:
        super().__init__(algorithm_module_spec(module_spec, model_config, MARWILModule, kwargs.get("module")), **kwargs)

    def required_batch_columns(self, module_id: str) -> list[str]:
        """``obs`` and ``actions``; with ``beta > 0`` also ``value_targets`` (BC needs no returns).

        The batch also holds ``bootstrap_obs`` and ``bootstrap_discount``, which complete the
        targets of episodes that did not terminate (a batch whose targets need no completing
        has ``bootstrap_discount`` 0). A stateful module's sequences carry ``bootstrap_obs`` as
        chunks, with ``bootstrap_steps`` and the chunks' previous actions and rewards beside
        them (``Columns.BOOTSTRAP_STEPS``; ``OfflineDataModule`` adds them).
        """
        if self.config_for_module(module_id).beta == 0:
            return [Columns.OBS, Columns.ACTIONS]
        return [Columns.OBS, Columns.ACTIONS, Columns.VALUE_TARGETS, Columns.BOOTSTRAP_OBS, Columns.BOOTSTRAP_DISCOUNT]

    def configure_optimizers_for_module(self, module_id: str, config: LearnerConfig) -> None:
        """Set the module's moving average to ``moving_average_sqd_adv_norm_start``; register one Adam.

        Runs when a module is built (and when sharding rebuilds the optimizers, which then
        loads the weights and buffers back); a checkpoint's buffers are loaded after.

        Raises:
            ValueError: If the module is not a training ``MARWILModule``.
        """
        module = self.module[module_id]
        if not isinstance(module, MARWILModule) or module.inference_only:
            raise ValueError(
                f"module {module_id!r}: MARWILLearner trains MARWILModules built for training (inference_only=False), "
                f"got {type(module).__name__}"
                + (" with inference_only=True" if isinstance(module, MARWILModule) else "")
            )
        getattr(module, MOVING_AVG_BUFFER).fill_(config.moving_average_sqd_adv_norm_start)
        super().configure_optimizers_for_module(module_id, config)

    def cuda_graph_key(self) -> Hashable:
        """The loss reads no Python number but constant hyperparameters: CUDA graphs last across updates."""
        return ()

    def compute_loss_for_module(
        self, *, module_id: str, config: LearnerConfig, batch: dict[str, Tensor], fwd_out: dict[str, Any]
    ) -> Tensor:
        module = self.module[module_id]
        action_dist = module.get_train_action_dist_cls().from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        logp = action_dist.logp(batch[Columns.ACTIONS])
        log = self.metrics.log_value
        # A recurrent module's batch is zero-padded sequences: every mean is over the real steps.
        mask = batch.get(Columns.LOSS_MASK)
        if config.beta == 0:
            # Behaviour cloning, as RLlib falls back to it: no value loss, weights of one.
            policy_loss = -masked_mean(logp, mask)
            log((module_id, POLICY_LOSS_KEY), policy_loss, window=math.inf, clear_on_reduce=True)
            return policy_loss

        values = fwd_out[Columns.VF_PREDS]
        targets = self._value_targets(module, batch)
        advantages = targets - values
        squared_advantages_mean = masked_mean(advantages.pow(2), mask)
        value_loss = 0.5 * squared_advantages_mean

        # Update the moving average first, so this batch's weights use it (RLlib's order).
        moving_avg = getattr(module, MOVING_AVG_BUFFER)
        rate = config.moving_average_sqd_adv_norm_update_rate
        updated = moving_avg + rate * (squared_advantages_mean.detach() - moving_avg)
        # A batch with a NaN or infinite return is skipped by the optimizer step; it must not
        # poison the average either (a tensor choice: no device sync).
        moving_avg.copy_(torch.where(torch.isfinite(updated), updated, moving_avg))
        weights = torch.exp(config.beta * advantages.detach() / (1e-8 + moving_avg.sqrt()))
        policy_loss = -masked_mean(weights * logp, mask)

        log((module_id, POLICY_LOSS_KEY), policy_loss, window=math.inf, clear_on_reduce=True)
        log((module_id, VF_LOSS_KEY), value_loss, window=math.inf, clear_on_reduce=True)
        # A copy: the next minibatch changes the buffer in place before the values are reduced.
        log((module_id, MOVING_AVG_SQD_ADV_NORM_KEY), moving_avg.clone(), window=1, clear_on_reduce=True)
        with torch.no_grad():
            # Over the real steps, by masked means rather than indexing by the mask (no device sync).
            errors = targets - values
            error_var = masked_mean((errors - masked_mean(errors, mask)).pow(2), mask)
            target_var = masked_mean((targets - masked_mean(targets, mask)).pow(2), mask)
            explained = 1 - error_var / target_var.clamp(min=1e-8)
        log((module_id, VF_EXPLAINED_VAR_KEY), explained, window=math.inf, clear_on_reduce=True)
        return policy_loss + config.vf_coeff * value_loss

    @staticmethod
    def _value_targets(module: MARWILModule, batch: dict[str, Tensor]) -> Tensor:
        """``value_targets + bootstrap_discount * V(s_T)``, detached.

        ``V(s_T)`` is the value of ``bootstrap_obs``; a recurrent module's, the last real
        output of its value core run from the initial state over each sequence's bootstrap
        chunk (``_final_values``).
        """
        targets = batch[Columns.VALUE_TARGETS].float()
        with torch.no_grad():
            if module.is_stateful():
                final_values = _final_values(module, batch).unsqueeze(1)  # one per sequence, for all its steps
            else:
                final_values = module.compute_values({Columns.OBS: batch[Columns.BOOTSTRAP_OBS]})
        return targets + batch[Columns.BOOTSTRAP_DISCOUNT].float() * final_values


# A stateful module's bootstrap chunk: the columns beside bootstrap_obs, and the names the value pass reads them by.
_CHUNK_COLUMNS = {
    Columns.BOOTSTRAP_PREV_ACTIONS: Columns.PREV_ACTIONS,
    Columns.BOOTSTRAP_PREV_REWARDS: Columns.PREV_REWARDS,
}


def _final_values(module: MARWILModule, batch: dict[str, Tensor]) -> Tensor:
    """``V(s_T)`` per sequence ``[S]``: the value core over each bootstrap chunk, from the initial state.

    Raises:
        ValueError: If the batch lacks ``bootstrap_steps`` or the chunks' previous actions and
            rewards (a sequence batch made elsewhere than ``OfflineDataModule``), naming them.
    """
    missing = [column for column in (Columns.BOOTSTRAP_STEPS, *_CHUNK_COLUMNS) if column not in batch]
    if missing:
        raise ValueError(
            f"a stateful MARWIL module's sequences need {Columns.BOOTSTRAP_OBS!r} as chunks [S, T, ...] with "
            f"{Columns.BOOTSTRAP_STEPS!r} [S] and each chunk's previous actions and rewards beside it "
            f"(Columns.BOOTSTRAP_STEPS says which steps; OfflineDataModule adds them); the batch lacks {missing}"
        )
    chunks = batch[Columns.BOOTSTRAP_OBS]
    chunk_batch = {
        Columns.OBS: chunks,
        Columns.STATE_IN: batched_initial_state(module, len(chunks)),
        **{name: batch[column] for column, name in _CHUNK_COLUMNS.items()},
    }
    values = module.compute_values(chunk_batch)
    last = (batch[Columns.BOOTSTRAP_STEPS].long() - 1).unsqueeze(1)
    return values.gather(1, last).squeeze(1)
