import math

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.distributions as D

from lightning_rl.core.distributions import Categorical, DiagGaussian, distribution_class_for_space


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_categorical_logp_equals_log_softmax_gathered_at_the_actions():
    logits = torch.randn(5, 4)
    actions = torch.tensor([0, 3, 1, 2, 3])
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(5), actions]
    torch.testing.assert_close(Categorical.from_logits(logits).logp(actions), expected)


def test_categorical_entropy_matches_closed_form():
    logits = torch.randn(5, 4)
    probs = torch.softmax(logits, dim=-1)
    expected = -(probs * probs.log()).sum(-1)
    torch.testing.assert_close(Categorical.from_logits(logits).entropy(), expected)


def test_categorical_sample_is_int64_per_row_and_deterministic_sample_is_argmax():
    logits = torch.randn(6, 3)
    dist = Categorical.from_logits(logits)
    sample = dist.sample()
    assert sample.shape == (6,) and sample.dtype == torch.int64
    assert torch.equal(dist.deterministic_sample(), logits.argmax(-1))


def test_categorical_kl_matches_closed_form_and_is_zero_to_itself():
    p_logits, q_logits = torch.randn(5, 4), torch.randn(5, 4)
    p, q = Categorical.from_logits(p_logits), Categorical.from_logits(q_logits)
    log_p, log_q = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    expected = (log_p.exp() * (log_p - log_q)).sum(-1)
    torch.testing.assert_close(p.kl(q), expected)
    torch.testing.assert_close(p.kl(p), torch.zeros(5))


def test_categorical_rsample_raises_not_implemented_with_a_hint():
    with pytest.raises(NotImplementedError, match="Categorical has no reparameterized sample"):
        Categorical.from_logits(torch.randn(2, 3)).rsample()


def test_diag_gaussian_logp_equals_closed_form_summed_over_action_dims():
    mean, log_std = torch.randn(4, 3), torch.randn(4, 3) * 0.3
    actions = torch.randn(4, 3)
    dist = DiagGaussian.from_logits(torch.cat([mean, log_std], dim=-1))
    std = log_std.exp()
    expected = (-0.5 * ((actions - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    torch.testing.assert_close(dist.logp(actions), expected)


def test_diag_gaussian_entropy_matches_closed_form():
    mean, log_std = torch.randn(4, 3), torch.randn(4, 3)
    dist = DiagGaussian.from_logits(torch.cat([mean, log_std], dim=-1))
    expected = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)
    torch.testing.assert_close(dist.entropy(), expected)


def test_diag_gaussian_kl_matches_torch_and_is_zero_to_itself():
    p_in, q_in = torch.randn(4, 6), torch.randn(4, 6)
    p, q = DiagGaussian.from_logits(p_in), DiagGaussian.from_logits(q_in)
    p_mean, p_log_std = p_in.chunk(2, -1)
    q_mean, q_log_std = q_in.chunk(2, -1)
    expected = D.kl_divergence(D.Normal(p_mean, p_log_std.exp()), D.Normal(q_mean, q_log_std.exp())).sum(-1)
    torch.testing.assert_close(p.kl(q), expected)
    torch.testing.assert_close(p.kl(p), torch.zeros(4))


def test_diag_gaussian_deterministic_sample_is_the_mean_and_rsample_carries_gradients():
    inputs = torch.randn(4, 4, requires_grad=True)
    dist = DiagGaussian.from_logits(inputs)
    assert torch.equal(dist.deterministic_sample(), inputs[:, :2])
    sample = dist.rsample()
    assert sample.shape == (4, 2)
    sample.sum().backward()
    assert inputs.grad is not None and inputs.grad.abs().sum() > 0


def test_kl_between_different_distribution_classes_raises_type_error():
    with pytest.raises(TypeError, match="Categorical to DiagGaussian"):
        Categorical.from_logits(torch.randn(2, 4)).kl(DiagGaussian.from_logits(torch.randn(2, 4)))


def test_required_input_dim_is_n_for_discrete_and_twice_the_size_for_box():
    assert Categorical.required_input_dim(gym.spaces.Discrete(7)) == 7
    assert DiagGaussian.required_input_dim(gym.spaces.Box(-1, 1, (3,))) == 6
    assert DiagGaussian.required_input_dim(gym.spaces.Box(-1, 1, (2, 2))) == 8
    with pytest.raises(ValueError, match="needs a Box"):
        DiagGaussian.required_input_dim(gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match="Discrete"):
        Categorical.required_input_dim(gym.spaces.Box(-1, 1, (3,)))


def test_distribution_class_for_space_picks_by_space_and_names_unsupported_ones():
    assert distribution_class_for_space(gym.spaces.Discrete(3)) is Categorical
    assert distribution_class_for_space(gym.spaces.Box(-np.inf, np.inf, (2,))) is DiagGaussian
    with pytest.raises(ValueError, match="MultiBinary"):
        distribution_class_for_space(gym.spaces.MultiBinary(3))
    with pytest.raises(ValueError, match="start=1"):
        distribution_class_for_space(gym.spaces.Discrete(3, start=1))
