"""Check our PPO data path (episodes -> GAE connector -> update) against SB3 on SB3's own rollout.

``ppo_update_vs_sb3.py`` feeds SB3's *advantages and returns* to ``update_from_batch``, so it
checks the loss and optimizer only. This script checks what comes before them: SB3 collects
rollouts of CartPole-v1 (8 envs x 32 steps, time limit 20 so that episodes are truncated
inside a rollout, terminated ones too, and chunks run across rollout ends); the steps of the
last rollout are cut into our ``SingleAgentEpisode`` chunks exactly as our EnvRunner cuts
them (a truncated episode ends with its true final observation, a chunk cut by the rollout
end with the next observation, a terminated one is not bootstrapped), with the env's own
rewards (SB3 adds ``gamma * V(final_obs)`` to a truncated step's reward in its buffer; we
bootstrap in GAE instead). Our ``PPOLearner`` gets SB3's weights and runs its learner
connector on those episodes; the script prints, column by column, the largest difference
from SB3's buffer (values, advantages, value targets, log-probs), then updates from the
episodes (``update_from_episodes``, the path ``Trainer.fit`` takes) beside SB3's ``train()``
and prints the weight differences. Everything should be float noise (about 1e-6 or less).

Needs ``pip install -e ".[bench]"``. Run: ``python benchmarks/ppo_gae_vs_sb3.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from lightning_rl import Columns
from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.env.episode import SingleAgentEpisode

# A sibling: this directory is on sys.path when a benchmark runs as a script.
from ppo_update_vs_sb3 import cartpole_spec, copy_sb3_weights, print_weight_differences

NUM_ENVS, NUM_STEPS, TIME_LIMIT, GAMMA, GAE_LAMBDA = 8, 32, 20, 0.98, 0.8


class RecordSteps(BaseCallback):
    """Keeps what SB3's rollout buffer loses: each step's env rewards, ends and final observations."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[dict[str, Any]] = []

    def _on_rollout_start(self) -> None:
        self.steps = []

    def _on_step(self) -> bool:
        # Called right after env.step, before SB3 adds the time-limit bootstrap to the rewards
        # (in place): copy them now.
        infos, dones = self.locals["infos"], self.locals["dones"]
        self.steps.append(
            {
                "rewards": np.array(self.locals["rewards"], dtype=np.float32),
                "dones": np.array(dones, dtype=bool),
                "truncated": np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos]),
                "final_obs": [info.get("terminal_observation") for info in infos],
            }
        )
        return True


def episodes_from_sb3_rollout(
    model: PPO, steps: list[dict[str, Any]]
) -> tuple[list[SingleAgentEpisode], list[tuple[int, int]]]:
    """Cut SB3's last rollout into our episode chunks, and each of our rows' (step, env) in SB3's buffer.

    The order is our EnvRunner's: completed episodes in the order they ended (by step, then
    env), then each env's running chunk.
    """
    buffer = model.rollout_buffer
    obs, actions, logp = buffer.observations, buffer.actions[..., 0].astype(np.int64), buffer.log_probs
    rewards = np.stack([step["rewards"] for step in steps])
    dones = np.stack([step["dones"] for step in steps])
    episodes: list[SingleAgentEpisode] = []
    rows: list[tuple[int, int]] = []
    start = [0] * NUM_ENVS
    for t, i in zip(*np.nonzero(dones)):
        t, i = int(t), int(i)
        s = start[i]
        truncated = bool(steps[t]["truncated"][i])
        episodes.append(
            SingleAgentEpisode(
                observations=np.concatenate([obs[s : t + 1, i], steps[t]["final_obs"][i][None].astype(np.float32)]),
                actions=actions[s : t + 1, i],
                rewards=rewards[s : t + 1, i],
                terminated=not truncated,
                truncated=truncated,
                extra_model_outputs={Columns.ACTION_LOGP: logp[s : t + 1, i]},
            )
        )
        rows += [(k, i) for k in range(s, t + 1)]
        start[i] = t + 1
    for i in range(NUM_ENVS):
        s = start[i]
        if s == NUM_STEPS:
            continue
        episodes.append(
            SingleAgentEpisode(
                observations=np.concatenate([obs[s:, i], model._last_obs[i][None].astype(np.float32)]),
                actions=actions[s:, i],
                rewards=rewards[s:, i],
                extra_model_outputs={Columns.ACTION_LOGP: logp[s:, i]},
            )
        )
        rows += [(k, i) for k in range(s, NUM_STEPS)]
    return episodes, rows


