"""model_config is checked when a spec, module or Learner is made: keys, sizes, activations, flags."""

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from lightning_rl.algorithms.bc import BCLearner, BCModule
from lightning_rl.algorithms.dqn import DQNLearner, DQNModule
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.algorithms.sac import SACLearner, SACModule
from lightning_rl.core.module_checks import ModelConfigKey, check_known_keys
from lightning_rl.core.rl_module_specs import RLModuleSpec
from lightning_rl.core.rl_modules import RLModule

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
DISCRETE = gym.spaces.Discrete(2)
BOX = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


class FreeFormModule(RLModule):
    """Declares no keys: its model_config is taken as given."""


class WideBCModule(BCModule):
    """A subclass that accepts one key more than its parent."""

    model_config_keys = {**BCModule.model_config_keys, "widen": ModelConfigKey.flag(False)}


def test_a_misspelled_model_config_key_names_the_closest_valid_one():
    expected = r"PPOModule: unknown model_config key 'fcnet_hidens'; did you mean 'fcnet_hiddens'\?"
    with pytest.raises(ValueError, match=expected):
        PPOLearner(model_config={"fcnet_hidens": [8]})


def test_an_unknown_key_with_no_close_match_lists_the_valid_keys():
    expected = (
        r"unknown model_config key 'zzz'\. Valid keys: \['conv_activation', 'conv_filters', 'fcnet_activation', "
        r"'fcnet_hiddens', 'image_layout', 'tanh_epsilon'\]"
    )
    with pytest.raises(ValueError, match=expected):
        SACLearner(model_config={"zzz": 1})


@pytest.mark.parametrize(
    ("learner_class", "extra"),
    [(DQNLearner, {"dueling": True}), (PPOLearner, {"vf_share_layers": True, "free_log_std": False})],
)
def test_each_algorithm_module_accepts_its_own_extra_keys(learner_class, extra):
    learner = learner_class(model_config={"fcnet_hiddens": [4], **extra})
    assert learner.module_spec.rl_module_specs["default_policy"].model_config == {"fcnet_hiddens": [4], **extra}


@pytest.mark.parametrize(("learner_class", "key"), [(SACLearner, "dueling"), (BCLearner, "vf_share_layers")])
def test_an_algorithm_module_refuses_another_algorithms_keys(learner_class, key):
    with pytest.raises(ValueError, match=f"unknown model_config key '{key}'"):
        learner_class(model_config={key: True})


@pytest.mark.parametrize("sizes", [[-1], [8, 0], [8.0], [True], 64, "64"])
def test_layer_sizes_must_be_a_list_of_positive_ints(sizes):
    with pytest.raises(ValueError, match=r"DQNModule: model_config\['fcnet_hiddens'\] must be a list of ints > 0"):
        DQNLearner(model_config={"fcnet_hiddens": sizes})


def test_no_hidden_layer_is_a_valid_size_list():
    module = RLModuleSpec(DQNModule, OBS, DISCRETE, {"fcnet_hiddens": [], "dueling": True}).build()
    assert module.resolved_model_config()["fcnet_hiddens"] == []


def test_an_unknown_activation_is_refused_naming_the_allowed_ones():
    expected = r"model_config\['fcnet_activation'\] must be one of \['elu', 'linear', 'relu'"
    with pytest.raises(ValueError, match=expected):
        BCLearner(model_config={"fcnet_activation": "gelu"})


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_flags_must_be_booleans(value):
    with pytest.raises(ValueError, match=r"model_config\['dueling'\] must be True or False"):
        DQNLearner(model_config={"dueling": value})


def test_model_config_must_be_a_dict():
    with pytest.raises(ValueError, match="PPOModule: model_config must be a dict, got list"):
        PPOLearner(model_config=[["fcnet_hiddens", [8]]])


def test_a_spec_checks_its_model_config_when_made_before_it_has_spaces():
    with pytest.raises(ValueError, match="did you mean 'dueling'"):
        RLModuleSpec(module_class=DQNModule, model_config={"dueling_": True})


def test_a_spec_refuses_a_module_class_that_is_not_an_rl_module():
    with pytest.raises(ValueError, match="module_class must be an RLModule subclass"):
        RLModuleSpec(module_class=dict)


def test_a_spec_read_back_from_plain_data_is_checked_too():
    data = RLModuleSpec(PPOModule, OBS, DISCRETE, {"fcnet_hiddens": [4]}).to_dict()
    data["model_config"] = {"fcnet_hiddens": [-4]}
    with pytest.raises(ValueError, match=r"must be a list of ints > 0 \(the hidden layer sizes\), got \[-4\]"):
        RLModuleSpec.from_dict(data)


def test_a_module_checks_its_model_config_before_building_any_layer():
    # Without the check, torch would fail inside nn.Linear with a negative dimension.
    with pytest.raises(ValueError, match=r"SACModule: model_config\['fcnet_hiddens'\]"):
        SACModule(OBS, BOX, {"fcnet_hiddens": [-8]})


