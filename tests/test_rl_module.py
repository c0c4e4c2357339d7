import copy
import io
import json
import sys
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from lightning_rl.core.columns import ALL_MODULES, DEFAULT_MODULE_ID, Columns
from lightning_rl.core.distributions import Categorical, DiagGaussian
from lightning_rl.core.mlp import build_mlp, build_mlp_from_config, flat_obs_dim, flatten_obs
from lightning_rl.core.module_checks import check_state_matches, validate_module_id
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.rl_modules import MultiRLModule, RLModule

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (4,), dtype=np.float32)
ACTION_SPACE = gym.spaces.Discrete(3)
SMALL_CONFIG = {"fcnet_hiddens": [8], "fcnet_activation": "relu"}


class TinyPolicy(RLModule):
    """A policy head, plus a value head unless inference_only."""

    def setup(self) -> None:
        in_dim = flat_obs_dim(self.observation_space)
        out_dim = self.get_train_action_dist_cls().required_input_dim(self.action_space)
        self.pi = build_mlp_from_config(in_dim, self.model_config, out_dim)
        if not self.inference_only:
            self.vf = build_mlp_from_config(in_dim, self.model_config, 1)

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self.pi(flatten_obs(batch[Columns.OBS], self.observation_space))}

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        out = self._forward(batch)
        out[Columns.VF_PREDS] = self.vf(flatten_obs(batch[Columns.OBS], self.observation_space)).squeeze(-1)
        return out


class NotAnRLModule(nn.Module):
    pass


def _tiny(**kwargs: Any) -> TinyPolicy:
    return TinyPolicy(OBS_SPACE, ACTION_SPACE, kwargs.pop("model_config", SMALL_CONFIG), **kwargs)


def _obs_batch(rows: int = 5) -> dict[str, torch.Tensor]:
    return {Columns.OBS: torch.randn(rows, 4)}


def _weights_only_round_trip(obj: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


# --- building blocks ---------------------------------------------------------------------


def test_build_mlp_stacks_linear_and_activation_layers_and_ends_with_an_unactivated_output():
    mlp = build_mlp(4, [8, 6], "relu", out_dim=2)
    assert [type(layer) for layer in mlp] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    assert mlp(torch.randn(3, 4)).shape == (3, 2)


def test_build_mlp_without_out_dim_ends_at_the_last_hidden_layer():
    mlp = build_mlp(4, [8], "tanh")
    assert [type(layer) for layer in mlp] == [nn.Linear, nn.Tanh]


@pytest.mark.parametrize(
    ("name", "layer_type"), [("silu", nn.SiLU), ("swish", nn.SiLU), ("elu", nn.ELU), ("tanh", nn.Tanh)]
)
def test_build_mlp_maps_activation_names_to_layers(name: str, layer_type: type[nn.Module]):
    assert isinstance(build_mlp(2, [3], name)[1], layer_type)


def test_build_mlp_linear_activation_adds_no_nonlinearity():
    assert [type(layer) for layer in build_mlp(2, [3, 3], "linear", 1)] == [nn.Linear] * 3


def test_build_mlp_rejects_an_unknown_activation_naming_it():
    with pytest.raises(ValueError, match="'gelu'"):
        build_mlp(2, [3], "gelu")


def test_build_mlp_from_config_defaults_to_two_tanh_layers_of_256():
    mlp = build_mlp_from_config(5, {})
    assert [layer.out_features for layer in mlp if isinstance(layer, nn.Linear)] == [256, 256]
    assert isinstance(mlp[1], nn.Tanh)


def test_flatten_obs_flattens_box_and_one_hot_encodes_discrete():
    box = gym.spaces.Box(0, 1, (2, 3))
    assert flat_obs_dim(box) == 6
    assert flatten_obs(torch.ones(4, 2, 3), box).shape == (4, 6)
    discrete = gym.spaces.Discrete(3, start=1)
    assert flat_obs_dim(discrete) == 3
    assert torch.equal(flatten_obs(torch.tensor([1, 3]), discrete), torch.tensor([[1.0, 0, 0], [0, 0, 1]]))


def test_flat_obs_dim_rejects_unsupported_observation_spaces():
    with pytest.raises(ValueError, match="Unsupported observation space"):
        flat_obs_dim(gym.spaces.Text(5))


# --- RLModule ----------------------------------------------------------------------------


def test_base_forward_raises_not_implemented_naming_the_class():
    module = RLModule(OBS_SPACE, ACTION_SPACE)
    with pytest.raises(NotImplementedError, match="RLModule must implement _forward"):
        module.forward_inference(_obs_batch())


def test_inference_and_exploration_share_forward_and_train_adds_value_predictions():
    module = _tiny()
    batch = _obs_batch()
    inference = module.forward_inference(batch)
    assert set(inference) == {Columns.ACTION_DIST_INPUTS}
    assert inference[Columns.ACTION_DIST_INPUTS].shape == (5, 3)
    torch.testing.assert_close(module.forward_exploration(batch), inference)
    train = module(batch)
    assert set(train) == {Columns.ACTION_DIST_INPUTS, Columns.VF_PREDS}
    assert train[Columns.VF_PREDS].shape == (5,)


def test_inference_only_module_skips_train_only_layers():
    assert not hasattr(_tiny(inference_only=True), "vf")


def test_action_dist_classes_follow_the_action_space():
    assert _tiny().get_inference_action_dist_cls() is Categorical
    box_module = TinyPolicy(OBS_SPACE, gym.spaces.Box(-1, 1, (2,)), SMALL_CONFIG)
    assert box_module.get_exploration_action_dist_cls() is DiagGaussian
    assert box_module.forward_inference(_obs_batch())[Columns.ACTION_DIST_INPUTS].shape == (5, 4)


def test_model_config_is_copied_so_later_edits_to_the_callers_dict_do_not_leak_in():
    config = dict(SMALL_CONFIG)
    module = _tiny(model_config=config)
    config["fcnet_hiddens"] = [99]
    assert module.model_config["fcnet_hiddens"] == [8]


def test_module_is_stateless_and_unwraps_to_itself():
    module = _tiny()
    assert module.is_stateful() is False
    assert module.unwrapped() is module


def test_get_state_is_a_detached_copy_that_later_updates_do_not_change():
    module = _tiny()
    state = module.get_state()
    with torch.no_grad():
        module.pi[0].weight.add_(1.0)
    assert not torch.equal(state["pi.0.weight"], module.pi[0].weight)
    assert not any(tensor.requires_grad for tensor in state.values())


def test_set_state_loads_another_modules_weights():
    source, target = _tiny(), _tiny()
    target.set_state(source.get_state())
    for name, tensor in target.state_dict().items():
        assert torch.equal(tensor, source.state_dict()[name])


def test_set_state_names_missing_unexpected_and_mismatched_keys_and_leaves_weights_untouched():
    module = _tiny()
    before = module.get_state()
    bad = _tiny().get_state()
    del bad["vf.0.bias"]
    bad["extra.weight"] = torch.zeros(1)
    bad["pi.0.weight"] = torch.zeros(7, 4)
    bad["pi.2.bias"] = torch.full((3,), 5.0)  # fits, but must not be loaded either
    with pytest.raises(ValueError) as err:
        module.set_state(bad)
    message = str(err.value)
    assert "missing keys ['vf.0.bias']" in message
    assert "unexpected keys ['extra.weight']" in message
    assert "'pi.0.weight': module has (8, 4), state has (7, 4)" in message
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, before[name])


