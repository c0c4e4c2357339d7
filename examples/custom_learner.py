"""Behaviour cloning with a Learner of your own, trained by Lightning's Trainer.

A scripted CartPole expert plays some episodes; a custom Learner (the class below: one
method of loss) clones it with ``Trainer.fit``; the cloned policy then plays on its own.

Run:
    python examples/custom_learner.py            # about a minute on 2 CPU cores
    python examples/custom_learner.py --help     # sizes, seeds, iterations
"""

from __future__ import annotations

import argparse
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from lightning_rl import DEFAULT_MODULE_ID, Columns, Learner, RLModuleSpec
from lightning_rl.algorithms.bc import BCModule


class MyBCLearner(Learner):
    """Behaviour cloning: maximize the log-likelihood of the expert's actions."""

    def required_batch_columns(self, module_id: str) -> list[str]:
        return [Columns.OBS, Columns.ACTIONS]

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        dist_class = self.module[module_id].get_train_action_dist_cls()
        action_dist = dist_class.from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        return -action_dist.logp(batch[Columns.ACTIONS]).mean()


def expert_action(obs: np.ndarray) -> int:
    """Push the cart towards where the pole is falling (a hand-tuned linear rule)."""
    x, x_dot, theta, theta_dot = obs
    return int(theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0)


def collect_expert_data(num_episodes: int, seed: int) -> dict[str, np.ndarray]:
    env = gym.make("CartPole-v1")
    observations, actions = [], []
    for episode in range(num_episodes):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            action = expert_action(obs)
            observations.append(obs)
            actions.append(action)
            obs, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    return {Columns.OBS: np.stack(observations), Columns.ACTIONS: np.array(actions, dtype=np.int64)}


@torch.inference_mode()
def mean_return(learner: Learner, num_episodes: int, seed: int) -> float:
    """Play greedy episodes with the cloned policy (``forward_inference``)."""
    module = learner.module[DEFAULT_MODULE_ID]
    env = gym.make("CartPole-v1")
    returns = []
    for episode in range(num_episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, episode_return = False, 0.0
        while not done:
            out = module.forward_inference({Columns.OBS: torch.as_tensor(obs).unsqueeze(0)})
            dist = module.get_inference_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
            obs, reward, terminated, truncated, _ = env.step(int(dist.deterministic_sample()))
            episode_return += float(reward)
            done = terminated or truncated
        returns.append(episode_return)
    return float(np.mean(returns))


class PrintLoss(Callback):
    """Print the loss every few updates, so you can watch it fall."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_train_batch_end(self, trainer: Trainer, learner: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx % self.every == 0 or batch_idx == trainer.num_training_batches - 1:
            loss = trainer.callback_metrics[f"{DEFAULT_MODULE_ID}/total_loss"].item()
            print(f"update {batch_idx + 1:4d}  loss {loss:.4f}")


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--expert-episodes", type=int, default=20)
    parser.add_argument("--updates", type=int, default=30, help="Trainer steps; each is one epoch over the data")
    parser.add_argument("--minibatch-size", type=int, default=256)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="lightning_logs", help="TensorBoard logs: tensorboard --logdir <this>")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    data = collect_expert_data(args.expert_episodes, seed=args.seed)
    print(f"expert data: {len(data[Columns.ACTIONS])} steps from {args.expert_episodes} episodes")

    env = gym.make("CartPole-v1")
    spec = RLModuleSpec(
        module_class=BCModule,
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config={"fcnet_hiddens": [64, 64]},
    )
    learner = MyBCLearner(module_spec=spec, lr=3e-3, minibatch_size=args.minibatch_size, shuffle_batch_per_epoch=True)
    trainer = Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=TensorBoardLogger(args.log_dir, name="custom_learner"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[PrintLoss(every=5)],
    )
    # One train item per Trainer step: the whole expert data set (one epoch of minibatches).
    trainer.fit(learner, DataLoader([data] * args.updates, batch_size=None))

    final_loss = trainer.callback_metrics[f"{DEFAULT_MODULE_ID}/total_loss"].item()
    cloned_return = mean_return(learner, args.eval_episodes, seed=10_000 + args.seed)
    print(f"final loss {final_loss:.4f} (ln 2 = {np.log(2):.4f}); cloned policy mean return {cloned_return:.1f}")
    print(f"TensorBoard: tensorboard --logdir {trainer.logger.log_dir}")
    return {"final_loss": final_loss, "mean_return": cloned_return, "log_dir": trainer.logger.log_dir}


if __name__ == "__main__":
    main()
