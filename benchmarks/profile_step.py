"""Where one gradient step's time goes: ours, part by part, beside a hand-written loop.

What it measures, per gradient step, in milliseconds (1 torch thread by default):

  dqn  one off-policy gradient step of ``examples/dqn_cartpole.yaml`` (CartPole-v1, [256, 256]
       ReLU Q network, minibatch 64, double Q, 3-step returns, Huber loss, global-norm
       clipping, Adam), taken by our ``DQNLearner`` inside a real ``Trainer.fit`` of an
       ``OffPolicyDataModule``, beside the gradient step of ``benchmarks/handwritten_dqn.py``
       (same network sizes, numpy replay with n-step returns);
  ppo  one on-policy minibatch step of ``examples/ppo_cartpole.yaml`` (8 x 32 env steps per
       rollout, 20 epochs of one 256-row minibatch, separate [64, 64] tanh policy and value
       networks, global-norm clipping, Adam), taken by our ``PPOLearner`` inside a real
       ``Trainer.fit`` of an ``OnPolicyDataModule``, beside the minibatch step of
       ``benchmarks/handwritten_ppo.py`` (same sizes, same loss terms).

Our parts are timed on the real code path: the Learner's hooks (``compute_losses``,
``compute_gradients``, ``postprocess_gradients``, ``apply_gradients``, ...), the replay
buffer's ``sample``, ``torch.autograd.backward`` and the torch optimizer's ``step`` are
wrapped by timers that count each part's *own* time (a part nested in another is taken out of
its parent's), so the rows add up to the whole step, and "update glue" is what is left of
it: the update loop, the Learner's bookkeeping between the hooks. Lightning's work around
``manual_backward`` and the optimizer step (its hooks, strategy and precision plugin) shows
as the "dispatch" rows: the backward hook's and the optimizer hook's own time outside
autograd and the torch optimizer. The hand-written step is timed inline, part by part.

Both run in one process, interleaved train item by train item (the hand-written loop takes
its steps for an item from ``on_train_batch_start``), so a busy machine slows both alike.
The first ``--warmup`` items are not counted. Per-item costs that are not per gradient step
(Lightning's loop around ``training_step``, logging the results with ``self.log``, reducing
the metrics) are printed below the table, per item.

Run::

    python benchmarks/profile_step.py                      # dqn and ppo, 12 items each
    python benchmarks/profile_step.py --algo dqn --items 30
    python benchmarks/profile_step.py --device cuda         # both on the GPU

``--device`` (``cpu``, the default, or ``cuda``): ours trains on a Trainer with that
accelerator (``"gpu"`` or ``"cpu"``, one device), the hand-written step's networks and
minibatches are on that device. On CUDA every timer waits for the device at the edges of
its part (``torch.cuda.synchronize``), so each part's time is its own kernels' and not the
next part's wait; the waits themselves cost a little and are counted. ``--device cuda``
exits with one line where CUDA is absent.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import logging
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import lightning
import numpy as np
import torch
import yaml
from lightning_rl.algorithms.dqn import DQNLearner
from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.data import OffPolicyDataModule, OnPolicyDataModule
from torch import nn
from torch.nn import functional as F

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from _children import add_device_argument, check_device
from _handwritten_common import ReplayBuffer, mlp
from handwritten_ppo import Agent

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class PartTimer:
    """Own time per named part: a part's time minus the time of the parts called inside it."""

    def __init__(self, device: torch.device) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.recording = False
        self._stack: list[list[float]] = []  # per open part: [its start, its children's time]
        self._sync = device.type == "cuda"  # wait for the part's kernels at its edges

    def wrap(self, owner: Any, attribute: str, part: str) -> None:
        """Replace ``owner.attribute`` (a callable) by a timed one, on this instance only."""
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._sync:
                torch.cuda.synchronize()
            frame = [time.perf_counter(), 0.0]
            self._stack.append(frame)
            try:
                return original(*args, **kwargs)
            finally:
                if self._sync:
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - frame[0]
                self._stack.pop()
                if self._stack:
                    self._stack[-1][1] += elapsed
                if self.recording:
                    self.seconds[part] += elapsed - frame[1]

        object.__setattr__(owner, attribute, timed) if isinstance(owner, nn.Module) else setattr(
            owner, attribute, timed
        )