def main() -> None:
    torch.set_num_threads(1)
    env = make_vec_env("CartPole-v1", n_envs=NUM_ENVS, seed=3, env_kwargs={"max_episode_steps": TIME_LIMIT})
    model = PPO(
        "MlpPolicy", env, n_steps=NUM_STEPS, batch_size=256, n_epochs=20, gamma=GAMMA, gae_lambda=GAE_LAMBDA,
        learning_rate=lambda p: 1e-3 * p, clip_range=lambda p: 0.2 * p, ent_coef=0.0, device="cpu", seed=3,
    )  # fmt: skip
    recorder = RecordSteps()
    total_timesteps, callback = model._setup_learn(100_000, recorder)
    callback.on_training_start(locals(), globals())
    # Two rollouts with the same weights: the second starts mid-episode in every env.
    for _ in range(2):
        model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=NUM_STEPS)
    model._update_current_progress_remaining(model.num_timesteps, total_timesteps)
    progress = model._current_progress_remaining

    # The schedules of examples/ppo_cartpole.yaml, at SB3's timestep.
    learner = PPOLearner(
        cartpole_spec(), lr=[[0, 1e-3], [100_000, 0.0]], clip_param=[[0, 0.2], [100_000, 0.0]], gamma=GAMMA,
        gae_lambda=GAE_LAMBDA, num_epochs=20, minibatch_size=256, grad_clip=0.5, vf_loss_coeff=0.5,
        vf_clip_param=None, entropy_coeff=0.0,
    )  # fmt: skip
    learner.build()
    pairs = copy_sb3_weights(learner, model)

    episodes, rows = episodes_from_sb3_rollout(model, recorder.steps)
    buffer = model.rollout_buffer
    steps_idx, envs_idx = (np.array(index) for index in zip(*rows))
    print(
        f"rollout: {len(episodes)} chunks, {sum(e.is_terminated for e in episodes)} terminated, "
        f"{sum(e.is_truncated for e in episodes)} truncated, {len(rows)} rows"
    )
    batch = learner.episodes_to_train_batch(episodes)["default_policy"]
    reference = {
        Columns.VF_PREDS: buffer.values,
        Columns.ADVANTAGES: buffer.advantages,
        Columns.VALUE_TARGETS: buffer.returns,
        Columns.ACTION_LOGP: buffer.log_probs,
    }
    print(f"{'column':14s} {'max |ours - sb3|':>18s} {'max |sb3|':>12s}")
    for column, theirs in reference.items():
        theirs = torch.as_tensor(theirs[steps_idx, envs_idx])
        if column == Columns.ADVANTAGES:
            # Our GAE piece leaves them standardized over the batch, as RLlib's does (SB3 standardizes
            # per minibatch only; PPO's per-minibatch standardization then gives both the same).
            theirs = (theirs - theirs.mean()) / theirs.std(unbiased=False).clamp_min(1e-4)
        diff = float((batch[column].double() - theirs.double()).abs().max())
        print(f"{column:14s} {diff:18.2e} {float(theirs.abs().max()):12.2e}")

    timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: model.num_timesteps}
    learner.update_from_episodes(episodes, timesteps=timesteps, num_epochs=20, minibatch_size=256)
    before = {name: theirs.weight.detach().clone() for name, (_, theirs) in pairs.items()}
    model.train()
    print(f"one update at SB3's progress {progress:.4f} (timestep {model.num_timesteps})")
    print_weight_differences(pairs, before)


if __name__ == "__main__":
    main()
