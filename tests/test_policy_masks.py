"""``Policy`` on PettingZoo's masked observation space: legal actions only, mask errors, self-play checkpoints."""

from __future__ import annotations

import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import fit_small_self_play

from lightning_rl.algorithms.ppo import PPOModule
from lightning_rl.policy import Policy

NUM_ACTIONS = 4
OBS_PART = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)
MASKED_SPACE = gym.spaces.Dict({"action_mask": gym.spaces.Box(0, 1, (NUM_ACTIONS,), np.int8), "observation": OBS_PART})
ACTIONS = gym.spaces.Discrete(NUM_ACTIONS)


def _policy() -> Policy:
    torch.manual_seed(0)
    module = PPOModule(MASKED_SPACE, ACTIONS, {"fcnet_hiddens": [8]})
    # The net prefers the last action everywhere, so that a mask forbidding it is what keeps actions legal.
    with torch.no_grad():
        module.pi[-1].bias[-1] = 50.0
    return Policy(module)


def _random_masks(rows: int, seed: int) -> np.ndarray:
    """0/1 int8 masks with at least one legal action per row, the last (preferred) one mostly illegal."""
    rng = np.random.default_rng(seed)
    masks = rng.integers(0, 2, (rows, NUM_ACTIONS)).astype(np.int8)
    masks[:, -1] = rng.random(rows) < 0.1
    masks[np.arange(rows), rng.integers(0, NUM_ACTIONS - 1, rows)] = 1
    return masks


def _observations(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (rows, *OBS_PART.shape)).astype(np.float32)


def test_a_masked_policy_acts_legally_on_one_observation_and_on_a_batch_greedy_and_sampled():
    policy = _policy()
    assert policy.is_masked
    masks, obs = _random_masks(200, 0), _observations(200, 1)
    for deterministic in (True, False):
        actions = policy.act({"action_mask": masks, "observation": obs}, deterministic=deterministic)
        assert actions.shape == (200,)
        assert masks[np.arange(200), actions].all()
    # The mask decides: with the preferred action legal, greedy takes it; without, another.
    one = {"action_mask": np.array([1, 1, 0, 1], np.int8), "observation": obs[0]}
    assert int(policy.act(one)) == NUM_ACTIONS - 1
    one["action_mask"] = np.array([0, 1, 0, 0], np.int8)
    assert int(policy.act(one)) == 1 and int(policy.act(one, deterministic=False)) == 1
    # Tensors in, a tensor out; a bool mask works as 0/1 does.
    bool_mask = torch.tensor([True, False, False, False])
    tensor = policy.act({"action_mask": bool_mask, "observation": torch.as_tensor(obs[0])})
    assert isinstance(tensor, torch.Tensor) and int(tensor) == 0


def test_a_masked_policy_names_a_missing_mask_a_wrong_width_and_a_row_without_a_legal_action():
    policy = _policy()
    obs = _observations(3, 0)
    with pytest.raises(ValueError, match=r"masked observation space: .*\['action_mask', 'observation'\], got ndarray"):
        policy.act(obs[0])
    with pytest.raises(ValueError, match=r"got \['observation'\]"):
        policy.act({"observation": obs})
    with pytest.raises(ValueError, match=r"'action_mask' has shape \(3,\), expected \(4,\)"):
        policy.act({"action_mask": np.ones(3, np.int8), "observation": obs[0]})
    with pytest.raises(ValueError, match=r"'action_mask' has shape \(2, 4\), expected \(3, 4\)"):
        policy.act({"action_mask": np.ones((2, 4), np.int8), "observation": obs})
    masks = np.ones((3, 4), np.int8)
    masks[1] = 0
    with pytest.raises(ValueError, match=r"'action_mask' allows no action for observation\(s\) \[1\]"):
        policy.act({"action_mask": masks, "observation": obs})
    with pytest.raises(ValueError, match="allows no action for the observation;"):
        policy.act({"action_mask": np.zeros(4, np.int8), "observation": obs[0]})
    with pytest.raises(ValueError, match=r"observation of shape \(5,\) does not fit the observation space Box"):
        policy.act({"action_mask": np.ones(4, np.int8), "observation": np.zeros(5, np.float32)})


def test_a_masked_space_with_a_non_discrete_action_space_is_refused():
    module = _policy().module
    with pytest.raises(ValueError, match="Policy has the action space Box.*Discrete action spaces only"):
        Policy(module, action_space=gym.spaces.Box(-1, 1, (4,), np.float32))