def test_a_config_edited_after_the_spec_was_made_is_checked_when_the_module_is_built():
    spec = RLModuleSpec(PPOModule, OBS, DISCRETE, {"fcnet_hiddens": [4]})
    spec.model_config["fcnet_activaton"] = "relu"
    with pytest.raises(ValueError, match="did you mean 'fcnet_activation'"):
        spec.build()


def test_add_module_refuses_a_bad_config_and_leaves_the_modules_as_they_were():
    learner = BCLearner(RLModuleSpec(BCModule, OBS, DISCRETE, {"fcnet_hiddens": [4]}))
    learner.build()
    spec = RLModuleSpec(BCModule, OBS, DISCRETE, {"fcnet_hiddens": [4]})
    spec.model_config["fcnet_hiddens"] = [0]
    with pytest.raises(ValueError, match=r"model_config\['fcnet_hiddens'\]"):
        learner.add_module(module_id="opponent", module_spec=spec)
    assert list(learner.module.keys()) == ["default_policy"]


def test_the_defaults_fill_the_keys_left_out_and_model_config_stays_as_given():
    module = RLModuleSpec(SACModule, OBS, BOX, {"fcnet_hiddens": [4]}).build()
    assert module.model_config == {"fcnet_hiddens": [4]}
    encoder_defaults = {"conv_filters": None, "conv_activation": "relu", "image_layout": "auto"}
    sac_defaults = {"fcnet_activation": "relu", "tanh_epsilon": 0.0}
    assert module.resolved_model_config() == {"fcnet_hiddens": [4], **sac_defaults, **encoder_defaults}
    assert PPOModule(OBS, DISCRETE, {}).resolved_model_config() == {
        "fcnet_hiddens": [256, 256],
        "fcnet_activation": "tanh",
        "vf_share_layers": False,
        "pi_fcnet_hiddens": None,
        "pi_fcnet_activation": None,
        "vf_fcnet_hiddens": None,
        "vf_fcnet_activation": None,
        "free_log_std": True,
        "log_std_init": 0.0,
        "ortho_init": True,
        **encoder_defaults,
        "use_lstm": False,
        "recurrent_cell": "lstm",
        "lstm_cell_size": 256,
        "max_seq_len": 20,
        "lstm_use_prev_action": False,
        "lstm_use_prev_reward": False,
    }


def test_a_resolved_default_list_is_a_copy_that_no_module_shares():
    first = PPOModule(OBS, DISCRETE, {"fcnet_hiddens": [4]}).resolved_model_config()
    first["fcnet_activation"] = "relu"
    config: dict[str, Any] = BCModule(OBS, DISCRETE, {}).resolved_model_config()
    config["fcnet_hiddens"].append(1)
    assert BCModule(OBS, DISCRETE, {}).resolved_model_config()["fcnet_hiddens"] == [256, 256]


def test_a_subclass_extends_its_parents_keys():
    module = WideBCModule(OBS, DISCRETE, {"fcnet_hiddens": [4], "widen": True})
    assert module.resolved_model_config()["widen"] is True
    with pytest.raises(ValueError, match="WideBCModule: unknown model_config key 'widn'; did you mean 'widen'"):
        WideBCModule(OBS, DISCRETE, {"widn": True})


def test_a_module_that_declares_no_keys_takes_any_but_still_needs_a_dict_with_str_keys():
    assert FreeFormModule(OBS, DISCRETE, {"anything": object}).model_config == {"anything": object}
    with pytest.raises(ValueError, match="FreeFormModule: model_config keys must be str, got 1"):
        FreeFormModule(OBS, DISCRETE, {1: "a"})
    with pytest.raises(ValueError, match="FreeFormModule: model_config must be a dict"):
        FreeFormModule(OBS, DISCRETE, "fcnet_hiddens")


def test_check_known_keys_names_where_the_keys_belong():
    with pytest.raises(ValueError, match=r"^module 'p1': unknown hyperparameter 'lr_'; did you mean 'lr'\?"):
        check_known_keys(["lr_"], ["lr", "num_epochs"], "hyperparameter", where="module 'p1'")
    check_known_keys(["lr"], ["lr"], "hyperparameter")


def test_a_typo_on_the_command_line_fails_before_any_directory_exists(tmp_path, capsys):
    from lightning_rl.cli import main

    root = tmp_path / "runs"
    config = Path(__file__).parents[1] / "examples" / "ppo_cartpole.yaml"
    args = ["fit", "--config", str(config), "--trainer.default_root_dir", str(root)]
    # max_steps bounds the run should the typo ever pass unnoticed again.
    args += ["--trainer.max_steps", "1", "--model.init_args.model_config", '{"fcnet_hidens": [8]}']
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code != 0
    assert "did you mean 'fcnet_hiddens'" in capsys.readouterr().err
    assert not root.exists()