def test_check_state_matches_accepts_the_modules_own_state():
    module = _tiny()
    check_state_matches(module, module.state_dict())


def test_as_multi_rl_module_holds_the_module_under_the_default_id():
    module = _tiny()
    multi = module.as_multi_rl_module()
    assert list(multi.keys()) == [DEFAULT_MODULE_ID]
    assert multi[DEFAULT_MODULE_ID] is module
    assert multi.as_multi_rl_module() is multi


# --- module ids --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("module_id", "rule"),
    [
        ("", "non-empty str"),
        (3, "non-empty str"),
        (ALL_MODULES, "reserved for results over all modules"),
        ("__hidden", "must not start with '__'"),
        ("a.b", "must not contain '.'"),
        ("a/b", "must not contain '/'"),
        ("train", "clashes with an attribute of torch.nn.ModuleDict"),
    ],
)
def test_validate_module_id_names_the_id_and_the_rule_it_breaks(module_id: Any, rule: str):
    with pytest.raises(ValueError, match=rule) as err:
        validate_module_id(module_id)
    assert repr(module_id) in str(err.value)


def test_validate_module_id_accepts_ordinary_ids():
    validate_module_id(DEFAULT_MODULE_ID)
    validate_module_id("agent_1-blue")


# --- MultiRLModule -----------------------------------------------------------------------


def _multi() -> MultiRLModule:
    return MultiRLModule({"a": _tiny(), "b": _tiny()})


def test_multi_rl_module_is_a_dict_of_modules():
    multi = _multi()
    assert list(multi.keys()) == ["a", "b"] == list(multi)
    assert len(multi) == 2 and "a" in multi and "c" not in multi
    assert [module_id for module_id, _ in multi.items()] == ["a", "b"]
    with pytest.raises(KeyError, match=r"Unknown module id\(s\) \['c'\]; known ids: \['a', 'b'\]"):
        multi["c"]


