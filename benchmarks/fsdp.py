"""Sharded (FSDP2) versus data-parallel (DDP) Learners on 2 CPU ranks: memory, update speed, acting.

Two measurements on 2 spawned ranks (one torch thread each, gloo), started as
``torchrun`` would start them (environment variables, so Lightning launches nothing itself):

  memory and updates  ``Trainer.fit`` of a ``BCLearner`` (Adam) on a ``--hiddens`` MLP over
            CartPole's spaces (the default, 4 layers of 4096, has 50.4M parameters),
            ``strategy="ddp"`` and then ``strategy="fsdp2"``. Every train item is the same
            ``--rows``-row batch per rank, trained in minibatches of ``--minibatch`` rows (one
            Adam step each). Per rank: the bytes of the parameters, of the gradients after a
            step and of Adam's moments that this rank holds (a ``DTensor``'s local slice under
            FSDP2), and the process's resident memory (RSS) after the imports, after setup (the
            modules built and sharded, before the first step), between steps (after the last
            step) and at its peak (``ru_maxrss``, which includes the moments within a step when
            FSDP2 holds the whole weights and gradients). Speed: minibatch steps/s and env
            steps trained/s (rows of both ranks) over the timed items (the first is not timed).
            Halfway through, the module that acts is taken as a data module takes it for a
            rollout (``with learner.module_for_acting(...)``: under FSDP2 the weights gathered
            whole in place; under DDP the module itself), and RSS is measured inside that block.
  acting    ``EnvRunner.sample`` of ``--rollout`` steps of ``--num-envs`` CartPole envs per rank
            with a sharded Learner (``strategy="fsdp2"``), for the 50M MLP (in the FSDP2 run
            above) and for a small ``--small-hiddens`` MLP (a second, short fit in the same
            processes), three ways:
              (a) in place    ``with learner.module_for_acting(...)``, what the data modules
                              do: the weights gathered whole in place once per rollout, the
                              module called directly (no FSDP hooks per step), resharded after;
              (b) per step    through the sharded module's registered ``forward_exploration``,
                              which gathers the weights on every env step, resharded after
                              each step (``module.reshard()``: a no-grad pass leaves the root
                              unit's weights gathered);
              (c) copy        a whole inference-only copy kept beside the sharded module and
                              refreshed (gathered into) once per rollout: the alternative
                              design, which costs a second copy of the acting weights.
            Rounds alternate the variants; ratios are paired (same round) against (a).

On a machine with 2 CPU cores the 2 ranks use both, and anything else running takes from
them; the load average is printed before and after. The DDP and FSDP2 runs follow each
other (``--rounds`` alternate them), so their speeds are compared across seconds, not
within one round.

Run::

    python benchmarks/fsdp.py              # 2 to 3 minutes on 2 shared cores
    python benchmarks/fsdp.py --rounds 3   # a steadier DDP/FSDP2 speed ratio (about 4 minutes)
    python benchmarks/fsdp.py --quick      # a smoke run (under a minute): small model, few steps
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import queue
import resource
import statistics
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.multiprocessing as mp

# A sibling module: this directory is on sys.path when a benchmark runs as a script.
from _paired import print_paired_table
from learner_update import RepeatBatch

from lightning_rl.learner.group.learner_group import free_local_port, local_rank_environment

MODULE_ID = "default_policy"
MB = 2**20
ACTING_VARIANTS = {
    "in_place": "(a) gathered in place per rollout",
    "per_step": "(b) sharded, gathered per step",
    "copy": "(c) whole copy, refreshed per rollout",
}


# ----------------------------------------------------------------------------------------
# Ranks
# ----------------------------------------------------------------------------------------


def run_ranks(fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout: float = 600.0) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; return their results by rank.

    Raises:
        RuntimeError: If a rank raised, or no result came within ``timeout`` seconds.
    """
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_local_port()
    processes = [
        context.Process(target=_rank_main, args=(fn, rank, world_size, port, args, results), daemon=True)
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    by_rank: dict[int, Any] = {}
    try:
        while len(by_rank) < world_size:
            try:
                rank, ok, payload = results.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError(f"the ranks gave no result within {timeout} s") from None
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{payload}")
            by_rank[rank] = pickle.loads(payload)
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    return [by_rank[rank] for rank in range(world_size)]


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple, results: Any) -> None:
    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    # Lightning joins these processes as the ranks of one group (as under torchrun).
    os.environ.update(local_rank_environment(rank, world_size, port, num_threads=1))
    try:
        results.put((rank, True, pickle.dumps(fn(rank, world_size, *args))))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