class Inline:
    """Times the hand-written step's parts one after the other: ``mark(part)`` ends the part that ran since the last mark."""

    def __init__(self, device: torch.device) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.recording = False
        self._sync = device.type == "cuda"
        self._last = time.perf_counter()

    def start(self) -> None:
        if self._sync:
            torch.cuda.synchronize()
        self._last = time.perf_counter()

    def mark(self, part: str) -> None:
        if self._sync:
            torch.cuda.synchronize()
        now = time.perf_counter()
        if self.recording:
            self.seconds[part] += now - self._last
        self._last = now


def read_config(name: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The model's and data module's init arguments, and the trainer settings, of an example config."""
    config = yaml.safe_load((EXAMPLES / name).read_text())
    return dict(config["model"]["init_args"]), dict(config["data"]["init_args"]), dict(config["trainer"])


class Interleave(lightning.Callback):
    """Installs the timers once the Learner is built, runs the hand-written steps of each item, counts items."""

    def __init__(self, ours: PartTimer, hand: Inline, hand_item: Callable[[], int], warmup: int) -> None:
        self.ours, self.hand, self.hand_item, self.warmup = ours, hand, hand_item, warmup
        self.items = self.hand_steps = 0

    def on_train_start(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        install_learner_timers(self.ours, pl_module)

    def install_late(self, learner: Any, item: Any) -> None:
        """Time the replay buffer's sampling: the data module makes its buffer with the first item."""
        if item.data.source == "replay":
            self.ours.wrap(item.data.replay, "sample", "replay sample")

    def on_train_batch_start(self, trainer: lightning.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch.data.source is None:  # before learning starts: no gradient step in either
            return
        if self.items == 0:
            self.install_late(pl_module, batch)
        recording = self.items >= self.warmup
        # Ours stops counting while the hand-written steps run: both call torch.autograd.backward.
        self.ours.recording, self.hand.recording = False, recording
        steps = self.hand_item()
        self.ours.recording, self.hand.recording = recording, False
        if recording:
            self.hand_steps += steps
        self.items += 1


def install_learner_timers(timer: PartTimer, learner: Any) -> None:
    """Wrap every part of our step on the real objects of the running fit."""
    from lightning_rl.learner import update_api

    for attribute, part in (
        ("training_step", "per item: Learner.training_step (the update, logging)"),
        ("_log_train_metrics", "per item: logging the results (self.log)"),
        ("_prepare_batch", "batch checks and conversion"),
        ("before_gradient_based_update", "before-update hooks (schedules, callbacks)"),
        ("after_gradient_based_update", "after-update hooks (target network, schedulers)"),
        ("compute_losses", "losses"),
        ("compute_gradients", "backward: Lightning's dispatch, zeroing grads"),
        ("postprocess_gradients", "gradient clipping"),
        ("apply_gradients", "optimizer step: Lightning's dispatch, finite check"),
    ):
        timer.wrap(learner, attribute, part)
    timer.wrap(learner.step_runner, "_forward_train_fn", "forward_train")
    timer.wrap(update_api, "log_steps_trained", "step counters")
    timer.wrap(learner.metrics, "log_value", "metrics logging (log_value)")
    timer.wrap(learner.metrics, "reduce", "per item: reducing the metrics")
    for optimizer in learner.optimizer_registry.named.values():
        timer.wrap(optimizer, "step", "optimizer step: torch")
    timer.wrap(torch.autograd, "backward", "backward: autograd")


def profile_dqn(args: argparse.Namespace) -> tuple[PartTimer, Inline, int, int]:
    model, data, trainer_config = read_config("dqn_cartpole.yaml")
    device = torch.device(args.device)
    hand = Inline(device)
    env = gym.make(data["env"])
    obs_dim, num_actions = env.observation_space.shape[0], int(env.action_space.n)
    config = model["model_config"]
    q_net = mlp(obs_dim, config["fcnet_hiddens"], config["fcnet_activation"], num_actions).to(device)
    target_net = copy.deepcopy(q_net).requires_grad_(False)
    optimizer = torch.optim.Adam(q_net.parameters(), lr=model["lr"])
    buffer = ReplayBuffer(data["replay_buffer_capacity"], 1, (obs_dim,), seed=0, device=device)
    obs, _ = env.reset(seed=0)
    for _ in range(5_000):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.add(
            obs[None],
            next_obs[None],
            np.array([action]),
            np.array([reward]),
            np.array([terminated]),
            np.array([truncated]),
        )
        obs = env.reset()[0] if terminated or truncated else next_obs
    gamma, n_step, grad_clip = model["gamma"], model["n_step"], model["grad_clip"]

    def hand_item() -> int:
        """One item's gradient steps of ``handwritten_dqn.py``, part by part (its target sync included)."""
        for step in range(model["gradient_steps"]):
            hand.start()
            batch = buffer.sample(model["minibatch_size"], n_step, gamma)
            hand.mark("replay sample")
            q_taken = q_net(batch["obs"]).gather(-1, batch["actions"].unsqueeze(-1)).squeeze(-1)
            with torch.no_grad():
                chooser = q_net(batch["next_obs"])
            hand.mark("forward_train")
            with torch.no_grad():
                q_target_next = target_net(batch["next_obs"])
                q_next = q_target_next.gather(-1, chooser.argmax(-1, keepdim=True)).squeeze(-1)
                targets = batch["returns"] + batch["discounts"] * q_next
            loss = F.huber_loss(q_taken, targets, delta=1.0)
            hand.mark("losses")
            optimizer.zero_grad()
            loss.backward()
            hand.mark("backward: autograd")
            nn.utils.clip_grad_norm_(q_net.parameters(), grad_clip)
            hand.mark("gradient clipping")
            optimizer.step()
            hand.mark("optimizer step: torch")
            if (step + 1) % model["target_network_update_freq"] == 0:
                target_net.load_state_dict(q_net.state_dict())
                hand.mark("after-update hooks (target network, schedulers)")
        return model["gradient_steps"]

    ours = PartTimer(device)
    max_env_steps = data["learning_starts"] + (args.items + args.warmup + 1) * data["train_freq"]
    data.update(max_env_steps=max_env_steps, rollouts_per_epoch=10_000, seed=0)
    learner = DQNLearner(**model)
    datamodule = OffPolicyDataModule(**data)
    interleave = Interleave(ours, hand, hand_item, args.warmup)
    run_fit(learner, datamodule, interleave, trainer_config, device)
    return ours, hand, interleave.items - args.warmup, interleave.hand_steps


def profile_ppo(args: argparse.Namespace) -> tuple[PartTimer, Inline, int, int]:
    model, data, trainer_config = read_config("ppo_cartpole.yaml")
    device = torch.device(args.device)
    hand = Inline(device)
    agent = Agent(4, 2).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3)
    rows = data["num_envs"] * data["rollout_fragment_length"]
    generator = torch.Generator().manual_seed(0)
    batch = {
        "obs": torch.randn(rows, 4, generator=generator),
        "actions": torch.randint(0, 2, (rows,), generator=generator),
        "logp": torch.full((rows,), -0.69),
        "advantages": torch.randn(rows, generator=generator),
        "returns": torch.randn(rows, generator=generator),
    }
    batch = {key: value.to(device) for key, value in batch.items()}
    minibatch_size, clip = model["minibatch_size"], 0.2

    def hand_item() -> int:
        """One update of ``handwritten_ppo.py``'s ``ppo_update``, part by part."""
        steps = 0
        for _ in range(model["num_epochs"]):
            hand.start()
            order = torch.randperm(rows, device=device)
            for start in range(0, rows, minibatch_size):
                idx = order[start : start + minibatch_size]
                obs, actions, logp = batch["obs"][idx], batch["actions"][idx], batch["logp"][idx]
                adv, returns = batch["advantages"][idx], batch["returns"][idx]
                hand.mark("minibatch slicing")
                dist = agent.get_dist(obs)
                new_value = agent.get_value(obs)
                hand.mark("forward_train")
                new_logp = dist.log_prob(actions)
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                ratio = torch.exp(new_logp - logp)
                pg_loss = -torch.min(adv * ratio, adv * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)).mean()
                loss = pg_loss + 0.5 * F.mse_loss(new_value, returns) - 0.0 * dist.entropy().mean()
                hand.mark("losses")
                optimizer.zero_grad()
                loss.backward()
                hand.mark("backward: autograd")
                nn.utils.clip_grad_norm_(agent.parameters(), model["grad_clip"])
                hand.mark("gradient clipping")
                optimizer.step()
                hand.mark("optimizer step: torch")
                steps += 1
        return steps

    ours = PartTimer(device)
    data.update(max_env_steps=(args.items + args.warmup + 1) * rows, rollouts_per_epoch=10_000, seed=0)
    learner = PPOLearner(**model)
    datamodule = OnPolicyDataModule(**data)
    interleave = Interleave(ours, hand, hand_item, args.warmup)
    run_fit(learner, datamodule, interleave, trainer_config, device)
    return ours, hand, interleave.items - args.warmup, interleave.hand_steps