def test_add_module_refuses_a_taken_id_unless_override():
    multi = _multi()
    replacement = _tiny()
    with pytest.raises(ValueError, match="'a' already exists"):
        multi.add_module("a", replacement)
    multi.add_module("a", replacement, override=True)
    assert multi["a"] is replacement


def test_add_module_validates_the_id():
    with pytest.raises(ValueError, match="must not contain '/'"):
        _multi().add_module("x/y", _tiny())


def test_remove_module_removes_and_names_unknown_ids_unless_told_to_ignore_them():
    multi = _multi()
    multi.remove_module("a")
    assert list(multi.keys()) == ["b"]
    with pytest.raises(ValueError, match=r"\['a'\]; known ids: \['b'\]"):
        multi.remove_module("a")
    multi.remove_module("a", raise_err_if_not_found=False)
    assert list(multi.keys()) == ["b"]


def test_multi_forward_runs_only_the_modules_in_the_batch():
    multi = _multi()
    batch = {"b": _obs_batch(2)}
    out = multi.forward_train(batch)
    assert set(out) == {"b"}
    torch.testing.assert_close(out["b"], multi["b"].forward_train(batch["b"]))
    assert set(multi(batch)["b"]) == {Columns.ACTION_DIST_INPUTS, Columns.VF_PREDS}
    assert set(multi.forward_inference(batch)["b"]) == {Columns.ACTION_DIST_INPUTS}
    assert set(multi.forward_exploration(batch)["b"]) == {Columns.ACTION_DIST_INPUTS}
    with pytest.raises(ValueError, match=r"\['z'\]"):
        multi.forward_inference({"z": _obs_batch()})


def test_multi_state_dict_keys_are_prefixed_by_the_module_dict_and_module_id():
    keys = set(_multi().state_dict())
    assert "_rl_modules.a.pi.0.weight" in keys and "_rl_modules.b.vf.2.bias" in keys


def test_multi_state_round_trip_sets_only_the_given_modules():
    source, target = _multi(), _multi()
    b_before = target["b"].get_state()
    state = source.get_state(["a"])
    assert set(state) == {"a"}
    target.set_state(_weights_only_round_trip(state))
    for name, tensor in target["a"].state_dict().items():
        assert torch.equal(tensor, source["a"].state_dict()[name])
    for name, tensor in target["b"].state_dict().items():
        assert torch.equal(tensor, b_before[name])


def test_multi_set_state_rejects_an_unknown_id_naming_it_and_the_known_ids():
    with pytest.raises(ValueError, match=r"\['c'\]; known ids: \['a', 'b'\]"):
        _multi().set_state({"c": {}})


def test_multi_set_state_validates_every_module_before_loading_any():
    multi = _multi()
    before = multi.get_state()
    state = _multi().get_state()
    del state["b"]["pi.0.weight"]
    with pytest.raises(ValueError, match=r"Module 'b': .*missing keys \['pi.0.weight'\]"):
        multi.set_state(state)
    for module_id in ("a", "b"):
        for name, tensor in multi[module_id].state_dict().items():
            assert torch.equal(tensor, before[module_id][name])


def test_multi_deepcopy_to_and_load_state_dict_still_work_after_overriding_add_module():
    multi = _multi()
    clone = copy.deepcopy(multi)
    assert list(clone.keys()) == ["a", "b"]
    assert clone["a"].pi[0].weight is not multi["a"].pi[0].weight
    clone.to(torch.float64)
    assert clone["b"].pi[0].weight.dtype == torch.float64
    assert multi["b"].pi[0].weight.dtype == torch.float32
    other = _multi()
    other.load_state_dict(_weights_only_round_trip(multi.state_dict()))
    assert torch.equal(other["a"].vf[0].weight, multi["a"].vf[0].weight)


def test_constructor_rejects_a_module_that_is_not_an_rl_module():
    with pytest.raises(TypeError, match="'a' is a Linear, not an RLModule"):
        MultiRLModule({"a": nn.Linear(2, 2)})


def test_add_module_with_a_plain_torch_module_keeps_torch_semantics():
    multi = _multi()
    multi.register_module("extra", nn.Linear(2, 2))
    assert "extra" in dict(multi.named_children())
    assert "extra" not in multi
    # Torch utilities that rebuild children call add_module(name, child) on every module.
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(multi)
    assert converted is multi and list(converted.keys()) == ["a", "b"]


# --- specs -------------------------------------------------------------------------------


def _spec(**kwargs: Any) -> RLModuleSpec:
    fields = {
        "module_class": TinyPolicy,
        "observation_space": OBS_SPACE,
        "action_space": ACTION_SPACE,
        "model_config": SMALL_CONFIG,
    }
    return RLModuleSpec(**{**fields, **kwargs})


@pytest.mark.parametrize("missing", ["module_class", "observation_space", "action_space"])
def test_spec_build_names_the_field_that_is_not_set(missing: str):
    with pytest.raises(ValueError, match=f"{missing} is not set"):
        _spec(**{missing: None}).build()