@pytest.fixture(scope="module")
def self_play_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``lightning-rl fit --config examples/ppo_connect_four_selfplay.yaml``, shrunk to 192 moves (a few seconds).

    Six rollouts: the league evaluates main after the fifth and snapshots it as ``main_v0``.
    """
    pytest.importorskip("pettingzoo")
    root = tmp_path_factory.mktemp("self_play")
    cli = fit_small_self_play(root)
    assert sorted(cli.model.module.keys()) == ["fixed_heuristic", "fixed_random", "main", "main_v0"]
    return root / "checkpoints" / "last.ckpt"


def test_a_self_play_checkpoints_modules_play_connect_four_legally(self_play_checkpoint: Path):
    from pettingzoo.classic import connect_four_v3

    policies = {
        "player_0": Policy.from_checkpoint(self_play_checkpoint, module_id="main"),
        "player_1": Policy.from_checkpoint(self_play_checkpoint, module_id="main_v0"),
    }
    assert policies["player_0"].is_masked and policies["player_0"].observation_space["observation"].shape == (6, 7, 2)
    env = connect_four_v3.env()
    positions = []
    for game, deterministic in enumerate((True, False, False)):
        env.reset(seed=game)
        for agent in env.agent_iter():
            observation, _, terminated, truncated, _ = env.last()
            if terminated or truncated:
                env.step(None)
                continue
            positions.append(observation)
            action = int(policies[agent].act(observation, deterministic=deterministic))
            assert observation["action_mask"][action] == 1
            env.step(action)
    # A batch, as a dict of stacked arrays, with some columns closed by hand: still legal only.
    rng = np.random.default_rng(0)
    masks = np.stack([position["action_mask"] for position in positions])
    masks = np.where(rng.random(masks.shape) < 0.5, 0, masks).astype(np.int8)
    masks[np.arange(len(masks)), rng.integers(0, 7, len(masks))] = 1
    batch = {"action_mask": masks, "observation": np.stack([position["observation"] for position in positions])}
    for deterministic in (True, False):
        actions = policies["player_0"].act(batch, deterministic=deterministic)
        assert masks[np.arange(len(masks)), actions].all()


def test_without_module_id_a_self_play_checkpoint_names_its_modules(self_play_checkpoint: Path):
    modules = r"\['main', 'fixed_random', 'fixed_heuristic', 'main_v0'\]"  # the league's fixed opponents included
    with pytest.raises(ValueError, match=rf"holds 4 modules {modules}; pass module_id="):
        Policy.from_checkpoint(self_play_checkpoint)


def _run_masked_export(path: Path, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """The exported graph's actions, fed ``obs`` and ``action_mask`` by name (ONNX) or keyword (torch.export)."""
    if path.suffix == ".onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == ["obs", "action_mask"]
        return session.run(["actions"], {"obs": obs, "action_mask": masks})[0]
    program = torch.export.load(str(path)).module()
    with torch.no_grad():
        return program(torch.from_numpy(obs), action_mask=torch.from_numpy(masks)).numpy()


@pytest.mark.parametrize("export_format", ["onnx", "torch"])
def test_a_masked_policy_exports_with_an_action_mask_input_and_acts_as_policy_act_on_legal_positions(
    export_format: str, tmp_path: Path
):
    if export_format == "onnx":
        pytest.importorskip("onnxruntime")
    from lightning_rl.policy.export import export_policy

    policy = _policy()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = export_policy(policy, tmp_path / f"policy.{'onnx' if export_format == 'onnx' else 'pt2'}", export_format)
    # Both inputs share the batch dim: no warning about its name reaches the user, and the graph names it.
    assert not [str(w.message) for w in caught if "axis name" in str(w.message)]
    if export_format == "onnx":
        import onnx

        graph = onnx.load(str(path)).graph
        assert [i.type.tensor_type.shape.dim[0].dim_param for i in graph.input] == ["batch", "batch"]
    masks, obs = _random_masks(300, 5), _observations(300, 6)
    actions = _run_masked_export(path, obs, masks)
    np.testing.assert_array_equal(actions, policy.act({"action_mask": masks, "observation": obs}))
    assert masks[np.arange(300), actions].all()
    # The net's favourite (the last action) is taken where it is legal, so the mask is what decides.
    assert (actions == NUM_ACTIONS - 1).any() and (actions != NUM_ACTIONS - 1).any()
    for batch in (1, 3):
        np.testing.assert_array_equal(
            _run_masked_export(path, obs[:batch], masks[:batch]),
            policy.act({"action_mask": masks[:batch], "observation": obs[:batch]}),
        )


def test_lightning_rl_export_writes_a_self_play_module_with_two_inputs(
    self_play_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    from lightning_rl.cli import export_command

    output = tmp_path / "main.pt2"
    args = ["--ckpt_path", str(self_play_checkpoint), "--format", "torch", "--output", str(output)]
    args += ["--module_id", "main"]
    export_command.main(args)
    assert "observations (6, 7, 2) and action masks (7,) -> Discrete(7)" in capsys.readouterr().out
    policy = Policy.from_checkpoint(self_play_checkpoint, module_id="main")
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 2, (100, 6, 7, 2)).astype(np.int8)
    masks = rng.integers(0, 2, (100, 7)).astype(np.int8)
    masks[np.arange(100), rng.integers(0, 7, 100)] = 1
    np.testing.assert_array_equal(
        _run_masked_export(output, obs, masks), policy.act({"action_mask": masks, "observation": obs})
    )


@pytest.mark.parametrize("export_format", ["onnx", "torch"])
def test_a_recurrent_masked_policy_acts_legally_step_after_step_and_exports_with_its_state(
    export_format: str, tmp_path: Path
):
    if export_format == "onnx":
        pytest.importorskip("onnxruntime")
    from lightning_rl.policy.export import export_policy

    torch.manual_seed(0)
    config = {"fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 8}
    policy = Policy(PPOModule(MASKED_SPACE, ACTIONS, config))
    assert policy.is_stateful and policy.is_masked
    for step in range(3):
        masks, obs = _random_masks(5, step), _observations(5, 10 + step)
        actions = policy.act({"action_mask": masks, "observation": obs}, deterministic=step != 1)
        assert masks[np.arange(5), actions].all()
    # The export check steps the graph (obs, state_in, action_mask) beside Policy.act for 5 steps.
    export_policy(policy, tmp_path / f"recurrent.{'onnx' if export_format == 'onnx' else 'pt2'}", export_format)
