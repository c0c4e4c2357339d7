"""Action masks: PettingZoo's Dict observations, masked sampling, greedy acting and loss gradients."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.core.acting import compute_actions
from lightning_rl.core.action_masks import (
    ACTION_MASK,
    apply_action_mask,
    is_action_masked_space,
    observation_part,
    split_masked_observation,
)
from lightning_rl.core.columns import Columns
from lightning_rl.core.mlp import flat_obs_dim, flatten_obs
from lightning_rl.core.rl_module_specs import RLModuleSpec

NUM_ACTIONS = 4
OBS_PART = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)
MASKED_SPACE = gym.spaces.Dict({"action_mask": gym.spaces.Box(0, 1, (NUM_ACTIONS,), np.int8), "observation": OBS_PART})
ACTIONS = gym.spaces.Discrete(NUM_ACTIONS)
SMALL = {"fcnet_hiddens": [8]}


def _module(cls: type[PPOModule] = PPOModule) -> PPOModule:
    torch.manual_seed(0)
    return cls(MASKED_SPACE, ACTIONS, SMALL)


def _random_masks(rows: int, seed: int) -> torch.Tensor:
    """0/1 int8 masks, as PettingZoo gives them, with at least one legal action among the first three per row."""
    generator = torch.Generator().manual_seed(seed)
    masks = torch.randint(0, 2, (rows, NUM_ACTIONS), generator=generator, dtype=torch.int8)
    masks[torch.arange(rows), torch.randint(0, NUM_ACTIONS - 1, (rows,), generator=generator)] = 1
    return masks


def test_a_dict_of_exactly_action_mask_and_observation_is_a_masked_space_whose_observation_part_is_the_inner_one():
    assert is_action_masked_space(MASKED_SPACE)
    assert observation_part(MASKED_SPACE) == OBS_PART
    extra_key = gym.spaces.Dict({**MASKED_SPACE.spaces, "other": gym.spaces.Discrete(2)})
    assert not is_action_masked_space(extra_key)
    assert observation_part(extra_key) is extra_key
    assert not is_action_masked_space(OBS_PART) and observation_part(OBS_PART) is OBS_PART
    assert not is_action_masked_space(None)


def test_split_masked_observation_returns_the_observation_and_the_mask_and_refuses_other_values():
    obs, mask = split_masked_observation({"observation": np.ones((2, 3)), "action_mask": np.array([1, 0, 1, 0])})
    assert obs.shape == (2, 3) and mask.tolist() == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="keys \\['action_mask', 'observation'\\], got \\['observation'\\]"):
        split_masked_observation({"observation": np.ones(3)})
    with pytest.raises(ValueError, match="got ndarray"):
        split_masked_observation(np.ones(3))


def test_apply_action_mask_keeps_legal_logits_and_sets_illegal_ones_to_the_lowest_float():
    logits = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    masked = apply_action_mask(logits, torch.tensor([[1, 0, 1], [0, 0, 1]], dtype=torch.int8))
    lowest = torch.finfo(torch.float32).min
    assert masked.tolist() == [[1.0, lowest, 3.0], [lowest, lowest, 6.0]]
    assert torch.softmax(masked, -1)[0, 1] == 0 and torch.softmax(masked, -1)[1, :2].eq(0).all()
    with pytest.raises(ValueError, match="'action_mask' has shape \\(2, 2\\).*inputs it masks have shape \\(2, 3\\)"):
        apply_action_mask(logits, torch.ones(2, 2))


def test_flatten_obs_and_flat_obs_dim_of_a_masked_space_use_its_observation_part():
    assert flat_obs_dim(MASKED_SPACE) == 6
    assert flatten_obs(torch.ones(5, 2, 3), MASKED_SPACE).shape == (5, 6)
    assert _module().pi[0].in_features == 6


def test_sampled_and_greedy_actions_are_always_legal_even_where_the_net_prefers_an_illegal_one():
    module = _module()
    with torch.no_grad():
        module.pi[-1].bias.copy_(torch.tensor([0.0, 0.0, 0.0, 20.0]))  # action 3 is the net's clear favourite
    rows = 10_000
    masks = _random_masks(rows, seed=1)
    masks[: rows // 2, 3] = 0  # illegal in the first half of the rows, legal in the second
    masks[rows // 2 :, 3] = 1
    obs = torch.rand(rows, 2, 3) * 2 - 1
    with torch.no_grad():
        out, sampled = compute_actions(module, obs, explore=True, action_mask=masks)
        _, greedy = compute_actions(module, obs, explore=False, action_mask=masks)
    rows_index = torch.arange(rows)
    assert masks[rows_index, sampled].eq(1).all()
    assert masks[rows_index, greedy].eq(1).all()
    assert greedy[rows // 2 :].eq(3).all() and greedy[: rows // 2].ne(3).all()
    probs = torch.softmax(out[Columns.ACTION_DIST_INPUTS], dim=-1)
    assert probs[masks == 0].eq(0).all()
    assert torch.isfinite(out[Columns.ACTION_LOGP]).all()


class _PPOModuleKeepingLogits(PPOModule):
    """Keeps the train pass's action-distribution inputs from before the mask, with their gradient."""

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        out = super()._forward_train(batch)
        self.unmasked_logits = out[Columns.ACTION_DIST_INPUTS]
        self.unmasked_logits.retain_grad()
        return out


