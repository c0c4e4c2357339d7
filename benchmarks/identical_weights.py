"""Seeded fits give bit-identical weights: a fingerprint of five short training runs.

What it proves: a change that should not alter behaviour (a refactor of the Learner or the
data modules) leaves every seeded run's result unchanged, bit for bit. Each case seeds with
``lightning.seed_everything(0)``, runs a real ``Trainer.fit(learner, datamodule=dm)`` on the
CPU (single process, ``deterministic=True``, a few hundred env steps and a few dozen gradient
steps), then fingerprints the trained Learner:

  weights_sha256     sha256 over every module weight tensor (``learner.get_module_state()``:
                     every module, targets and buffers included), in sorted (module, name) order;
  optimizer_sha256   sha256 over every optimizer state tensor (Adam's moments and step counts,
                     ``learner.get_state(components="optimizer")``), in sorted-key order;
  num_params         the number of elements in the module weight tensors;
  first_weight_sum   the float64 sum of the first weight tensor in that order with more than
                     one element (a number a person can eyeball when two hashes differ).

Only tensor contents (dtype, shape, bytes) go into a hash, never key names, so a rename of a
container that keeps the order keeps the hash; a changed number anywhere changes it.

The cases cover each data path: ``ppo`` (OnPolicyDataModule, CartPole-v1), ``dqn``
(OffPolicyDataModule with prioritized replay, CartPole-v1), ``sac`` (OffPolicyDataModule,
Pendulum-v1), ``multi_agent`` (MultiAgentDataModule, PettingZoo connect four, one PPO module
per player) and ``offline`` (OfflineDataModule, CQL on a tiny Pendulum Minari dataset that this
script writes itself into a temporary ``MINARI_DATASETS_PATH``; nothing is downloaded). Every
case also runs its evaluation episodes at epoch ends, so a change in what evaluation consumes
from the random streams shows up too.

Only public, documented API is used (the Learner classes of ``lightning_rl.algorithms``, the
data modules of ``lightning_rl.data`` with keyword arguments as the docs show,
``get_module_state`` and ``get_state``), so the same script runs before and after a refactor.

Run (``PYTHONPATH`` picks the checkout whose ``lightning_rl`` is measured)::

    PYTHONPATH=/path/to/base   python benchmarks/identical_weights.py --out /tmp/base.json
    PYTHONPATH=/path/to/change python benchmarks/identical_weights.py --compare /tmp/base.json
    python benchmarks/identical_weights.py --cases ppo dqn --out /tmp/two.json

``--compare`` exits with status 1 and names each case whose fingerprint differs (or that the
file lacks); with ``--out`` as well, it also writes the new fingerprints. On the 2-core machine
each fit takes under a second on one CPU thread, and all five about 8 s with the imports.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

# The fields ``--compare`` checks; ``seconds`` and ``gradient_steps`` are only for reading.
COMPARED_FIELDS = ("weights_sha256", "optimizer_sha256", "num_params", "first_weight_sum")
OFFLINE_DATASET_ID = "pendulum/identical-weights-v0"


# ----------------------------------------------------------------------------------------
# Fingerprints
# ----------------------------------------------------------------------------------------


def sorted_tensors(tree: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], torch.Tensor]]:
    """Every tensor in a nest of mappings and sequences, with its key path, in sorted-key order.

    Integer keys (an optimizer state's parameter ids) sort as numbers, before string keys;
    non-tensor leaves (learning rates, betas) are skipped: the fingerprint is of the
    tensors, and hyperparameters are not what a refactor moves.
    """
    if isinstance(tree, torch.Tensor):
        yield path, tree
    elif isinstance(tree, Mapping):
        for key in sorted(tree, key=lambda k: (0, k, "") if isinstance(k, int) else (1, 0, str(k))):
            yield from sorted_tensors(tree[key], (*path, str(key)))
    elif isinstance(tree, (list, tuple)):
        for index, item in enumerate(tree):
            yield from sorted_tensors(item, (*path, str(index)))


def tensors_sha256(tensors: list[torch.Tensor]) -> str:
    """sha256 over each tensor's dtype, shape and bytes, in the order given."""
    digest = hashlib.sha256()
    for tensor in tensors:
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        # Bytes through a uint8 view: numpy has no bfloat16, and the bytes are what must match.
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def fingerprint(learner: Any) -> dict[str, Any]:
    """The compared fields of one trained Learner (see the module docstring)."""
    weights = [tensor for _, tensor in sorted_tensors(learner.get_module_state())]
    optimizer = [tensor for _, tensor in sorted_tensors(learner.get_state(components="optimizer")["optimizer"])]
    if not weights or not optimizer:
        raise RuntimeError("the Learner reported no weights or no optimizer state: nothing to compare")
    return {
        "weights_sha256": tensors_sha256(weights),
        "optimizer_sha256": tensors_sha256(optimizer),
        "num_params": sum(tensor.numel() for tensor in weights),
        "first_weight_sum": float(next(t for t in weights if t.numel() > 1).double().sum()),
    }


# ----------------------------------------------------------------------------------------
# Cases: each returns (learner, data module, Trainer overrides), built after seeding
# ----------------------------------------------------------------------------------------


def ppo_case() -> tuple[Any, Any, dict[str, Any]]:
    """PPO on CartPole-v1: 8 rollouts of 4 x 32 env steps, 4 epochs of 2 minibatches each (64 steps)."""
    from lightning_rl.algorithms.ppo import PPOLearner
    from lightning_rl.data import OnPolicyDataModule

    learner = PPOLearner(
        model_config={"fcnet_hiddens": [64, 64]}, lr=1e-3, gamma=0.98, gae_lambda=0.8,
        num_epochs=4, minibatch_size=64, entropy_coeff=0.01, grad_clip=0.5,
    )  # fmt: skip
    data = OnPolicyDataModule(
        "CartPole-v1", num_envs=4, rollout_fragment_length=32, rollouts_per_epoch=2,
        max_env_steps=1_024, evaluation_num_episodes=2,
    )  # fmt: skip
    return learner, data, {}


def dqn_case() -> tuple[Any, Any, dict[str, Any]]:
    """Double DQN, 3-step returns, prioritized replay on CartPole-v1: 30 items x 4 steps after 64 warm-up steps."""
    from lightning_rl.algorithms.dqn import DQNLearner
    from lightning_rl.data import OffPolicyDataModule

    learner = DQNLearner(
        model_config={"fcnet_hiddens": [64, 64]}, lr=1e-3, double_q=True, n_step=3,
        epsilon=[[0, 1.0], [400, 0.05]], gradient_steps=4, minibatch_size=32,
        target_network_update_freq=16,
    )  # fmt: skip
    data = OffPolicyDataModule(
        "CartPole-v1", num_envs=2, replay_buffer_capacity=2_000, prioritized_replay=True,
        train_freq=32, learning_starts=64, rollouts_per_epoch=8, max_env_steps=1_024,
        evaluation_num_episodes=2,
    )  # fmt: skip
    return learner, data, {}


def sac_case() -> tuple[Any, Any, dict[str, Any]]:
    """SAC on Pendulum-v1: 8 env steps per item, 4 gradient steps each, after 64 warm-up steps (168 steps)."""
    from lightning_rl.algorithms.sac import SACLearner
    from lightning_rl.data import OffPolicyDataModule

    learner = SACLearner(
        model_config={"fcnet_hiddens": [64, 64]}, actor_lr=1e-3, critic_lr=1e-3, alpha_lr=1e-3,
        gradient_steps=4, minibatch_size=32, tau=0.005, target_network_update_freq=1,
    )  # fmt: skip
    data = OffPolicyDataModule(
        "Pendulum-v1", replay_buffer_capacity=2_000, train_freq=8, learning_starts=64,
        rollouts_per_epoch=20, max_env_steps=400, evaluation_num_episodes=1,
    )  # fmt: skip
    return learner, data, {}


def multi_agent_case() -> tuple[Any, Any, dict[str, Any]]:
    """PPO on PettingZoo's connect four, one module per player (two optimizers): 6 rollouts of 4 x 64 env steps."""
    from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
    from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
    from lightning_rl.data import MultiAgentDataModule

    two_players = MultiRLModuleSpec(
        {
            "player_0": RLModuleSpec(PPOModule, model_config={"fcnet_hiddens": [64, 64]}),
            "player_1": RLModuleSpec(PPOModule, model_config={"fcnet_hiddens": [32]}),
        }
    )
    learner = PPOLearner(
        two_players, minibatch_size=64, num_epochs=2, policies_to_train=["player_0", "player_1"]
    )
    data = MultiAgentDataModule(
        "pettingzoo.classic.connect_four_v3", policy_mapping_fn="per_agent", num_envs=4,
        rollout_fragment_length=64, rollouts_per_epoch=2, max_env_steps=1_536,
        evaluation_num_episodes=2, evaluation_opponents=["random"], evaluation_module_id="player_0",
    )  # fmt: skip
    return learner, data, {}


def make_offline_dataset(dataset_id: str) -> None:
    """Ten 50-step Pendulum episodes of seeded random actions, written as the tests write theirs."""
    import minari
    from minari.data_collector import EpisodeBuffer

    env = gym.make("Pendulum-v1", max_episode_steps=50)
    env.action_space.seed(0)
    episodes = []
    for episode in range(10):
        obs, _ = env.reset(seed=episode)
        observations, actions, rewards = [obs], [], []
        for _ in range(50):
            actions.append(env.action_space.sample())
            obs, reward, *_ = env.step(actions[-1])
            observations.append(obs)
            rewards.append(reward)
        flags = [False] * 49
        episodes.append(
            EpisodeBuffer(
                observations=np.stack(observations),
                actions=np.stack(actions),
                rewards=rewards,
                terminations=[*flags, False],
                truncations=[*flags, True],  # the time limit, bootstrapped
            )
        )
    minari.create_dataset_from_buffers(dataset_id, episodes, env="Pendulum-v1")


def offline_case() -> tuple[Any, Any, dict[str, Any]]:
    """CQL (Lagrangian, so four optimizers) on the script's own Pendulum dataset: 3 epochs of 20 minibatches."""
    from lightning_rl.algorithms.cql import CQLLearner
    from lightning_rl.data import OfflineDataModule

    learner = CQLLearner(model_config={"fcnet_hiddens": [64, 64]}, lagrangian=True, num_cql_actions=4)
    data = OfflineDataModule(
        OFFLINE_DATASET_ID, batch_size=32, updates_per_epoch=20, evaluation_num_episodes=1
    )
    # An offline epoch is ``updates_per_epoch`` items and there is no env-step budget: max_epochs ends the run.
    return learner, data, {"max_epochs": 3}


@contextmanager
def offline_datasets() -> Iterator[None]:
    """A temporary ``MINARI_DATASETS_PATH`` holding the offline case's dataset, restored afterwards."""
    previous = os.environ.get("MINARI_DATASETS_PATH")
    with tempfile.TemporaryDirectory(prefix="identical_weights_minari_") as root:
        os.environ["MINARI_DATASETS_PATH"] = root
        try:
            make_offline_dataset(OFFLINE_DATASET_ID)
            yield
        finally:
            if previous is None:
                os.environ.pop("MINARI_DATASETS_PATH", None)
            else:
                os.environ["MINARI_DATASETS_PATH"] = previous


CASES: dict[str, Callable[[], tuple[Any, Any, dict[str, Any]]]] = {
    "ppo": ppo_case,
    "dqn": dqn_case,
    "sac": sac_case,
    "multi_agent": multi_agent_case,
    "offline": offline_case,
}


# ----------------------------------------------------------------------------------------
# Running and comparing
# ----------------------------------------------------------------------------------------


def run_case(name: str) -> dict[str, Any]:
    """Seed, build, fit and fingerprint one case."""
    from lightning.pytorch import Trainer, seed_everything

    # The dataset is written before seeding, so writing it consumes no seeded randomness.
    with offline_datasets() if name == "offline" else nullcontext():
        seed_everything(0, verbose=False)
        learner, data, trainer_overrides = CASES[name]()
        options: dict[str, Any] = dict(
            accelerator="cpu", devices=1, max_epochs=-1, deterministic=True, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, default_root_dir=tempfile.gettempdir(),
        ) | trainer_overrides  # fmt: skip
        start = time.perf_counter()
        Trainer(**options).fit(learner, datamodule=data)
        seconds = time.perf_counter() - start
        result = fingerprint(learner)
    result["gradient_steps"] = getattr(learner, "weights_seq_no", None)
    result["seconds"] = round(seconds, 2)
    return result


def differences(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[str]:
    """One line per case of ``new`` whose compared fields differ from ``old``'s (or that ``old`` lacks)."""
    lines = []
    for name, ours in new.items():
        if name not in old:
            lines.append(f"{name}: not in the file compared against")
            continue
        changed = [field for field in COMPARED_FIELDS if ours[field] != old[name].get(field)]
        if changed:
            lines.append(
                f"{name}: " + ", ".join(f"{field} {old[name].get(field)!r} -> {ours[field]!r}" for field in changed)
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the fingerprints here as JSON")
    parser.add_argument("--compare", type=Path, help="compare with this file's fingerprints; exit 1 if any differ")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES), help="run these cases only")
    args = parser.parse_args(argv)

    # One thread: the 2-core machine is shared, and the thread count can change float sums.
    torch.set_num_threads(1)
    # Lightning's and gymnasium's advice (few workers, no logger) is noise here.
    warnings.filterwarnings("ignore")
    import logging

    for logger in ("lightning.pytorch", "lightning.pytorch.utilities.rank_zero", "lightning.fabric"):
        logging.getLogger(logger).setLevel(logging.ERROR)

    results: dict[str, Any] = {}
    for name in args.cases:
        results[name] = run_case(name)
        r = results[name]
        print(
            f"{name:12s} {r['seconds']:6.2f} s  steps={r['gradient_steps']}  params={r['num_params']}  "
            f"weights={r['weights_sha256'][:16]}  optimizer={r['optimizer_sha256'][:16]}  "
            f"first_sum={r['first_weight_sum']!r}",
            flush=True,
        )
    text = json.dumps(results, indent=2, sort_keys=True)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")

    if args.compare is None:
        return 0
    lines = differences(results, json.loads(args.compare.read_text()))
    if lines:
        print(f"DIFFERENT from {args.compare}:")
        for line in lines:
            print(f"  {line}")
        return 1
    print(f"IDENTICAL to {args.compare}: {', '.join(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
