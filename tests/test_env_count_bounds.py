"""Env counts are bounded before anything is built: one error naming the ceiling, and no evaluation
envs beyond the episodes a rank plays.

``--data.init_args.evaluation_num_envs 1000000000`` reached 22 GB in under a minute before the
kernel's OOM killer ended the run; ``num_envs 1e12`` grew ~130 MB/s.
"""

from __future__ import annotations

import pytest

from lightning_rl.core.arguments import MAX_NUM_ENVS
from lightning_rl.data import MultiAgentDataModule, OfflineDataModule, OnPolicyDataModule
from lightning_rl.env import EnvRunner, MultiAgentEnvRunner

CEILING = rf"must be at most MAX_NUM_ENVS = {MAX_NUM_ENVS} \(env copies on one rank; use more ranks for more\)"


@pytest.mark.parametrize(
    "make",
    [
        lambda: EnvRunner("CartPole-v1", num_envs=1_000_000_000),
        lambda: OnPolicyDataModule("CartPole-v1", num_envs=10**12),
        lambda: OnPolicyDataModule("CartPole-v1", evaluation_num_envs=1_000_000_000),
        lambda: OfflineDataModule("any/dataset-v0", evaluation_num_envs=MAX_NUM_ENVS + 1),
        lambda: MultiAgentDataModule("pettingzoo.classic.connect_four_v3", num_envs=MAX_NUM_ENVS + 1),
        lambda: MultiAgentEnvRunner("pettingzoo.classic.connect_four_v3", num_envs=MAX_NUM_ENVS + 1),
    ],
)
def test_an_env_count_past_the_ceiling_is_one_error_before_anything_is_built(make):
    with pytest.raises(ValueError, match=CEILING):
        make()


def test_evaluation_envs_are_capped_at_the_episodes_a_rank_plays():
    data = OnPolicyDataModule("CartPole-v1", num_envs=2, evaluation_num_episodes=3, evaluation_num_envs=64)
    try:
        assert data.sampling.eval_runner.num_envs == 3
    finally:
        data.teardown("fit")


@pytest.mark.parametrize("command", ["evaluate", "record"])
def test_the_commands_refuse_an_env_count_past_the_ceiling_in_one_line(command, capsys):
    from lightning_rl.cli import main

    with pytest.raises(SystemExit) as stopped:
        main([command, "--num_envs", "1000000000", "--ckpt_path", ".", "--dataset_id", "x/y-v0"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"expected an int at most MAX_NUM_ENVS = {MAX_NUM_ENVS}" in error, error