# ----------------------------------------------------------------------------------------
# What a rank holds
# ----------------------------------------------------------------------------------------


def rss_mb() -> float:
    """The process's resident memory now, in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def peak_rss_mb() -> float:
    """The process's peak resident memory since the last ``reset_peak_rss``, in MiB (``ru_maxrss`` is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> None:
    """Start the peak over from the memory resident now (Linux: ``/proc/self/clear_refs``, 5)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def local_mb(tensors: Iterator[Any]) -> float:
    """MiB of the tensors this rank holds: a ``DTensor``'s local slice, a plain tensor whole."""
    total = 0
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            continue
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total / MB


def optimizer_tensors(optimizers: list[Any]) -> Iterator[Any]:
    for optimizer in optimizers:
        optimizer = getattr(optimizer, "_optimizer", optimizer)  # Lightning's wrapper
        for state in optimizer.state.values():
            yield from state.values()


# ----------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------


def bc_learner(hiddens: list[int], minibatch: int) -> Any:
    import gymnasium as gym

    from lightning_rl import RLModuleSpec
    from lightning_rl.algorithms.bc import BCLearner, BCModule

    env = gym.make("CartPole-v1")
    spec = RLModuleSpec(
        module_class=BCModule,
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config={"fcnet_hiddens": list(hiddens), "fcnet_activation": "tanh"},
    )
    return BCLearner(module_spec=spec, lr=1e-5, num_epochs=1, minibatch_size=minibatch, shuffle_batch_per_epoch=False)


def bc_batch(rows: int, seed: int) -> dict[str, torch.Tensor]:
    from lightning_rl import Columns

    generator = torch.Generator().manual_seed(seed)
    obs = torch.randn(rows, 4, generator=generator)
    return {Columns.OBS: obs, Columns.ACTIONS: (obs[:, 0] > 0).long()}


def fit(learner: Any, strategy: str, batch: dict[str, torch.Tensor], num_items: int, callback: Any) -> None:
    from lightning.pytorch import Trainer
    from torch.utils.data import DataLoader

    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(learner, train_dataloaders=DataLoader(RepeatBatch(batch, num_items), batch_size=None))


# ----------------------------------------------------------------------------------------
# Memory and updates
# ----------------------------------------------------------------------------------------


