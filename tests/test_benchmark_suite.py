"""``benchmarks/suite.py``: runs write their own files, finished ones are skipped, and the report judges the targets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture
def suite(import_benchmark):
    return import_benchmark("suite")


def _record(library: str, seed: int, final: float, train_s: float, budget: int = 100_000) -> dict:
    return {
        "task": "ppo_lunarlander", "library": library, "seed": seed, "max_env_steps": budget, "extra_args": [],
        "threads": 1, "status": "done", "env_steps": budget, "setup_s": 2.0, "train_s": train_s,
        "evals": [{"env_steps": budget // 2, "return_mean": final - 100.0}, {"env_steps": budget, "return_mean": final}],
        "hparams": {"data": {"rollouts_per_epoch": 2, "num_envs": 16, "rollout_fragment_length": 1024,
                             "evaluation_num_episodes": 10}},
        "versions": {"stable-baselines3": "2.9.2"},
    }  # fmt: skip


def test_the_report_gives_medians_ratios_and_each_target_met_or_not_with_a_plot(suite, tmp_path: Path):
    pytest.importorskip("matplotlib")  # the bench extra's; the plot needs it
    runs = [_record("ours", 0, 250.0, 98.0), _record("ours", 1, 210.0, 198.0), _record("ours", 2, 150.0, 298.0),
            _record("sb3", 0, 180.0, 48.0), _record("sb3", 1, 190.0, 98.0)]  # fmt: skip
    for record in runs:
        path = suite.run_file(tmp_path, record["task"], record["library"], record["seed"])
        path.write_text(json.dumps(record))
    (tmp_path / "notes.json").write_text("{}")  # not a run file: left out

    suite.report(suite.parse_args(["report", "--out", str(tmp_path)]))

    text = (tmp_path / "suite.md").read_text()
    # Medians: env steps/s 100k / 198 s, wall 2 + 198 s; SB3's of two runs, the mean of the middle two.
    assert "| ours | 3/3 (seeds 0, 1, 2) | 210.0 [150.0, 250.0] | 505 | 200 |" in text
    assert "| SB3 | 2/2 (seeds 0, 1) | 185.0 [180.0, 190.0] | 1,552 | 75 |" in text
    assert "| ours / SB3 | | | 0.33x | 2.67x |" in text
    assert "ours' median eval return >= 200: met (210.0)" in text
    assert "median wall time <= SB3's: NOT met (200 s vs 75 s)" in text
    assert "ours' median final return minus SB3's is 25.0" in text and "come up in 80% of the ways" in text
    assert (tmp_path / "ppo_lunarlander.png").stat().st_size > 10_000


def test_a_finished_run_is_skipped_and_one_of_another_budget_is_refused(suite, tmp_path: Path):
    path = suite.run_file(tmp_path, "ppo_lunarlander", "ours", 0)
    assert not suite.finished_run(path, 100_000, [])
    path.write_text(json.dumps({**_record("ours", 0, 1.0, 1.0), "status": "running"}))
    assert not suite.finished_run(path, 100_000, [])  # interrupted: run again
    path.write_text(json.dumps(_record("ours", 0, 1.0, 1.0)))
    assert suite.finished_run(path, 100_000, [])
    with pytest.raises(SystemExit, match="finished run of 100000 env steps"):
        suite.finished_run(path, 200_000, [])
    # Asked for a final evaluation the run did not play (or one of another size): run again.
    assert not suite.finished_run(path, 100_000, [], final_episodes=100)
    played = {"num_episodes": 100, "return_mean": 1.0}
    path.write_text(json.dumps({**_record("ours", 0, 1.0, 1.0), "final_episodes": 100, "final_evaluation": played}))
    assert suite.finished_run(path, 100_000, [], final_episodes=100) and suite.finished_run(path, 100_000, [])
    assert not suite.finished_run(path, 100_000, [], final_episodes=50)


def test_the_report_gives_the_final_policys_own_evaluation_beside_the_periodic_one(suite, tmp_path: Path):
    pytest.importorskip("matplotlib")
    runs = []
    for library, played in (("ours", (200.0, 240.0, 230.0)), ("sb3", (250.0, 220.0, 210.0))):
        for seed, value in enumerate(played):
            evaluation = {"num_episodes": 100, "first_seed": 500_000_000 + 100 * seed, "return_mean": value}
            runs.append({**_record(library, seed, 100.0, 1.0), "final_evaluation": evaluation})
    runs.append(_record("sb3", 3, 100.0, 1.0))  # played no final episodes: left out of that line
    for record in runs:
        record["task"] = "dqn_lunarlander"  # a task whose target is SB3's median return
    for record in runs:
        suite.run_file(tmp_path, record["task"], record["library"], record["seed"]).write_text(json.dumps(record))

    suite.report(suite.parse_args(["report", "--out", str(tmp_path)]))

    text = (tmp_path / "suite.md").read_text()
    assert ("ours 230.0 [200.0, 240.0] (seeds 0, 1, 2; 100 episodes each); SB3 220.0 [210.0, 250.0] "
            "(seeds 0, 1, 2; 100 episodes each). Ours' median minus SB3's: 10.0") in text  # fmt: skip
    assert "On this reading, ours' median >= SB3's: met." in text


@pytest.mark.slow  # two runs, each a fresh process that imports torch and Lightning (10-20 s)
def test_a_tiny_run_of_ours_and_sb3_writes_both_files_with_the_same_evaluation_schedule(suite, tmp_path: Path):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("Box2D")
    # The parent in this process (what `suite.py run` calls); each run in a fresh subprocess, as always.
    suite.run_task(suite.parse_args(
        ["run", "ppo_lunarlander", "--seeds", "3", "--max-env-steps", "512", "--out", str(tmp_path),
         "--final-episodes", "3", "--",
         "--data.init_args.num_envs", "2", "--data.init_args.rollout_fragment_length", "128",
         "--data.init_args.rollouts_per_epoch", "1", "--model.init_args.num_epochs", "1",
         "--data.init_args.evaluation_num_episodes", "2", "--data.init_args.evaluation_num_envs", "2",
         "--data.init_args.normalize_observations", "true"]  # so the saved models must carry their statistics
    ))  # fmt: skip
    records = {lib: json.loads((tmp_path / f"ppo_lunarlander-{lib}-seed3.json").read_text()) for lib in ("ours", "sb3")}
    for record in records.values():
        assert record["status"] == "done" and record["env_steps"] == 512 and record["threads"] == 1
        assert [point["env_steps"] for point in record["evals"]] == [256, 512]
        assert all(point["num_episodes"] == 2 for point in record["evals"])
    # SB3 copied the flags: 2 envs x 128 steps, seeded with the run's seed.
    assert records["sb3"]["hparams"]["data"]["num_envs"] == 2 and records["sb3"]["hparams"]["data"]["seed"] == 3

    # --final-episodes: each library saved its final model and played it 3 times on seeds of this run's own ...
    for record in records.values():
        played = record["final_evaluation"]
        assert played["num_episodes"] == 3 and len(played["returns"]) == 3 and played["first_seed"] == 500_000_009
        assert played["return_mean"] == pytest.approx(sum(played["returns"]) / 3)
    # ... and the saved models, read back, are the final ones: they replay the last periodic evaluation's episodes.
    from off_policy import GreedyEvaluation

    for library, record in records.items():
        path = tmp_path / f"ppo_lunarlander-{library}-seed3.json"
        act = suite.saved_act(record, path)  # ours' checkpoint; SB3's zip with its VecNormalize statistics
        evaluation = GreedyEvaluation(record["hparams"]["data"], 3)
        evaluation.num_resets = len(record["evals"]) - 1  # the last evaluation's seeds
        returns = evaluation.run(act)
        assert sum(returns) / len(returns) == pytest.approx(record["evals"][-1]["return_mean"], rel=1e-5)
        # The final episodes were played on the seeds the record names, one episode per env.
        data = {**record["hparams"]["data"], "evaluation_num_episodes": 3, "evaluation_num_envs": 3}
        replayed = GreedyEvaluation(data, 3, first_seed=record["final_evaluation"]["first_seed"]).run(act)
        assert replayed == pytest.approx(record["final_evaluation"]["returns"], rel=1e-5)

    # `replay` plays the saved models again and rewrites the final evaluations, keeping the ones it replaces.
    for library in records:
        path = tmp_path / f"ppo_lunarlander-{library}-seed3.json"
        stale = json.loads(path.read_text())
        stale["final_evaluation"].update(returns=[0.0, 0.0, 0.0], return_mean=0.0)
        path.write_text(json.dumps(stale))
    suite.replay(suite.parse_args(["replay", "--out", str(tmp_path), "--reason", "a test"]))
    for library, record in records.items():
        after = json.loads((tmp_path / f"ppo_lunarlander-{library}-seed3.json").read_text())
        assert after["final_evaluation"]["returns"] == pytest.approx(record["final_evaluation"]["returns"], rel=1e-5)
        superseded = after["superseded_final_evaluations"]
        assert [(old["return_mean"], old["reason"]) for old in superseded] == [(0.0, "a test")]
        assert after["evals"] == record["evals"]
    # Replayed again, the readings are as recorded: nothing changes.
    before = {library: (tmp_path / f"ppo_lunarlander-{library}-seed3.json").read_text() for library in records}
    suite.replay(suite.parse_args(["replay", "--out", str(tmp_path), "--reason", "again"]))
    assert before == {library: (tmp_path / f"ppo_lunarlander-{library}-seed3.json").read_text() for library in records}


def test_greedy_evaluation_keeps_the_episodes_our_data_modules_evaluation_keeps(import_benchmark):
    # SB3's and the hand-written loops' evaluations are GreedyEvaluation's, ours' the data module's:
    # the same seeds must give the same episodes. Both keep the first episodes to *start*, each
    # played to its end; GreedyEvaluation kept the first ones to *end* until 2026-11-30, which
    # favours short episodes (here ~10 steps against the 20.5 of sequential play).
    from _helpers import CoinLengthEnv

    from lightning_rl import RLModuleSpec
    from lightning_rl.algorithms.bc import BCModule
    from lightning_rl.data import OnPolicyDataModule

    off_policy = import_benchmark("off_policy")
    env_id = "LightningRLTest/CoinLength-v0"
    import gymnasium as gym

    if env_id not in gym.registry:
        gym.register(env_id, entry_point=CoinLengthEnv)
    envs, episodes, evaluations = 32, 32, 6
    greedy = off_policy.GreedyEvaluation(
        {"env": env_id, "env_kwargs": None, "num_envs": 1, "evaluation_num_episodes": episodes,
         "evaluation_num_envs": envs}, seed=3)  # fmt: skip
    theirs = [greedy.run(lambda obs: np.zeros(len(obs), np.int64)) for _ in range(evaluations)]
    greedy.close()

    data = OnPolicyDataModule(env_id, num_envs=1, evaluation_num_episodes=episodes, evaluation_num_envs=envs, seed=3)
    try:
        runner = data.sampling.eval_runner
        spec = RLModuleSpec(module_class=BCModule, observation_space=runner.observation_space,
                            action_space=runner.action_space, model_config={"fcnet_hiddens": [8]})  # fmt: skip
        module = spec.build()
        ours = [[float(len(episode)) for episode in data.sampling.evaluate(module)] for _ in range(evaluations)]
    finally:
        data.teardown("fit")
    assert ours == theirs  # episode for episode, in the order they ended
    lengths = np.concatenate(theirs)
    assert len(lengths) == envs * evaluations and set(lengths) == {1.0, 40.0}
    assert abs(lengths.mean() - 20.5) < 4, lengths.mean()  # sd of the mean ~1.6


def _resolved(**model_config) -> dict:
    from lightning_rl.algorithms.ppo import PPOModule
    from lightning_rl.core.module_checks import model_config_with_defaults

    return model_config_with_defaults(model_config, PPOModule.model_config_keys)


def test_sb3s_policy_kwargs_are_built_from_the_model_config(import_benchmark):
    pytest.importorskip("stable_baselines3")
    from torch import nn

    sb3_suite = import_benchmark("_sb3_suite")

    zoo = _resolved(pi_fcnet_hiddens=[256, 256], vf_fcnet_hiddens=[64], fcnet_activation="relu", log_std_init=-2,
                    ortho_init=False)  # fmt: skip
    kwargs = sb3_suite.sb3_policy_kwargs(zoo)
    assert kwargs == {
        "net_arch": {"pi": [256, 256], "vf": [64]}, "activation_fn": nn.ReLU, "ortho_init": False, "log_std_init": -2.0,
    }  # fmt: skip
    # SB3's policy of these kwargs has our module's parameters, shape for shape, and its log std.
    import gymnasium as gym
    import torch
    from stable_baselines3.common.policies import ActorCriticPolicy

    from lightning_rl.algorithms.ppo import PPOModule

    obs, actions = gym.spaces.Box(-1, 1, (11,)), gym.spaces.Box(-1, 1, (3,))
    policy, ours = ActorCriticPolicy(obs, actions, lambda _: 1e-3, **kwargs), PPOModule(obs, actions, zoo)
    assert sorted(p.shape for p in policy.parameters()) == sorted(p.shape for p in ours.parameters())
    torch.testing.assert_close(policy.log_std.detach(), ours.log_std.detach())
    defaults = sb3_suite.sb3_policy_kwargs(_resolved())
    assert defaults == {"net_arch": {"pi": [256, 256], "vf": [256, 256]}, "activation_fn": nn.Tanh,
                        "ortho_init": True, "log_std_init": 0.0}  # fmt: skip


def test_sb3_refuses_policy_and_value_networks_of_different_activations(import_benchmark):
    pytest.importorskip("stable_baselines3")
    sb3_suite = import_benchmark("_sb3_suite")
    model = {"vf_clip_param": None, "use_kl_loss": False, "shuffle_batch_per_epoch": True, "entropy_coeff": 0.0,
             "grad_clip": 0.5, "grad_clip_by": "global_norm"}  # fmt: skip
    data = {"env": "Hopper-v5", "wrappers": None, "evaluation_wrappers": None}
    same = _resolved(pi_fcnet_activation="relu", fcnet_activation="relu")
    assert sb3_suite.unsupported_ppo({**model, "model_config": same}, data) is None
    different = _resolved(pi_fcnet_activation="relu")
    assert sb3_suite.unsupported_ppo({**model, "model_config": different}, data) == (
        "policy and value activations 'relu' and 'tanh'"
    )


def test_sb3s_dqn_and_sac_follow_our_learning_rate_schedule_over_the_run(import_benchmark):
    pytest.importorskip("stable_baselines3")
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv

    off_policy = import_benchmark("_sb3_off_policy")
    schedule = [[0, 6.3e-4], [3000, 0.0]]  # linear to 0 over the run, in env steps
    net = {"fcnet_hiddens": [8], "fcnet_activation": "relu"}
    common = {"lr": schedule, "minibatch_size": 4, "tau": 1.0, "gamma": 0.99, "gradient_steps": 1, "n_step": 1,
              "target_network_update_freq": 1, "model_config": net}  # fmt: skip
    data = {"replay_buffer_capacity": 100, "learning_starts": 0, "train_freq": 1, "num_envs": 1,
            "prioritized_replay": False, "env": "CartPole-v1", "wrappers": None, "evaluation_wrappers": None,
            "random_actions_before_learning_starts": True}  # fmt: skip
    dqn_model = {**common, "double_q": False, "td_error_loss_fn": "huber", "epsilon": [[0, 1.0], [1000, 0.1]],
                 "grad_clip": None, "grad_clip_by": "global_norm"}  # fmt: skip
    assert off_policy.unsupported("dqn", dqn_model, data) is None  # a schedule is no longer refused
    agent, _ = off_policy.dqn(dqn_model, data, DummyVecEnv([lambda: gym.make("CartPole-v1")]), 3000, seed=0)
    # SB3 reads the rate at its progress_remaining = 1 - env steps / budget, as ours reads it at env steps.
    assert agent.lr_schedule(1.0) == pytest.approx(6.3e-4)
    assert agent.lr_schedule(0.5) == pytest.approx(3.15e-4)  # 1,500 env steps
    assert agent.lr_schedule(0.0) == 0.0

    sac_model = {**common, "initial_alpha": 1.0, "target_entropy": "auto", "grad_clip": None,
                 **{f"{w}_{k}": None for w in ("actor", "critic", "alpha") for k in ("lr", "grad_clip")}}  # fmt: skip
    box = DummyVecEnv([lambda: gym.make("Pendulum-v1")])
    agent, notes = off_policy.sac(sac_model, {**data, "env": "Pendulum-v1"}, box, 3000, seed=0)
    assert agent.lr_schedule(0.25) == pytest.approx(1.575e-4) and notes == []
