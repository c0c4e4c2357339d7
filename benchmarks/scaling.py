"""Data-parallel scaling: throughput with 1 and 2 ranks, beside the ideal linear figure.

Two measurements, each with 1 and then 2 ranks (one torch thread per rank, ``--threads``):

  updates   ``LearnerGroup.update_from_batch`` on one fixed batch (BC loss, a
            ``--hiddens`` MLP, ``--batch`` rows, ``--num-epochs`` epochs), once for each of
            ``--minibatches`` (rows per learner and step; 0: a learner's whole shard). Each
            learner trains its shard, so 2 learners take half the minibatch steps each, and
            every step all-reduces the gradients once. Samples/s = rows x epochs / seconds
            per update. ``num_learners=0`` (the learner in the driver's own process) is
            printed too: the difference to 1 learner is the cost of the process and queues.
            The latency of one gradient-sized all-reduce between the 2 learners is printed
            as well: it is paid once per minibatch step.
  fit       ``Trainer.fit`` of PPO on CartPole (``--num-envs`` envs x ``--rollout`` steps per
            rank and rollout, ``--rollouts`` rollouts, 4 epochs of 128-row minibatches), with
            ``strategy="ddp"`` for 2 ranks. Each rank samples its own envs and trains on its
            own rollout; env steps/s = env steps of all ranks / seconds from the first to the
            last train batch (so process start-up and imports are not counted).

The "ideal" column is the 1-rank figure times the number of ranks; "of ideal" is the
measured figure divided by it. The rounds of 1 and 2 ranks alternate, and the medians are
printed, because the speed of the same loop drifts on a shared machine.

On a machine with 2 CPU cores, 2 ranks use both cores, so anything else running (the
driver process, the OS) takes from them: expect less than ideal there. With
``--accelerator cuda`` the ranks run on GPUs (one per rank; skipped when fewer are present).

Run::

    python benchmarks/scaling.py                       # both parts, CPU
    python benchmarks/scaling.py --part updates --rounds 5
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import time
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from lightning_rl.learner.group.learner_group import free_local_port, local_rank_environment


def _bc_learner(args: argparse.Namespace) -> Any:
    import gymnasium as gym

    from lightning_rl import RLModuleSpec
    from lightning_rl.algorithms.bc import BCLearner, BCModule

    spec = RLModuleSpec(
        module_class=BCModule,
        observation_space=gym.spaces.Box(-np.inf, np.inf, (args.obs_dim,), np.float32),
        action_space=gym.spaces.Discrete(4),
        model_config={"fcnet_hiddens": args.hiddens, "fcnet_activation": "tanh"},
    )
    return BCLearner(module_spec=spec, lr=1e-4)


def _batch(args: argparse.Namespace) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(args.batch, args.obs_dim)).astype(np.float32)
    return {"obs": obs, "actions": rng.integers(0, 4, size=args.batch)}


def _all_reduce_ms(learner: Any) -> float:
    """Milliseconds per all-reduce of a tensor the size of ``learner``'s gradients (run on every learner)."""
    import torch.distributed as dist

    grads = torch.zeros(sum(p.numel() for p in learner.parameters()), device=learner.device)
    for _ in range(5):
        dist.all_reduce(grads)
    start = time.perf_counter()
    for _ in range(50):
        dist.all_reduce(grads)
    return (time.perf_counter() - start) / 50 * 1e3


def measure_updates(args: argparse.Namespace) -> tuple[dict[int, dict[int, list[float]]], float]:
    """``{minibatch: {num_learners: [samples/s per round]}}`` for 0, 1 and 2 learners, and the all-reduce ms."""
    from lightning_rl import LearnerGroup

    batch = _batch(args)
    samples = args.batch * args.num_epochs
    rates = {minibatch: {0: [], 1: [], 2: []} for minibatch in args.minibatches}
    torch.set_num_threads(args.threads)
    groups = {
        n: LearnerGroup(
            learner=_bc_learner(args), num_learners=n, num_threads_per_learner=args.threads, accelerator=args.accelerator
        )
        for n in (0, 1, 2)
    }
    try:
        all_reduce_ms = groups[2].foreach_learner(_all_reduce_ms)[0]
        for minibatch, by_learners in rates.items():
            settings = dict(num_epochs=args.num_epochs, minibatch_size=minibatch or None, shuffle_batch_per_epoch=True)
            for group in groups.values():
                group.update_from_batch(batch, **settings)  # warm-up
            for _ in range(args.rounds):
                for n, group in groups.items():
                    start = time.perf_counter()
                    group.update_from_batch(batch, **settings)
                    by_learners[n].append(samples / (time.perf_counter() - start))
    finally:
        for group in groups.values():
            group.shutdown()
    return rates, all_reduce_ms