def _update_rank(rank: int, world_size: int, strategy: str, act: bool, args: argparse.Namespace) -> dict[str, Any]:
    from lightning.pytorch import Callback

    measured: dict[str, Any] = {"rss_imports": rss_mb()}
    learner = bc_learner(args.hiddens, args.minibatch)
    steps_per_item = -(-args.rows // args.minibatch)
    # After item half-1 (item 0: warm-up, not timed) the module is taken for acting, as a data
    # module takes it for a rollout, and memory is measured inside that block.
    half = (args.items + 1) // 2 + 1

    class Probe(Callback):
        """Memory at setup, between steps, at its peak and while acting; update times."""

        def __init__(self) -> None:
            self.seconds: list[float] = []

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            measured["rss_setup"] = rss_mb()
            measured["params"] = local_mb(pl_module.parameters())
            # A DTensor's numel is its whole tensor's: this counts the model's parameters, not the slice's.
            measured["num_params"] = sum(p.numel() for p in pl_module.parameters())
            reset_peak_rss()  # the peaks below are those of the steps, not of building the modules

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            seconds = time.perf_counter() - self.start
            if batch_idx > 0:  # the first update builds Adam's moments and warms up
                self.seconds.append(seconds)
            if batch_idx == half - 1:
                measured["grads"] = local_mb(p.grad for p in pl_module.parameters())
                measured["adam"] = local_mb(optimizer_tensors(trainer.optimizers))
                measured["rss_between"] = rss_mb()
                measured["rss_peak"] = peak_rss_mb()
                with pl_module.module_for_acting(MODULE_ID) as acting, torch.inference_mode():
                    acting.forward_exploration({"obs": torch.zeros(args.num_envs, 4)})
                    measured["rss_acting"] = rss_mb()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            measured["rss_peak_all"] = peak_rss_mb()
            measured["seconds_per_step"] = statistics.median(self.seconds) / steps_per_item
            if act:
                measured["collectives"] = collective_seconds(measured["num_params"])
                measured["acting"] = measure_acting(pl_module, args.rollout_50m, args.acting_rounds_50m, args)

    fit(learner, strategy, bc_batch(args.rows, seed=rank), args.items + 1, Probe())
    if act:
        # The small MLP in the same processes (a second fit joins the process group there is): no second start-up.
        measured["acting_small"] = small_acting(rank, args)
    return measured


def collective_seconds(numel: int, repeats: int = 2) -> dict[str, float]:
    """Seconds of each collective a step needs, on float32 tensors of ``numel`` elements in all (every rank calls it).

    DDP all-reduces the gradients once per step; FSDP2 all-gathers the weights before the
    forward pass and reduce-scatters the gradients after the backward pass.
    """
    import torch.distributed as dist

    whole = torch.ones(numel - numel % 2)
    part = torch.ones(len(whole) // 2)
    calls = {
        "all_reduce": lambda: dist.all_reduce(whole),
        "all_gather": lambda: dist.all_gather_into_tensor(whole, part),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, whole),
    }
    seconds = {}
    for name, call in calls.items():
        call()  # warm-up
        dist.barrier()
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        seconds[name] = (time.perf_counter() - start) / repeats
    return seconds


# ----------------------------------------------------------------------------------------
# Acting with sharded modules
# ----------------------------------------------------------------------------------------


class ShardedActor:
    """Acts through the sharded MultiRLModule's registered ``forward_exploration`` (FSDP gathers first).

    What ``EnvRunner.sample`` reads of a module (its parameters, spaces, distribution
    classes), handed on from the single module; the passes go through the FSDP unit.

    Args:
        multi: The Learner's sharded ``MultiRLModule``.
        reshard_each_step: Reshard after every pass (the next one gathers again); otherwise
            the weights stay gathered until the caller reshards.
    """

    def __init__(self, multi: Any, reshard_each_step: bool) -> None:
        self.multi = multi
        self.inner = multi[MODULE_ID]
        self.reshard_each_step = reshard_each_step

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward_exploration(self, batch: dict[str, Any]) -> dict[str, Any]:
        out = self.multi.forward_exploration({MODULE_ID: batch})[MODULE_ID]
        if self.reshard_each_step:
            self.multi.reshard()
        return out


def measure_acting(learner: Any, rollout: int, rounds: int, args: argparse.Namespace) -> dict[str, list[float]]:
    """``{variant: [seconds per rollout]}``: a warm-up round, then ``rounds`` rounds in rotating order."""
    from lightning_rl.env import EnvRunner

    multi = learner.module
    runner = EnvRunner("CartPole-v1", num_envs=args.num_envs, rollout_fragment_length=rollout, seed=0)

    def in_place() -> None:
        with learner.module_for_acting(MODULE_ID) as module:
            runner.sample(module)

    def per_step() -> None:
        runner.sample(ShardedActor(multi, reshard_each_step=True))

    copy_of = whole_copy(multi[MODULE_ID])

    def copy() -> None:
        refresh(copy_of, multi[MODULE_ID])
        runner.sample(copy_of)

    runs = {"in_place": in_place, "per_step": per_step, "copy": copy}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for round_index in range(rounds + 1):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            runs[name]()
            if round_index > 0:
                seconds[name].append(time.perf_counter() - start)
    runner.close()
    return seconds


def whole_copy(module: Any) -> Any:
    """A whole, inference-only module of ``module``'s class, beside the sharded one (variant (c)): what
    ``Policy.from_learner`` makes of a sharded Learner's module."""
    from lightning_rl.policy.policy import _whole_inference_copy

    return _whole_inference_copy(module)


def refresh(copy: Any, module: Any) -> None:
    """Gather ``module``'s whole weights into ``copy`` (a collective call)."""
    from lightning_rl.core.sharding import whole

    wanted = copy.state_dict().keys()
    copy.load_state_dict({name: whole(tensor) for name, tensor in module.state_dict().items() if name in wanted})


def small_acting(rank: int, args: argparse.Namespace) -> dict[str, list[float]]:
    """``measure_acting`` for a Learner of the small MLP, sharded by one short ``Trainer.fit``."""
    from lightning.pytorch import Callback

    acting: dict[str, list[float]] = {}

    class Act(Callback):
        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            acting.update(measure_acting(pl_module, args.rollout, args.acting_rounds, args))

    fit(bc_learner(args.small_hiddens, 32), "fsdp2", bc_batch(32, seed=rank), 1, Act())
    return acting


# ----------------------------------------------------------------------------------------
# Printing
# ----------------------------------------------------------------------------------------


def print_memory_table(by_strategy: dict[str, list[list[dict[str, Any]]]], args: argparse.Namespace) -> None:
    """Per-rank memory (the larger rank's, median over rounds) and speed: DDP, FSDP2 and their ratio."""
    ddp, fsdp = by_strategy["ddp"], by_strategy["fsdp2"]
    for runs in (ddp, fsdp):
        for ranks in runs:
            for rank in ranks:
                rank["state"] = rank["params"] + rank["grads"] + rank["adam"]
                for key in ("rss_setup", "rss_between", "rss_peak", "rss_acting", "rss_peak_all"):
                    rank[key + "_above"] = rank[key] - rank["rss_imports"]

    def larger(runs: list[list[dict[str, Any]]], key: str) -> float:
        return statistics.median(max(rank[key] for rank in ranks) for ranks in runs)

    rows = [
        ("parameters (MiB)", "params"),
        ("gradients after a step (MiB)", "grads"),
        ("Adam moments (MiB)", "adam"),
        ("**params + grads + Adam (MiB)**", "state"),
        ("RSS after imports (MiB, the baseline)", "rss_imports"),
        ("RSS after setup, above imports (MiB)", "rss_setup_above"),
        ("RSS between steps, above imports (MiB)", "rss_between_above"),
        ("peak RSS in the steps, above imports (MiB)", "rss_peak_above"),
        ("RSS while acting (weights gathered), above imports (MiB)", "rss_acting_above"),
        ("peak RSS over steps and acting, above imports (MiB)", "rss_peak_all_above"),
    ]
    print("| per rank | DDP | FSDP2 | FSDP2 / DDP |\n|---|---:|---:|---:|")
    for label, key in rows:
        a, b = larger(ddp, key), larger(fsdp, key)
        ratio = f"{b / a:.2f}" if a else "-"
        print(f"| {label} | {a:,.0f} | {b:,.0f} | {ratio} |")
    step_ddp = statistics.median(ranks[0]["seconds_per_step"] for ranks in ddp)
    step_fsdp = statistics.median(ranks[0]["seconds_per_step"] for ranks in fsdp)
    rows_per_step = 2 * args.minibatch  # both ranks
    print(f"| minibatch steps/s | {1 / step_ddp:.2f} | {1 / step_fsdp:.2f} | {step_ddp / step_fsdp:.2f} |")
    print(
        f"| env steps trained/s (both ranks) | {rows_per_step / step_ddp:,.0f} | {rows_per_step / step_fsdp:,.0f} "
        f"| {step_ddp / step_fsdp:.2f} |"
    )
    if len(ddp) > 1:
        paired = [d[0]["seconds_per_step"] / f[0]["seconds_per_step"] for d, f in zip(ddp, fsdp)]
        print(f"\nFSDP2 / DDP speed by round (DDP's step time / FSDP2's): {', '.join(f'{r:.2f}' for r in paired)}")
    collectives = fsdp[-1][0]["collectives"]
    print(
        f"\nCollectives per step on tensors the size of all parameters (gloo, rank 0): DDP all-reduce "
        f"{collectives['all_reduce'] * 1e3:,.1f} ms; FSDP2 all-gather {collectives['all_gather'] * 1e3:,.1f} ms + "
        f"reduce-scatter {collectives['reduce_scatter'] * 1e3:,.1f} ms"
    )


def print_acting_table(title: str, seconds: dict[str, list[float]], work: int) -> None:
    print(f"\n{title}")
    print("paired = median over rounds of (a)'s time / the variant's time in the same round [10th-90th percentile]")
    print_paired_table(seconds, ACTING_VARIANTS, baseline="in_place", work=work, unit="env steps/s")


# ----------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: small model, few steps")
    parser.add_argument("--hiddens", type=int, nargs="+", default=[4096] * 4, help="the large MLP (50.4M params)")
    parser.add_argument("--rows", type=int, default=64, help="rows per rank and train item")
    parser.add_argument("--minibatch", type=int, default=64, help="rows per rank and Adam step")
    parser.add_argument("--items", type=int, default=6, help="timed train items per run (after one warm-up item)")
    parser.add_argument("--rounds", type=int, default=1, help="DDP and FSDP2 runs, alternating")
    parser.add_argument("--num-envs", type=int, default=8, help="CartPole envs per rank when acting")
    parser.add_argument("--rollout", type=int, default=128, help="vector steps per rollout (small MLP)")
    parser.add_argument("--rollout-50m", type=int, default=8, help="vector steps per rollout (large MLP)")
    parser.add_argument("--acting-rounds", type=int, default=10, help="timed rollouts of each variant (small MLP)")
    parser.add_argument("--acting-rounds-50m", type=int, default=3, help="timed rollouts of each variant (large MLP)")
    parser.add_argument("--small-hiddens", type=int, nargs="+", default=[64, 64], help="the small MLP")
    args = parser.parse_args()
    if args.quick:
        args.hiddens, args.rows, args.minibatch, args.items = [256, 256], 64, 32, 2
        args.rollout, args.rollout_50m, args.acting_rounds, args.acting_rounds_50m = 16, 4, 2, 2
    return args


def main() -> None:
    args = parse_args()
    start = time.perf_counter()
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPU cores, 2 ranks x 1 torch thread, gloo; "
        f"load average {os.getloadavg()[0]:.2f} before"
    )
    by_strategy: dict[str, list[list[dict[str, Any]]]] = {"ddp": [], "fsdp2": []}
    for round_index in range(args.rounds):
        for strategy in by_strategy:
            act = strategy == "fsdp2" and round_index == args.rounds - 1  # the acting part once, in the last run
            by_strategy[strategy].append(run_ranks(_update_rank, strategy, act, args))
    num_params = by_strategy["ddp"][0][0]["num_params"]
    print(f"load average {os.getloadavg()[0]:.2f} after; {time.perf_counter() - start:.0f} s in all\n")

    print(
        f"Trainer.fit of BCLearner (Adam) on 2 CPU ranks: MLP {args.hiddens} ({num_params / 1e6:.1f}M parameters, "
        f"float32), {args.rows} rows per rank and item in minibatches of {args.minibatch}, "
        f"{args.items} timed items per run, {args.rounds} run(s) each; memory per rank (the larger rank)\n"
    )
    print_memory_table(by_strategy, args)
    print_acting_table(
        f"EnvRunner.sample under strategy='fsdp2' (rank 0), MLP {args.hiddens}: {args.num_envs} CartPole envs x "
        f"{args.rollout_50m} steps per rank and rollout",
        by_strategy["fsdp2"][-1][0]["acting"],
        args.num_envs * args.rollout_50m,
    )
    print_acting_table(
        f"EnvRunner.sample under strategy='fsdp2' (rank 0), MLP {args.small_hiddens}: {args.num_envs} CartPole "
        f"envs x {args.rollout} steps per rank and rollout",
        by_strategy["fsdp2"][-1][0]["acting_small"],
        args.num_envs * args.rollout,
    )


if __name__ == "__main__":
    main()
