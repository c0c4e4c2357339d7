"""MultiDiscrete and multi-dimensional Box actions: their distributions, and the spaces refused.

``MultiCategorical`` is checked against one ``torch.distributions.Categorical`` per dimension
(log-probabilities, entropies and KL terms sum; the mode is the per-dimension argmax), a
multi-dimensional Box's ``DiagGaussian`` against the flat Gaussian over the same numbers.
Spaces that cannot be sampled from (nonzero ``start``, a 2-D ``nvec``), masks on actions other
than Discrete and DQN on anything but Discrete fail with a message naming the space.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.distributions as D

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms.cql import CQLModule
from lightning_rl.algorithms.dqn import DQNModule
from lightning_rl.algorithms.iql import IQLModule
from lightning_rl.algorithms.ppo import PPOModule
from lightning_rl.algorithms.sac import SACModule
from lightning_rl.core.acting import compute_actions
from lightning_rl.core.distributions import DiagGaussian, MultiCategorical, distribution_class_for_space

NVEC = (3, 5, 2)  # unequal sizes: the shorter dimensions' logits are padded
MULTI_DISCRETE = gym.spaces.MultiDiscrete(NVEC)
BOX_2X3 = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)
OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ROWS = 6


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def per_dimension(logits: torch.Tensor) -> list[D.Categorical]:
    """One torch Categorical per dimension of ``MULTI_DISCRETE``, over its slice of the logits."""
    return [D.Categorical(logits=part) for part in logits.split(NVEC, dim=-1)]


def multi_categorical(logits: torch.Tensor) -> MultiCategorical:
    return distribution_class_for_space(MULTI_DISCRETE).from_logits(logits)


def test_multi_categorical_logp_is_the_sum_of_the_per_dimension_categorical_logps():
    logits = torch.randn(ROWS, sum(NVEC))
    actions = torch.stack([torch.randint(0, n, (ROWS,)) for n in NVEC], dim=-1)
    expected = sum(dist.log_prob(actions[:, i]) for i, dist in enumerate(per_dimension(logits)))
    logp = multi_categorical(logits).logp(actions)
    assert logp.shape == (ROWS,)
    torch.testing.assert_close(logp, expected)


def test_multi_categorical_entropy_and_kl_are_the_sums_of_the_per_dimension_ones():
    p_logits, q_logits = torch.randn(ROWS, sum(NVEC)), torch.randn(ROWS, sum(NVEC))
    p, q = multi_categorical(p_logits), multi_categorical(q_logits)
    torch.testing.assert_close(p.entropy(), sum(dist.entropy() for dist in per_dimension(p_logits)))
    expected_kl = sum(
        D.kl_divergence(p_dim, q_dim) for p_dim, q_dim in zip(per_dimension(p_logits), per_dimension(q_logits))
    )
    torch.testing.assert_close(p.kl(q), expected_kl)
    torch.testing.assert_close(p.kl(p), torch.zeros(ROWS))


def test_multi_categorical_samples_one_int64_index_per_dimension_within_its_size():
    dist = multi_categorical(torch.randn(1000, sum(NVEC)))
    sample = dist.sample()
    assert sample.shape == (1000, len(NVEC)) and sample.dtype == torch.int64
    for i, n in enumerate(NVEC):
        assert set(sample[:, i].tolist()) == set(range(n)), f"dimension {i} sampled {set(sample[:, i].tolist())}"


def test_multi_categorical_deterministic_sample_is_the_per_dimension_argmax():
    logits = torch.randn(ROWS, sum(NVEC))
    expected = torch.stack([part.argmax(-1) for part in logits.split(NVEC, dim=-1)], dim=-1)
    assert torch.equal(multi_categorical(logits).deterministic_sample(), expected)


def test_multi_categorical_logp_gradients_reach_exactly_the_logits():
    logits = torch.randn(ROWS, sum(NVEC), requires_grad=True)
    reference = logits.detach().clone().requires_grad_(True)
    actions = multi_categorical(logits).sample()
    multi_categorical(logits).logp(actions).sum().backward()
    sum(dist.log_prob(actions[:, i]) for i, dist in enumerate(per_dimension(reference))).sum().backward()
    torch.testing.assert_close(logits.grad, reference.grad)


def test_multi_categorical_has_no_reparameterized_sample():
    with pytest.raises(NotImplementedError, match="has no reparameterized sample"):
        multi_categorical(torch.randn(2, sum(NVEC))).rsample()


def test_one_class_per_space_so_distributions_of_one_space_compare():
    first = distribution_class_for_space(gym.spaces.MultiDiscrete(NVEC))
    assert first is distribution_class_for_space(gym.spaces.MultiDiscrete(list(NVEC)))
    assert first.nvec == NVEC and issubclass(first, MultiCategorical)
    assert first.for_space(MULTI_DISCRETE) is first  # binding a bound class again changes nothing
    assert distribution_class_for_space(gym.spaces.MultiDiscrete([2, 2])) is not first
    assert MultiCategorical.required_input_dim(MULTI_DISCRETE) == sum(NVEC)
    # The 1-D Box keeps the class itself (flat actions); other shapes get theirs.
    assert distribution_class_for_space(gym.spaces.Box(-1, 1, (3,))) is DiagGaussian
    assert distribution_class_for_space(BOX_2X3).action_shape == (2, 3)
    with pytest.raises(TypeError, match=r"Categorical to MultiCategorical\(nvec=\(3, 5, 2\)\)"):
        distribution_class_for_space(gym.spaces.Discrete(3)).from_logits(torch.randn(2, 3)).kl(
            multi_categorical(torch.randn(2, sum(NVEC)))
        )


@pytest.mark.parametrize(
    "space, message",
    [
        (gym.spaces.MultiDiscrete([3, 4], start=[1, 0]), r"start=\[1, 0\].*Shift the actions in an action wrapper"),
        (gym.spaces.MultiDiscrete([[2, 3], [4, 5]]), r"nvec of shape \(2, 2\).*Flatten the actions in an action wrapper"),
        (gym.spaces.MultiBinary(3), "supported: Discrete, MultiDiscrete and Box"),
    ],
    ids=["nonzero start", "2-D nvec", "MultiBinary"],
)
def test_action_spaces_without_a_distribution_are_refused_naming_the_space_and_the_fix(space, message):
    with pytest.raises(ValueError, match=message):
        distribution_class_for_space(space)
    with pytest.raises(ValueError, match=message):  # and so is a module built on one
        RLModuleSpec(module_class=PPOModule, observation_space=OBS, action_space=space).build()


def test_multi_categorical_needs_its_space_and_logits_of_its_width():
    with pytest.raises(TypeError, match=r"MultiCategorical.for_space\(space\)"):
        MultiCategorical.from_logits(torch.randn(2, sum(NVEC)))
    with pytest.raises(ValueError, match=r"takes 10 logits per row \(the sum of nvec\), got shape \(2, 9\)"):
        multi_categorical(torch.randn(2, 9))


def test_multi_dim_box_logp_entropy_and_kl_equal_the_flat_gaussians():
    p_inputs, q_inputs = torch.randn(ROWS, 12), torch.randn(ROWS, 12)
    box_class = distribution_class_for_space(BOX_2X3)
    p, q = box_class.from_logits(p_inputs), box_class.from_logits(q_inputs)
    flat_p, flat_q = DiagGaussian.from_logits(p_inputs), DiagGaussian.from_logits(q_inputs)
    actions = torch.randn(ROWS, 2, 3)
    torch.testing.assert_close(p.logp(actions), flat_p.logp(actions.reshape(ROWS, 6)))
    torch.testing.assert_close(p.entropy(), flat_p.entropy())
    torch.testing.assert_close(p.kl(q), flat_p.kl(flat_q))
    # And the flat Gaussian is the closed form, so the box's numbers are the right ones.
    mean, log_std = p_inputs.chunk(2, dim=-1)
    flat_actions = actions.reshape(ROWS, 6)
    closed_form = (-0.5 * ((flat_actions - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    torch.testing.assert_close(p.logp(actions), closed_form)


def test_multi_dim_box_samples_and_modes_have_the_space_shape():
    inputs = torch.randn(ROWS, 12, requires_grad=True)
    dist = distribution_class_for_space(BOX_2X3).from_logits(inputs)
    assert dist.sample().shape == (ROWS, 2, 3)
    assert torch.equal(dist.deterministic_sample(), inputs[:, :6].reshape(ROWS, 2, 3))
    sample = dist.rsample()
    assert sample.shape == (ROWS, 2, 3)
    sample.sum().backward()
    assert inputs.grad is not None and inputs.grad.abs().sum() > 0


def test_a_scalar_box_samples_one_number_per_row():
    dist = distribution_class_for_space(gym.spaces.Box(-1.0, 1.0, (), np.float32)).from_logits(torch.randn(ROWS, 2))
    sample = dist.sample()
    assert sample.shape == (ROWS,) and dist.logp(sample).shape == (ROWS,)


# ---- Action masks: Discrete only ----------------------------------------------------------

MASKED_OBS = gym.spaces.Dict(
    {"action_mask": gym.spaces.Box(0, 1, (sum(NVEC),), np.int8), "observation": OBS}
)


@pytest.mark.parametrize("action_space", [MULTI_DISCRETE, BOX_2X3], ids=["MultiDiscrete", "Box"])
def test_a_module_on_a_masked_observation_space_needs_discrete_actions(action_space):
    with pytest.raises(ValueError, match=r"PPOModule has the action space .*action masks \('action_mask'\) are for Discrete"):
        RLModuleSpec(module_class=PPOModule, observation_space=MASKED_OBS, action_space=action_space).build()


def test_a_mask_given_to_a_multi_discrete_module_fails_instead_of_masking_its_logits():
    module = RLModuleSpec(module_class=PPOModule, observation_space=OBS, action_space=MULTI_DISCRETE).build()
    # A mask as wide as the concatenated logits would pass the Discrete shape check silently.
    mask = torch.ones(2, sum(NVEC), dtype=torch.bool)
    with pytest.raises(ValueError, match=r"action space MultiDiscrete\(\[3 5 2\]\).*are for Discrete action spaces only"):
        compute_actions(module, torch.zeros(2, 4), explore=True, action_mask=mask)
    with pytest.raises(ValueError, match="are for Discrete action spaces only"):
        module.forward_train({Columns.OBS: torch.zeros(2, 4), Columns.ACTION_MASK: mask})


def test_a_mask_given_to_a_module_that_picks_its_own_box_actions_fails_naming_the_space():
    module = RLModuleSpec(module_class=SACModule, observation_space=OBS, action_space=BOX_2X3).build()
    with pytest.raises(ValueError, match=r"SACModule has the action space Box.*are for Discrete action spaces only"):
        compute_actions(module, torch.zeros(2, 4), explore=False, action_mask=torch.ones(2, 6))


# ---- Modules that take one kind of action: refused when the spec is made ---------------------


@pytest.mark.parametrize("action_space", [MULTI_DISCRETE, BOX_2X3], ids=["MultiDiscrete", "Box"])
def test_a_dqn_spec_refuses_actions_other_than_discrete_naming_the_space_and_suggesting_ppo(action_space):
    with pytest.raises(ValueError, match=rf"DQNModule needs a Discrete action space .*got {type(action_space).__name__}.*use PPO"):
        RLModuleSpec(module_class=DQNModule, observation_space=OBS, action_space=action_space)


@pytest.mark.parametrize("module_class", [SACModule, CQLModule, IQLModule])
def test_specs_of_box_only_modules_refuse_multi_discrete_actions_naming_what_takes_them(module_class):
    with pytest.raises(ValueError, match=rf"{module_class.__name__} needs a Box action space .*MultiDiscrete.*use (PPO|BC)"):
        RLModuleSpec(module_class=module_class, observation_space=OBS, action_space=MULTI_DISCRETE)