def _fit_rank(rank: int, world_size: int, port: int, args: argparse.Namespace, results: Any) -> None:
    torch.set_num_threads(args.threads)
    from lightning.pytorch import Callback, Trainer

    from lightning_rl.algorithms.ppo import PPOLearner
    from lightning_rl.data import OnPolicyDataModule

    # Lightning joins these processes as the ranks of one group (as under torchrun).
    os.environ.update(local_rank_environment(rank, world_size, port, num_threads=args.threads))

    class Clock(Callback):
        """Seconds from the first train batch to the end, and the part spent in updates."""

        update_seconds = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.batch_start = time.perf_counter()
            if batch_idx == 0:
                self.start = self.batch_start

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx > 0:  # the first update is not timed, like the first rollout
                self.update_seconds += time.perf_counter() - self.batch_start

        def on_train_end(self, trainer, pl_module) -> None:
            self.seconds = time.perf_counter() - self.start

    clock = Clock()
    learner = PPOLearner(num_epochs=4, minibatch_size=128)
    data = OnPolicyDataModule(
        "CartPole-v1", num_envs=args.num_envs, rollout_fragment_length=args.rollout, rollouts_per_epoch=args.rollouts, seed=0
    )
    trainer = Trainer(
        accelerator=args.accelerator,
        devices=world_size,
        strategy="ddp" if world_size > 1 else "auto",
        max_epochs=1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[clock],
    )
    trainer.fit(learner, datamodule=data)
    if rank == 0:
        # The first rollout is sampled before the clock starts; the others are timed.
        env_steps = world_size * args.num_envs * args.rollout * (args.rollouts - 1)
        results.put((env_steps / clock.seconds, clock.update_seconds / clock.seconds))


def measure_fit(args: argparse.Namespace) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """``{ranks: [env steps/s per round]}`` of Trainer.fit with 1 and 2 ranks, and the updates' share of the time."""
    context = mp.get_context("spawn")
    rates: dict[int, list[float]] = {1: [], 2: []}
    update_shares: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.rounds):
        for world_size in rates:
            results = context.Queue()
            port = free_local_port()
            processes = [
                context.Process(target=_fit_rank, args=(rank, world_size, port, args, results)) for rank in range(world_size)
            ]
            for process in processes:
                process.start()
            try:
                rate, update_share = results.get(timeout=600)
                rates[world_size].append(rate)
                update_shares[world_size].append(update_share)
            except queue.Empty:
                raise RuntimeError(f"the {world_size}-rank fit did not finish within 600 s") from None
            finally:
                for process in processes:
                    process.join(timeout=30)
                    if process.is_alive():
                        process.kill()
    return rates, update_shares


def _print_table(title: str, rates: dict[int, list[float]], unit: str, label: str) -> None:
    base = statistics.median(rates[1])
    print(f"\n{title}")
    print(f"{label:<22}{unit:>16}{'ideal':>14}{'of ideal':>10}")
    for n, values in rates.items():
        median = statistics.median(values)
        ideal = base * max(n, 1)
        name = f"{n} (in-process)" if n == 0 else str(n)
        print(f"{name:<22}{median:>16,.0f}{ideal:>14,.0f}{median / ideal:>9.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("updates", "fit", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    parser.add_argument("--accelerator", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--minibatches", type=int, nargs="+", default=[256, 0], help="0: each learner's whole shard")
    parser.add_argument("--num-epochs", type=int, default=2)
    parser.add_argument("--obs-dim", type=int, default=64)
    parser.add_argument("--hiddens", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--rollout", type=int, default=256)
    parser.add_argument("--rollouts", type=int, default=8)
    args = parser.parse_args()
    if args.accelerator == "cuda" and torch.cuda.device_count() < 2:
        raise SystemExit(f"--accelerator cuda needs 2 GPUs for 2 ranks; this machine has {torch.cuda.device_count()}")

    print(f"{os.cpu_count()} CPU cores, {args.threads} torch thread(s) per rank, accelerator {args.accelerator}")
    if args.part in ("updates", "all"):
        rates, all_reduce_ms = measure_updates(args)
        print(f"\nOne all-reduce of the gradients between 2 learners: {all_reduce_ms:.2f} ms (paid once per step)")
        for minibatch, by_learners in rates.items():
            _print_table(
                f"LearnerGroup.update_from_batch: BC, MLP {args.hiddens}, {args.batch} rows x {args.num_epochs} epochs, "
                + (f"minibatch {minibatch} per learner" if minibatch else "one step per epoch (whole shard)"),
                by_learners,
                "samples/s",
                "learners",
            )
    if args.part in ("fit", "all"):
        rates, update_shares = measure_fit(args)
        _print_table(
            f"Trainer.fit PPO CartPole: {args.num_envs} envs x {args.rollout} steps per rank and rollout, "
            f"{args.rollouts} rollouts",
            rates,
            "env steps/s",
            "ranks",
        )
        for ranks, shares in update_shares.items():
            print(f"  {ranks} rank(s): updates take {statistics.median(shares):.0%} of the time, sampling the rest")


if __name__ == "__main__":
    main()
