"""Every algorithm's Learner trains an RL module built beforehand (``module=...``) and names wrong combinations."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import bc_spec

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms.appo import APPOLearner, APPOModule
from lightning_rl.algorithms.bc import BCLearner, BCModule
from lightning_rl.algorithms.cql import CQLLearner, CQLModule
from lightning_rl.algorithms.dqn import DQNLearner, DQNModule
from lightning_rl.algorithms.impala import IMPALALearner
from lightning_rl.algorithms.iql import IQLLearner, IQLModule
from lightning_rl.algorithms.marwil import MARWILLearner, MARWILModule
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.algorithms.sac import SACLearner, SACModule
from lightning_rl.core.data_contract import DataOffer

DISCRETE = (gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Discrete(2))
CONTINUOUS = (gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
ALGORITHMS = [
    (PPOLearner, PPOModule, DISCRETE),
    (IMPALALearner, PPOModule, DISCRETE),
    (APPOLearner, APPOModule, DISCRETE),
    (DQNLearner, DQNModule, DISCRETE),
    (SACLearner, SACModule, CONTINUOUS),
    (BCLearner, BCModule, DISCRETE),
    (MARWILLearner, MARWILModule, DISCRETE),
    (CQLLearner, CQLModule, CONTINUOUS),
    (IQLLearner, IQLModule, CONTINUOUS),
]
IDS = [learner_class.__name__ for learner_class, _, _ in ALGORITHMS]


def built_module(module_class: type, spaces: tuple[gym.Space, gym.Space]) -> Any:
    spec = RLModuleSpec(
        module_class=module_class,
        observation_space=spaces[0],
        action_space=spaces[1],
        model_config={"fcnet_hiddens": [4]},
    )
    return spec.build()


@pytest.mark.parametrize(("learner_class", "module_class", "spaces"), ALGORITHMS, ids=IDS)
def test_an_algorithm_learner_trains_the_module_it_is_given(learner_class, module_class, spaces):
    module = built_module(module_class, spaces)
    learner = learner_class(module=module)
    learner.build()
    assert learner.module["default_policy"] is module


@pytest.mark.parametrize(("learner_class", "module_class", "spaces"), ALGORITHMS, ids=IDS)
def test_module_with_model_config_is_refused_by_name(learner_class, module_class, spaces):
    with pytest.raises(ValueError, match="pass model_config or module, not both"):
        learner_class(module=built_module(module_class, spaces), model_config={"fcnet_hiddens": [4]})


@pytest.mark.parametrize(("learner_class", "module_class", "spaces"), ALGORITHMS, ids=IDS)
def test_module_with_module_spec_is_refused_by_name(learner_class, module_class, spaces):
    spec = RLModuleSpec(module_class=module_class, observation_space=spaces[0], action_space=spaces[1])
    with pytest.raises(ValueError, match="takes module_spec or module, not both"):
        learner_class(spec, module=built_module(module_class, spaces))


@pytest.mark.parametrize(("learner_class", "module_class", "spaces"), ALGORITHMS, ids=IDS)
def test_the_train_pass_takes_a_batch_of_no_rows(learner_class, module_class, spaces):
    module = built_module(module_class, spaces)
    out = module.forward_train(_no_rows(module))
    tensors = [value for value in out.values() if isinstance(value, torch.Tensor)]
    assert tensors and all(len(tensor) == 0 for tensor in tensors)


def test_bc_learner_builds_a_bc_module_from_model_config():
    learner = BCLearner(model_config={"fcnet_hiddens": [5]})
    spec = learner.module_spec.rl_module_specs["default_policy"]
    assert spec.module_class is BCModule and spec.model_config == {"fcnet_hiddens": [5]}
    with pytest.raises(ValueError, match="pass either module_spec or model_config, not both"):
        BCLearner(bc_spec(), model_config={"fcnet_hiddens": [5]})


def test_an_off_policy_learner_on_rollouts_names_the_data_module_to_use():
    with pytest.raises(ValueError, match="use lightning_rl.data.OffPolicyDataModule"):
        on_policy_data = SimpleNamespace(
            data_offer=lambda: DataOffer(frozenset({"episodes"})), accept_requirements=lambda requirements: None
        )
        DQNLearner().check_fits_data(on_policy_data)


def test_an_on_policy_learner_asked_to_replay_names_both_data_modules():
    learner = BCLearner(bc_spec())
    with pytest.raises(NotImplementedError, match="OffPolicyDataModule; on-policy Learners use OnPolicyDataModule"):
        learner.update_from_replay(None)


def _no_rows(module: Any) -> dict[str, torch.Tensor]:
    """A train batch of no rows: ``obs``, ``new_obs`` and ``actions`` shaped by the module's spaces."""

    def empty(space: gym.Space) -> torch.Tensor:
        dtype = torch.long if isinstance(space, gym.spaces.Discrete) else torch.float32
        return torch.zeros((0, *space.shape), dtype=dtype)

    obs = empty(module.observation_space)
    return {Columns.OBS: obs, Columns.NEXT_OBS: obs.clone(), Columns.ACTIONS: empty(module.action_space)}