def run_fit(
    learner: Any, datamodule: Any, callback: lightning.Callback, trainer_config: dict[str, Any], device: torch.device
) -> None:
    """``Trainer.fit`` as the example config sets it up on ``device``, less logger, checkpoints, progress bar and evaluation."""
    trainer = lightning.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        max_epochs=-1,
        log_every_n_steps=trainer_config.get("log_every_n_steps", 50),
        num_sanity_val_steps=0,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(learner, datamodule=datamodule)


def print_table(title: str, ours: PartTimer, hand: Inline, items: int, hand_steps: int, our_steps: int) -> None:
    per_item = {part: s for part, s in ours.seconds.items() if part.startswith("per item")}
    # The whole step: everything but the per-item parts, with the update loop's own time
    # (what training_step's update holds beyond the timed parts) as "update glue".
    step_parts = {part: s for part, s in ours.seconds.items() if part not in per_item}
    glue = per_item.pop("per item: Learner.training_step (the update, logging)", 0.0)
    step_parts["update glue (update loop, bookkeeping)"] = glue
    our_total, hand_total = sum(step_parts.values()), sum(hand.seconds.values())
    print(f"\n{title}: {our_steps} gradient steps of ours, {hand_steps} hand-written, over {items} train items")
    print(f"{'part':<58}{'ours ms':>9}{'hand ms':>9}{'ours - hand':>13}")
    order = sorted(set(step_parts) | set(hand.seconds), key=lambda p: -step_parts.get(p, 0.0))
    for part in order:
        mine = 1e3 * step_parts.get(part, 0.0) / max(our_steps, 1)
        theirs = 1e3 * hand.seconds.get(part, 0.0) / max(hand_steps, 1)
        print(f"{part:<58}{mine:>9.3f}{theirs:>9.3f}{mine - theirs:>+13.3f}")
    mine, theirs = 1e3 * our_total / max(our_steps, 1), 1e3 * hand_total / max(hand_steps, 1)
    print(f"{'total per gradient step':<58}{mine:>9.3f}{theirs:>9.3f}{mine - theirs:>+13.3f}")
    print(f"{'ours / hand-written time':<58}{mine / theirs:>9.2f}x")
    for part, seconds in per_item.items():
        print(f"{part:<58}{1e3 * seconds / max(items, 1):>9.3f} ms per item")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=["dqn", "ppo", "both"], default="both")
    parser.add_argument("--items", type=int, default=12, help="train items measured per algorithm")
    parser.add_argument("--warmup", type=int, default=2, help="train items run first and not counted")
    parser.add_argument("--threads", type=int, default=1)
    add_device_argument(parser)
    args = parser.parse_args()
    check_device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    print(
        f"torch {torch.__version__}, lightning {lightning.__version__}; torch.set_num_threads({args.threads}); "
        f"device {args.device}"
    )
    for algo in ("dqn", "ppo") if args.algo == "both" else (args.algo,):
        gc.collect()  # the garbage of the previous algorithm's fit is not collected within the next one's
        ours, hand, items, hand_steps = profile_dqn(args) if algo == "dqn" else profile_ppo(args)
        our_steps = hand_steps  # the same steps per item in both: the config's
        print_table(algo, ours, hand, items, hand_steps, our_steps)


if __name__ == "__main__":
    main()