def test_spec_build_passes_every_field_to_the_module():
    module = _spec(inference_only=True).build()
    assert isinstance(module, TinyPolicy)
    assert module.observation_space == OBS_SPACE and module.action_space == ACTION_SPACE
    assert module.model_config == SMALL_CONFIG and module.inference_only
    assert module.pi[0].out_features == 8


def test_spec_dict_survives_torch_weights_only_load_and_builds_an_equal_shaped_module():
    spec = _spec(action_space=gym.spaces.Box(-1, 1, (2,)))
    rebuilt = RLModuleSpec.from_dict(_weights_only_round_trip(spec.to_dict()))
    assert rebuilt == spec
    original, module = spec.build(), rebuilt.build()
    assert {k: v.shape for k, v in module.state_dict().items()} == {
        k: v.shape for k, v in original.state_dict().items()
    }


def test_spec_dict_survives_json():
    spec = _spec()
    assert RLModuleSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_spec_to_dict_stores_the_class_as_an_import_path():
    assert _spec().to_dict()["module_class"] == f"{TinyPolicy.__module__}.TinyPolicy"


def test_spec_to_dict_refuses_a_class_defined_in_a_function():
    class LocalPolicy(TinyPolicy):
        pass

    with pytest.raises(ValueError, match="define it at module level"):
        _spec(module_class=LocalPolicy).to_dict()


def test_spec_to_dict_turns_tuples_into_lists_and_rejects_non_plain_config_values():
    assert _spec(model_config={"fcnet_hiddens": (4, 4)}).to_dict()["model_config"] == {"fcnet_hiddens": [4, 4]}
    with pytest.raises(ValueError, match=r"model_config\['act'\] is a ReLU"):
        _spec(model_config={"act": nn.ReLU()}).to_dict()


def test_spec_from_dict_rejects_a_class_path_that_is_not_an_rl_module():
    data = _spec().to_dict()
    data["module_class"] = f"{NotAnRLModule.__module__}.NotAnRLModule"
    with pytest.raises(ValueError, match="not a loaded subclass of RLModule"):
        RLModuleSpec.from_dict(data)


@pytest.mark.parametrize("path", ["no_such_package.Policy", "lightning_rl.core.rl_module.NoSuchPolicy", "Policy"])
def test_spec_from_dict_rejects_a_class_path_that_names_no_loaded_rl_module(path: str):
    data = _spec().to_dict()
    data["module_class"] = path
    with pytest.raises(ValueError, match="not a loaded subclass of RLModule"):
        RLModuleSpec.from_dict(data)


def test_spec_from_dict_never_imports_the_module_a_class_path_names():
    data = _spec().to_dict()
    data["module_class"] = "antigravity.Policy"  # importing antigravity opens a web browser
    with pytest.raises(ValueError, match="import the module that defines it"):
        RLModuleSpec.from_dict(data)
    assert "antigravity" not in sys.modules


def test_spec_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match=r"\['modle_config'\]"):
        RLModuleSpec.from_dict({**_spec().to_dict(), "modle_config": {}})


def test_single_spec_as_multi_spec_sits_under_the_default_id():
    spec = _spec()
    multi_spec = spec.as_multi_rl_module_spec()
    assert multi_spec.rl_module_specs == {DEFAULT_MODULE_ID: spec}
    assert multi_spec.as_multi_rl_module_spec() is multi_spec


def test_multi_spec_builds_round_trips_and_is_recovered_from_live_modules():
    multi_spec = MultiRLModuleSpec({"a": _spec(), "b": _spec(inference_only=True)})
    multi = multi_spec.build()
    assert list(multi.keys()) == ["a", "b"] and not hasattr(multi["b"], "vf")
    assert MultiRLModuleSpec.from_dict(_weights_only_round_trip(multi_spec.to_dict())) == multi_spec
    assert MultiRLModuleSpec.from_module(multi) == multi_spec


def test_multi_spec_add_and_remove_module_specs():
    multi_spec = MultiRLModuleSpec()
    multi_spec.add_module_spec("a", _spec())
    with pytest.raises(ValueError, match="'a' already has a spec"):
        multi_spec.add_module_spec("a", _spec())
    with pytest.raises(ValueError, match="must not contain '.'"):
        multi_spec.add_module_spec("a.b", _spec())
    multi_spec.remove_module_spec("a")
    assert multi_spec.rl_module_specs == {}
    with pytest.raises(ValueError, match="Unknown module id 'a'"):
        multi_spec.remove_module_spec("a")


def test_multi_spec_rejects_invalid_ids_at_construction():
    with pytest.raises(ValueError, match="reserved"):
        MultiRLModuleSpec({ALL_MODULES: _spec()})