def test_masked_logits_get_exactly_zero_gradient_through_the_ppo_loss():
    spec = RLModuleSpec(_PPOModuleKeepingLogits, MASKED_SPACE, ACTIONS, SMALL)
    learner = PPOLearner(spec, entropy_coeff=0.01, use_kl_loss=True)
    learner.build()
    rows = 32
    masks = _random_masks(rows, seed=2)
    masks[:, 3] = 0  # never legal: its output unit gets no gradient from any row
    obs = torch.rand(rows, 2, 3)
    with torch.no_grad():
        out, actions = compute_actions(learner.module["default_policy"], obs, explore=True, action_mask=masks)
    batch = {
        Columns.OBS: obs,
        ACTION_MASK: masks,
        Columns.ACTIONS: actions,
        Columns.ACTION_LOGP: out[Columns.ACTION_LOGP] - 0.1,
        Columns.ACTION_DIST_INPUTS: out[Columns.ACTION_DIST_INPUTS],
        Columns.ADVANTAGES: torch.randn(rows, generator=torch.Generator().manual_seed(3)),
        Columns.VALUE_TARGETS: torch.randn(rows, generator=torch.Generator().manual_seed(4)),
    }
    learner.before_gradient_based_update(timesteps={})
    module = learner.module["default_policy"]
    fwd_out = module.forward_train(batch)
    config = learner.config_for_module("default_policy")
    loss = learner.compute_loss_for_module(module_id="default_policy", config=config, batch=batch, fwd_out=fwd_out)
    loss.backward()
    grad = module.unmasked_logits.grad
    assert grad[masks == 0].eq(0).all()
    assert grad[masks == 1].ne(0).any()
    assert module.pi[-1].bias.grad[3] == 0 and module.pi[-1].weight.grad[3].eq(0).all()
    assert torch.isfinite(loss)


def test_a_masked_module_refuses_a_batch_without_the_action_mask_column():
    module = _module()
    with pytest.raises(ValueError, match="PPOModule is built on a masked observation space.*'action_mask' column"):
        module.forward_inference({Columns.OBS: torch.zeros(2, 2, 3)})
    with pytest.raises(ValueError, match="'action_mask' column"):
        compute_actions(module, torch.zeros(2, 2, 3), explore=True)
    learner = PPOLearner(RLModuleSpec(PPOModule, MASKED_SPACE, ACTIONS, SMALL))
    learner.build()
    batch = {
        Columns.OBS: np.zeros((3, 2, 3), np.float32),
        Columns.ACTIONS: np.zeros(3, np.int64),
        Columns.ACTION_LOGP: np.zeros(3, np.float32),
        Columns.ADVANTAGES: np.zeros(3, np.float32),
        Columns.VALUE_TARGETS: np.zeros(3, np.float32),
    }
    with pytest.raises(
        ValueError, match="module 'default_policy' is built on a masked observation space.*'action_mask'"
    ):
        learner.update_from_batch(batch)


def test_a_masked_modules_batch_is_checked_against_the_observation_part_and_the_mask_space():
    learner = PPOLearner(RLModuleSpec(PPOModule, MASKED_SPACE, ACTIONS, SMALL))
    learner.build()
    batch = {
        Columns.OBS: np.zeros((3, 2, 3), np.float32),
        ACTION_MASK: np.ones((3, NUM_ACTIONS), np.int8),
        Columns.ACTIONS: np.zeros(3, np.int64),
        Columns.ACTION_LOGP: np.full(3, -np.log(NUM_ACTIONS), np.float32),
        Columns.ADVANTAGES: np.ones(3, np.float32),
        Columns.VALUE_TARGETS: np.ones(3, np.float32),
    }
    results = learner.update_from_batch(batch)
    assert np.isfinite(results["default_policy"]["policy_loss"])
    with pytest.raises(ValueError, match="column 'obs' has shape \\(3, 6\\).*expects \\[batch, 2, 3\\]"):
        learner.update_from_batch({**batch, Columns.OBS: np.zeros((3, 6), np.float32)})
    with pytest.raises(ValueError, match="column 'action_mask' has shape \\(3, 3\\).*expects \\[batch, 4\\]"):
        learner.update_from_batch({**batch, ACTION_MASK: np.ones((3, 3), np.int8)})


def test_a_module_that_picks_actions_itself_and_ignores_the_mask_is_stopped_before_the_env():
    from lightning_rl.core.rl_modules import RLModule

    class AlwaysFirst(RLModule):
        def _forward(self, batch):
            return {"actions": torch.zeros(len(batch["obs"]), dtype=torch.long)}

    module = AlwaysFirst(observation_space=gym.spaces.Box(-1, 1, (2,)), action_space=gym.spaces.Discrete(3))
    obs = torch.zeros(2, 2)
    _, actions = compute_actions(module, obs, explore=True, action_mask=torch.tensor([[1, 1, 0], [1, 0, 1]]))
    assert actions.tolist() == [0, 0]
    with pytest.raises(ValueError, match="AlwaysFirst chose the illegal action 0 in row 1"):
        compute_actions(module, obs, explore=True, action_mask=torch.tensor([[1, 1, 0], [0, 1, 1]]))
