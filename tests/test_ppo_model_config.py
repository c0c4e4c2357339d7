"""PPOModule's network keys: ``log_std_init``, ``ortho_init``, separate policy and value sizes and activations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from lightning_rl.algorithms.appo import APPOModule
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.core.columns import Columns
from lightning_rl.core.rl_module_specs import RLModuleSpec
from lightning_rl.core.rl_modules import RLModule

OBS = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
DISCRETE = gym.spaces.Discrete(4)


def ppo_module(action_space: gym.Space = BOX, **model_config: Any) -> PPOModule:
    return PPOModule(OBS, action_space, {"fcnet_hiddens": [8, 6], **model_config})


def log_stds(module: PPOModule, obs: torch.Tensor) -> torch.Tensor:
    """The second half of the Gaussian's inputs: the log std of each action number."""
    return module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS][:, BOX.shape[0] :]


def linear_layers(part: nn.Module) -> list[nn.Linear]:
    return [layer for layer in part.modules() if isinstance(layer, nn.Linear)]


def is_orthogonal(weight: torch.Tensor, gain: float) -> bool:
    """Whether the rows (or, for a tall matrix, the columns) are orthogonal with norm ``gain``."""
    gram = weight @ weight.T if weight.shape[0] <= weight.shape[1] else weight.T @ weight
    return torch.allclose(gram, gain**2 * torch.eye(len(gram)), atol=1e-5)


@pytest.mark.parametrize("free_log_std", [True, False])
def test_the_log_std_starts_at_log_std_init(free_log_std: bool):
    module = ppo_module(log_std_init=-2.0, free_log_std=free_log_std)
    # A zero observation reaches the output layer as zeros (zero biases, tanh(0) = 0): the
    # state-dependent log std is then exactly its bias.
    torch.testing.assert_close(log_stds(module, torch.zeros(2, 5)), torch.full((2, 3), -2.0))
    if free_log_std:
        torch.testing.assert_close(module.log_std.detach(), torch.full((3,), -2.0))


def test_by_default_the_log_std_starts_at_zero_and_the_weights_orthogonal_with_sb3s_gains():
    module = ppo_module()
    torch.testing.assert_close(module.log_std.detach(), torch.zeros(3))
    hidden, *_, pi_out = linear_layers(module.pi)
    assert is_orthogonal(hidden.weight, 2**0.5) and torch.count_nonzero(hidden.bias) == 0
    assert is_orthogonal(pi_out.weight, 0.01)
    assert is_orthogonal(linear_layers(module.vf)[-1].weight, 1.0)


def test_ortho_init_false_keeps_pytorchs_default_initialization():
    torch.manual_seed(0)
    module = ppo_module(ortho_init=False)
    torch.manual_seed(0)
    # nn.Linear's own init, drawn in the same order: the policy MLP's layers come first.
    default = [nn.Linear(5, 8), nn.Linear(8, 6), nn.Linear(6, 3)]
    for ours, pytorch in zip(linear_layers(module.pi), default):
        torch.testing.assert_close(ours.weight, pytorch.weight)
        torch.testing.assert_close(ours.bias, pytorch.bias)
    assert not is_orthogonal(linear_layers(module.pi)[0].weight, 2**0.5)


def test_pi_and_vf_keys_give_each_network_its_own_sizes_and_activation():
    module = ppo_module(
        pi_fcnet_hiddens=[16], pi_fcnet_activation="relu", vf_fcnet_hiddens=[4, 4, 4], fcnet_activation="tanh"
    )
    assert [(layer.in_features, layer.out_features) for layer in linear_layers(module.pi)] == [(5, 16), (16, 3)]
    assert [layer.out_features for layer in linear_layers(module.vf)] == [4, 4, 4, 1]
    assert {type(layer) for layer in module.pi if not isinstance(layer, nn.Linear)} == {nn.ReLU}
    assert {type(layer) for layer in module.vf if not isinstance(layer, nn.Linear)} == {nn.Tanh}  # fcnet_activation's


def test_pi_and_vf_keys_left_out_take_fcnet_hiddens_and_fcnet_activation():
    module = ppo_module(vf_fcnet_activation="relu")
    assert [layer.out_features for layer in linear_layers(module.pi)] == [8, 6, 3]
    assert [layer.out_features for layer in linear_layers(module.vf)] == [8, 6, 1]
    assert {type(layer) for layer in module.pi if not isinstance(layer, nn.Linear)} == {nn.Tanh}
    assert {type(layer) for layer in module.vf if not isinstance(layer, nn.Linear)} == {nn.ReLU}


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("log_std_init", "-2", "a finite number"),
        ("log_std_init", float("nan"), "a finite number"),
        ("log_std_init", True, "a finite number"),
        ("ortho_init", 0, "True or False"),
        ("pi_fcnet_hiddens", [0], r"a list of ints > 0 \(the hidden layer sizes\), or None for fcnet_hiddens"),
        ("vf_fcnet_activation", "gelu", r"one of \['elu', 'linear', 'relu', 'silu', 'swish', 'tanh'\], or None"),
    ],
)
def test_a_bad_value_is_refused_when_the_learner_is_made(key: str, value: Any, expected: str):
    with pytest.raises(ValueError, match=rf"PPOModule: model_config\['{key}'\] must be {expected}"):
        PPOLearner(model_config={key: value})


def test_separate_network_keys_with_shared_layers_are_refused_when_the_learner_is_made():
    expected = r"PPOModule: model_config keys \['vf_fcnet_hiddens'\] shape separate policy and value networks"
    with pytest.raises(ValueError, match=expected):
        PPOLearner(model_config={"vf_share_layers": True, "vf_fcnet_hiddens": [8]})


def test_log_std_init_for_discrete_actions_is_refused_when_the_module_is_built():
    spec = RLModuleSpec(PPOModule, OBS, DISCRETE, {"log_std_init": -1.0})
    with pytest.raises(ValueError, match=r"model_config\['log_std_init'\] is the log std of a Gaussian over Box"):
        spec.build()
    ppo_module(DISCRETE, ortho_init=False)  # the other keys are for every action space


def test_the_keys_survive_a_module_checkpoint_as_given(tmp_path: Path):
    config = {"pi_fcnet_hiddens": [16], "log_std_init": -0.5, "ortho_init": False}
    module = ppo_module(**config)
    restored = RLModule.from_checkpoint(module.save_to_path(tmp_path / "module"))
    assert restored.model_config == {"fcnet_hiddens": [8, 6], **config}
    for name, tensor in module.state_dict().items():
        torch.testing.assert_close(restored.state_dict()[name], tensor)


def test_appos_old_policy_has_the_same_separate_networks_and_log_std():
    module = APPOModule(OBS, BOX, {"pi_fcnet_hiddens": [16], "vf_fcnet_hiddens": [4], "log_std_init": -2.0})
    assert [layer.out_features for layer in linear_layers(module.old_policy.pi)] == [16, 3]
    torch.testing.assert_close(module.old_policy.log_std, module.log_std)
