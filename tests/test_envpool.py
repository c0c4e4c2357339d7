"""``vectorize_mode="envpool"``: EnvPool's C++ pool behind the runner, with gymnasium's SAME_STEP autoreset.

No env has the same *initial states* in EnvPool and gymnasium for the same seed (EnvPool
draws them with C++ generators), so "the same episodes as gymnasium" is proven in parts,
each test saying which:

- the dynamics, rewards and episode ends of every episode the runner returns are gymnasium's
  (CartPole replayed in gymnasium from each episode's first observation);
- the runner's episodes are exactly the episodes EnvPool itself produces, stepped by hand with
  its raw API and the same deterministic policy (the autoreset conversion loses, shifts or
  mixes up nothing);
- the conversion gives step for step what gymnasium's ``SyncVectorEnv`` in SAME_STEP mode gives,
  on a fake pool with EnvPool's API whose envs are deterministic (and one that returns its rows
  out of order);
- what EnvPool cannot do is refused by name.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from lightning_rl import RLModuleSpec
from lightning_rl.algorithms.bc import BCModule
from lightning_rl.core.columns import Columns
from lightning_rl.data import OnPolicyDataModule
from lightning_rl.env import EnvRunner, SingleAgentEpisode
from lightning_rl.env import envpool_vector_env
from lightning_rl.env.envpool_vector_env import ENVPOOL_EXTRA, EnvPoolVectorEnv

REPO = Path(__file__).resolve().parents[1]


class ObsHashModule(BCModule):
    """Acts by a fixed, pseudo-random function of the observation, so a hand-written loop can act the same."""

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        out = super()._forward(batch)
        obs = batch[Columns.OBS]
        return {**out, Columns.ACTIONS: obs_hash_actions(obs)}


def obs_hash_actions(obs: torch.Tensor) -> torch.Tensor:
    # The 4th decimal of the cart position and pole velocity: changes every step, in both directions.
    return (torch.floor(obs[:, 0] * 1e4) + torch.floor(obs[:, 3] * 1e4)).remainder(2).to(torch.int64)


def envpool_runner(num_envs: int = 3, seed: int = 0, max_episode_steps: int | None = 16, **kwargs: Any) -> EnvRunner:
    env_kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    return EnvRunner(
        "CartPole-v1", vectorize_mode="envpool", num_envs=num_envs, seed=seed, env_kwargs=env_kwargs, **kwargs
    )


def module_for(runner: EnvRunner, module_class: type[BCModule] = ObsHashModule) -> BCModule:
    return RLModuleSpec(module_class, runner.observation_space, runner.action_space, {"fcnet_hiddens": [8]}).build()


def whole_episodes(rounds: list[list[SingleAgentEpisode]]) -> list[SingleAgentEpisode]:
    """The episodes that started and ended within these calls, their chunks joined, in the order they ended."""
    joined: dict[str, SingleAgentEpisode] = {}
    done: list[str] = []
    for episodes in rounds:
        for episode in episodes:
            if episode.id_ in joined:
                joined[episode.id_].concat_episode(episode)
            else:
                joined[episode.id_] = episode[:]
            if episode.is_done:
                done.append(episode.id_)
    return [joined[id_] for id_ in done if joined[id_].t_started == 0]


# ----------------------------------------------------------------------------------------
# The episodes are gymnasium's CartPole episodes
# ----------------------------------------------------------------------------------------


def test_every_episode_replays_in_gymnasium_from_its_first_observation() -> None:
    """Proves: each episode the envpool runner returns (the first, and those that start at a
    same-step reset) has gymnasium CartPole's observations, rewards, and terminated/truncated
    flags at exactly the step gymnasium has them, replayed from its first observation with its
    actions. So the reset observation returned in the step an episode ended is the next
    episode's true first state, the last observation is the true final one, and truncation comes
    at ``max_episode_steps``, with ``terminated`` kept when the pole falls on that very step
    (EnvPool's own API reports only ``truncated`` then; this seed and limit have such episodes).
    Not proven: the initial states, which EnvPool draws itself."""
    with envpool_runner(num_envs=3, max_episode_steps=16, rollout_fragment_length=40) as runner:
        module = module_for(runner)
        episodes = whole_episodes([runner.sample(module), runner.sample(module)])
    assert len(episodes) >= 10
    assert any(episode.is_terminated for episode in episodes)
    assert any(episode.is_truncated for episode in episodes)
    assert any(episode.is_terminated and episode.is_truncated for episode in episodes)
    gym_env = gym.make("CartPole-v1", max_episode_steps=16)
    for episode in episodes:
        gym_env.reset(seed=0)
        # The first observation is float32: the replay starts within 1e-8 of EnvPool's state.
        gym_env.unwrapped.state = episode.observations[0].astype(np.float64)
        for t, action in enumerate(episode.actions):
            obs, reward, terminated, truncated, _ = gym_env.step(int(action))
            np.testing.assert_allclose(episode.observations[t + 1], obs, atol=1e-5, err_msg=f"step {t}")
            assert episode.rewards[t] == reward
            last = t == len(episode) - 1
            expected_ends = (episode.is_terminated, episode.is_truncated) if last else (False, False)
            assert (terminated, truncated) == expected_ends, f"step {t}"


# ----------------------------------------------------------------------------------------
# The episodes are EnvPool's own, unchanged by the autoreset conversion
# ----------------------------------------------------------------------------------------


def raw_envpool_episodes(num_envs: int, seed: int, vector_steps: int) -> list[list[dict]]:
    """EnvPool stepped by hand with its own (next-step) autoreset: each env's episodes, in order.

    The step after an episode ended resets that env (its action ignored) and returns the
    next episode's first observation; ``elapsed_step`` is 0 then.
    """
    import envpool

    pool = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=num_envs, seed=seed)
    obs, _ = pool.reset()
    per_env: list[list[dict]] = [[{"obs": [obs[i]], "actions": [], "rewards": []}] for i in range(num_envs)]
    for _ in range(vector_steps):
        actions = obs_hash_actions(torch.from_numpy(obs)).numpy()
        obs, rewards, terminateds, truncateds, infos = pool.step(actions)
        for i in range(num_envs):
            episode = per_env[i][-1]
            if infos["elapsed_step"][i] == 0:  # the reset step of a next-step autoreset
                per_env[i].append({"obs": [obs[i]], "actions": [], "rewards": []})
                continue
            episode["obs"].append(obs[i])
            episode["actions"].append(actions[i])
            episode["rewards"].append(rewards[i])
            if terminateds[i] or truncateds[i]:
                episode["ends"] = (bool(terminateds[i]), bool(truncateds[i]))
    return [[episode for episode in episodes if "ends" in episode] for episodes in per_env]


def test_the_runner_returns_exactly_the_episodes_envpool_steps_by_hand() -> None:
    """Proves: with the same seed and the same deterministic policy, the envpool runner's
    episodes are, bit for bit, the episodes of EnvPool's raw API stepped by hand, env by env and
    in order: env ``i`` seeded ``seed + i``, no episode lost, shifted or given another env's
    reset, final observations as EnvPool returns them. (CartPole's 500-step limit is not reached
    here: truncation is the other tests' part, as the adapter keeps the time limit itself.)"""
    num_envs, seed = 3, 5
    with envpool_runner(num_envs=num_envs, seed=seed, max_episode_steps=None, rollout_fragment_length=60) as runner:
        module = module_for(runner)
        episodes = whole_episodes([runner.sample(module), runner.sample(module)])
    raw = raw_envpool_episodes(num_envs, seed, vector_steps=300)
    where = {raw_episode["obs"][0].tobytes(): (i, k) for i, env in enumerate(raw) for k, raw_episode in enumerate(env)}
    seen: dict[int, list[int]] = {i: [] for i in range(num_envs)}
    for episode in episodes:
        i, k = where[episode.observations[0].tobytes()]
        seen[i].append(k)
        expected = raw[i][k]
        np.testing.assert_array_equal(episode.observations, np.stack(expected["obs"]))
        np.testing.assert_array_equal(episode.actions, np.array(expected["actions"]))
        np.testing.assert_array_equal(episode.rewards, np.array(expected["rewards"]))
        assert (episode.is_terminated, episode.is_truncated) == expected["ends"]
    for i, indices in seen.items():
        assert sorted(indices) == list(range(len(indices))) and len(indices) >= 3, (i, indices)


# ----------------------------------------------------------------------------------------
# The SAME_STEP conversion, on a fake deterministic pool beside gymnasium's SyncVectorEnv
# ----------------------------------------------------------------------------------------

FAKE_TIME_LIMIT = 6


def episode_end(seed: int, episode: int) -> int:
    """The step after which episode ``episode`` of the env seeded ``seed`` terminates (2..9)."""
    return 2 + (3 * episode + seed) % 8


class CountingEnv(gym.Env):
    """Observations ``[seed, episode, t]``; terminates at ``episode_end``; rewards ``t``; infos ``{"t": t}``."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.seed_ = self.episode = -1
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self.seed_ = seed
        self.episode += 1
        self.t = 0
        return np.array([self.seed_, self.episode, 0], np.float32), {"t": 0}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert action in (0, 1)
        self.t += 1
        obs = np.array([self.seed_, self.episode, self.t], np.float32)
        return obs, float(self.t), self.t >= episode_end(self.seed_, self.episode), False, {"t": self.t}


class FakePool:
    """The CountingEnvs behind EnvPool's API: NEXT_STEP autoreset, ``env_id`` rows, bookkeeping infos.

    Its time limit is EnvPool's too: a step that both terminates and reaches
    ``max_episode_steps`` is reported truncated only (``terminated = done & ~truncated``).

    With ``shuffle``, every call returns its rows in reversed order (EnvPool's ``info["env_id"]``
    says whose they are). A step sent to an env whose episode ended is EnvPool's autoreset: the
    action is ignored and the env resets (counted in ``ignored_actions``, which must stay 0).
    """

    def __init__(self, env_seeds: list[int], max_episode_steps: int, shuffle: bool = False) -> None:
        self.envs = [CountingEnv() for _ in env_seeds]
        self.env_seeds = env_seeds
        self.max_episode_steps = max_episode_steps
        self.shuffle = shuffle
        self.done = [False] * len(env_seeds)
        self.reset_before = [False] * len(env_seeds)
        self.ignored_actions = 0
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.closed = False

    def _reset_one(self, i: int) -> tuple[np.ndarray, int]:
        seed = None if self.reset_before[i] else self.env_seeds[i]
        self.reset_before[i] = True
        self.done[i] = False
        obs, info = self.envs[i].reset(seed=seed)
        return obs, info["t"]

    def _rows(self, env_id: np.ndarray, rows: list[tuple]) -> tuple:
        order = list(range(len(env_id)))[:: -1 if self.shuffle else 1]
        ids = np.asarray(env_id, np.int32)[order]
        columns = [np.array([rows[k][c] for k in order]) for c in range(len(rows[0]))]
        return ids, columns

    def reset(self, env_id: np.ndarray) -> tuple[np.ndarray, dict]:
        ids, (obs, t) = self._rows(env_id, [self._reset_one(int(i)) for i in env_id])
        return obs, {"env_id": ids, "players": {"env_id": ids}, "elapsed_step": t, "t": t}

    def step(self, actions: np.ndarray, env_id: np.ndarray) -> tuple:
        rows = []
        for action, i in zip(actions, env_id):
            i = int(i)
            if self.done[i]:
                self.ignored_actions += 1
                obs, t = self._reset_one(i)
                rows.append((obs, 0.0, False, False, t))
                continue
            obs, reward, terminated, _, info = self.envs[i].step(int(action))
            truncated = info["t"] >= self.max_episode_steps
            self.done[i] = terminated or truncated
            rows.append((obs, reward, terminated and not truncated, truncated, info["t"]))
        ids, (obs, rewards, terminateds, truncateds, t) = self._rows(env_id, rows)
        infos = {"env_id": ids, "players": {"env_id": ids}, "elapsed_step": t, "t": t}
        return obs, rewards.astype(np.float32), terminateds, truncateds, infos

    def close(self) -> None:
        self.closed = True


def fake_vector_env(num_envs: int, seed: int, shuffle: bool = False) -> tuple[EnvPoolVectorEnv, list[FakePool]]:
    pools: list[FakePool] = []

    def make_pool(env_id: str, n: int, env_seeds: list[int], env_kwargs: dict) -> FakePool:
        pools.append(FakePool(env_seeds, env_kwargs["max_episode_steps"], shuffle))
        return pools[-1]

    env = EnvPoolVectorEnv("Counting-v0", num_envs, seed=seed, make_pool=make_pool, time_limit=FAKE_TIME_LIMIT)
    return env, pools


def gymnasium_vector_env(num_envs: int) -> gym.vector.VectorEnv:
    return gym.vector.SyncVectorEnv(
        [lambda: gym.wrappers.TimeLimit(CountingEnv(), FAKE_TIME_LIMIT)] * num_envs,
        autoreset_mode=AutoresetMode.SAME_STEP,
    )


def assert_same_step(ours: tuple, theirs: tuple, where: str) -> None:
    obs, rewards, terminateds, truncateds, infos = ours
    g_obs, g_rewards, g_terminateds, g_truncateds, g_infos = theirs
    np.testing.assert_array_equal(obs, g_obs, err_msg=where)
    np.testing.assert_array_equal(rewards, g_rewards, err_msg=where)
    np.testing.assert_array_equal(terminateds, g_terminateds, err_msg=where)
    np.testing.assert_array_equal(truncateds, g_truncateds, err_msg=where)
    np.testing.assert_array_equal(infos["t"], g_infos["t"], err_msg=where)
    done = g_terminateds | g_truncateds
    assert ("final_obs" in infos) == done.any(), where
    if done.any():
        np.testing.assert_array_equal(infos["_final_obs"], g_infos["_final_obs"], err_msg=where)
        for i in np.flatnonzero(done):
            np.testing.assert_array_equal(infos["final_obs"][i], g_infos["final_obs"][i], err_msg=where)
            assert infos["final_info"]["t"][i] == g_infos["final_info"]["t"][i], where
        np.testing.assert_array_equal(infos["_final_info"], g_infos["_final_info"], err_msg=where)


@pytest.mark.parametrize("shuffle", [False, True], ids=["in_order", "rows_out_of_order"])
def test_the_conversion_steps_as_gymnasiums_same_step_vector_env(shuffle: bool) -> None:
    """Proves, on a fake pool with EnvPool's API and deterministic envs: the adapter's steps equal
    gymnasium's ``SyncVectorEnv`` in SAME_STEP mode over the same envs, step for step (reset
    observations in the step an episode ended, ``final_obs``/``final_info`` for exactly the envs
    that ended, terminations and truncations at the boundary, both when an episode terminates on
    its last allowed step), env ``i`` seeded ``seed + i``, and no action is ever sent to an env
    that ended (EnvPool would ignore it)."""
    num_envs, seed = 4, 10
    ours, pools = fake_vector_env(num_envs, seed, shuffle)
    theirs = gymnasium_vector_env(num_envs)
    obs, infos = ours.reset(seed=seed)
    g_obs, g_infos = theirs.reset(seed=seed)
    np.testing.assert_array_equal(obs, g_obs)
    np.testing.assert_array_equal(obs[:, 0], seed + np.arange(num_envs))
    assert "env_id" not in infos and "elapsed_step" not in infos  # EnvPool's bookkeeping is left out
    assert len(pools) == 1, "the first reset with the pool's own seed makes no second pool"
    assert pools[0].max_episode_steps == FAKE_TIME_LIMIT + 1  # the adapter keeps the time limit
    rng = np.random.default_rng(0)
    ends = {"terminated": 0, "truncated": 0, "both": 0}
    for t in range(40):
        actions = rng.integers(0, 2, num_envs)
        ours_step, theirs_step = ours.step(actions), theirs.step(actions)
        assert_same_step(ours_step, theirs_step, f"step {t}")
        ends["terminated"] += int((theirs_step[2] & ~theirs_step[3]).sum())
        ends["truncated"] += int((theirs_step[3] & ~theirs_step[2]).sum())
        ends["both"] += int((theirs_step[2] & theirs_step[3]).sum())
    assert min(ends.values()) >= 3, ends
    assert pools[0].ignored_actions == 0
    assert ours.single_observation_space == theirs.single_observation_space
    assert ours.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP


def test_a_reset_with_a_new_seed_makes_a_pool_seeded_env_by_env_and_a_reset_mask_resets_only_those() -> None:
    """Proves: EnvPool seeds only when a pool is made, so a full reset with another seed makes a
    new pool whose env ``i`` has ``seed + i`` (as gymnasium's reset(seed) does), a reset without
    a seed goes on, and ``options["reset_mask"]`` (the NaN handling's partial reset) resets only
    the masked envs and returns the others' last observations."""
    env, pools = fake_vector_env(3, seed=7)
    env.reset(seed=7)
    assert len(pools) == 1 and pools[0].env_seeds == [7, 8, 9]
    obs, _ = env.reset(seed=100)
    assert len(pools) == 2 and pools[1].env_seeds == [100, 101, 102] and pools[0].closed
    np.testing.assert_array_equal(obs[:, :2], [[100, 0], [101, 0], [102, 0]])
    obs, _ = env.reset()  # no seed: each env's next episode
    np.testing.assert_array_equal(obs[:, 1], [1, 1, 1])
    env.step(np.zeros(3, np.int64))
    obs, infos = env.reset(options={"reset_mask": np.array([False, True, False])})
    np.testing.assert_array_equal(obs, [[100, 1, 1], [101, 2, 0], [102, 1, 1]])
    np.testing.assert_array_equal(infos["_t"], [False, True, False])
    env.reset(seed=2**31 + 3)  # EnvPool's seeds are int32: taken modulo 2**31 - 1
    assert pools[-1].env_seeds == [4, 5, 6]
    env.close()
    assert pools[-1].closed


def test_the_adapter_resets_at_the_boundary_as_envpool_would_one_step_later() -> None:
    """Proves, on real EnvPool: at a truncation, the adapter returns EnvPool's terminal observation
    as ``final_obs`` and, in the same step, the reset observation EnvPool's own autoreset returns
    one step later; the flags are EnvPool's."""
    import envpool

    raw = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=2, seed=3, max_episode_steps=4)
    ours = EnvPoolVectorEnv("CartPole-v1", 2, seed=3, time_limit=4)
    np.testing.assert_array_equal(ours.reset(seed=3)[0], raw.reset()[0])
    actions = np.array([0, 1])
    for _ in range(3):
        obs, _, _, _, infos = ours.step(actions)
        np.testing.assert_array_equal(obs, raw.step(actions)[0])
        assert infos == {}  # CartPole returns no infos of its own, as in gymnasium
    obs, rewards, terminateds, truncateds, infos = ours.step(actions)
    raw_obs, raw_rewards, raw_terminateds, raw_truncateds, _ = raw.step(actions)
    np.testing.assert_array_equal(truncateds, [True, True])
    np.testing.assert_array_equal(terminateds, raw_terminateds)
    np.testing.assert_array_equal(rewards, raw_rewards)
    for i in range(2):
        np.testing.assert_array_equal(infos["final_obs"][i], raw_obs[i])
    reset_obs, _, _, _, reset_infos = raw.step(actions)  # EnvPool's own autoreset step
    assert (reset_infos["elapsed_step"] == 0).all()
    np.testing.assert_array_equal(obs, reset_obs)
    ours.close()


def test_lunar_lander_observations_below_float_tiny_are_inside_the_space() -> None:
    """Proves: EnvPool's LunarLander spec has ``finfo(float32).tiny`` as its lower bound (where
    it means the lowest value); the adapter reads it as ``-inf``, so negative observations are in
    the space the module is built for."""
    env = EnvPoolVectorEnv("LunarLander-v3", 1, seed=0)
    assert env.single_observation_space.low.min() == -np.inf
    obs, _ = env.reset(seed=0)
    assert (obs < 0).any() and env.observation_space.contains(obs)
    env.close()


# ----------------------------------------------------------------------------------------
# Training through the data module and the CLI
# ----------------------------------------------------------------------------------------


def test_ppo_fits_cartpole_with_vectorize_mode_envpool_from_the_cli(tmp_path: Path) -> None:
    """Proves: ``vectorize_mode: envpool`` parses from the command line (a ``Literal`` choice),
    and a short PPO fit with evaluation runs on EnvPool envs end to end."""
    from lightning_rl.cli import LightningRLCLI

    cli = LightningRLCLI(
        args=[
            "fit", "--config", str(REPO / "examples" / "ppo_cartpole.yaml"),
            "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
            "--data.init_args.vectorize_mode", "envpool",
            "--data.init_args.max_env_steps", "512", "--data.init_args.rollouts_per_epoch", "1",
            "--data.init_args.evaluation_num_episodes", "2", "--model.init_args.num_epochs", "1",
        ]
    )  # fmt: skip
    data = cli.datamodule
    assert data.hparams.vectorize_mode == "envpool"
    assert isinstance(data.sampling.train_runner.env, EnvPoolVectorEnv)
    assert data.num_env_steps_sampled_lifetime == 512
    assert cli.trainer.callback_metrics["eval/num_episodes"] == 2
    assert cli.trainer.callback_metrics["eval/episode_return_mean"] >= 8


# ----------------------------------------------------------------------------------------
# Clear errors
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"env": "CartPol-v1"}, r"EnvPool has no env 'CartPol-v1'; did you mean \['CartPole-v1'"),
        ({"env": "ale_py:ALE/Pong-v5"}, r"EnvPool has no env .*use vectorize_mode='sync' or 'async'"),
        ({"env": lambda: gym.make("CartPole-v1")}, r"by EnvPool id .*not from a callable"),
        ({"wrappers": ["gymnasium.wrappers.NormalizeObservation"]}, r"cannot apply wrappers \(1 given\)"),
        (
            {"env_kwargs": {"render_mode": "rgb_array"}},
            r"env_kwargs \['render_mode'\] are not options .*max_episode_steps",
        ),
        ({"record_video": True}, r"cannot record videos"),
        ({"restart_failed_sub_environments": True}, r"cannot restart one failed env"),
        ({"vectorize_mode": "threads"}, r"vectorize_mode must be one of \('sync', 'async', 'envpool'\)"),
    ],
)
def test_what_envpool_cannot_do_is_refused_by_name(kwargs: dict[str, Any], match: str) -> None:
    options = {"env": "CartPole-v1", "vectorize_mode": "envpool", **kwargs}
    with pytest.raises(ValueError, match=match):
        EnvRunner(options.pop("env"), **options)


def test_the_data_module_refuses_at_construction() -> None:
    with pytest.raises(ValueError, match="cannot record videos"):
        OnPolicyDataModule("CartPole-v1", vectorize_mode="envpool", evaluation_video=1)
    with pytest.raises(ValueError, match="cannot apply wrappers"):
        OnPolicyDataModule(
            "CartPole-v1", vectorize_mode="envpool", evaluation_wrappers=["gymnasium.wrappers.ClipReward"]
        )
    with pytest.raises(ValueError, match="EnvPool has no env"):
        OnPolicyDataModule("NoSuchEnv-v0", vectorize_mode="envpool")


def test_without_envpool_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "envpool", None)  # `import envpool` raises ImportError
    envpool_vector_env.envpool_env_ids.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"vectorize_mode='envpool' needs the envpool package: pip install "
                           r"\"lightning-rl\[envpool\]\""):
            OnPolicyDataModule("CartPole-v1", vectorize_mode="envpool")
    finally:
        envpool_vector_env.envpool_env_ids.cache_clear()
    assert ENVPOOL_EXTRA == 'pip install "lightning-rl[envpool]"'
