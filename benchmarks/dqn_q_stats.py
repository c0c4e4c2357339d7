"""Q-value statistics of our DQN and Stable-Baselines3's over training, on the same states (issue 36).

Trains one library's DQN on ``examples/dqn_lunarlander.yaml`` through the suite's own run
functions (``suite.run_ours``, ``_sb3_suite.run_sb3``) with one more callback each, so a seed
here is the suite's seed: the same eval returns come out.
Every ``--every`` env steps (at ``k * every + offset``, see below) it reads the networks and
the replay buffer, without touching any random generator of the run, and records:

  probe   on a fixed set of ``--probe-states`` observations, collected once before training by
          a uniformly random policy on the env seeded with ``--seed`` (the same array for
          both libraries; ``probe_checksum`` in the file shows it): ``probe_v_mean`` and
          ``probe_v_max``, the mean and largest greedy value ``max_a Q(s, a)``;
          ``probe_target_gap``, the mean ``|Q(s, a) - Q_target(s, a)|`` over states and
          actions (how far the online network has moved since the last target sync);
          ``probe_greedy_changed``, the share of states whose greedy action differs from
          the previous record's; ``probe_action_share``, the greedy actions' shares.
  replay  on ``--replay-rows`` rows drawn uniformly (with this script's own generator) from
          the current replay buffer: ``replay_q_mean`` / ``replay_q_max`` of ``Q(s, a)``
          for the stored action; ``replay_target_mean`` of the 1-step target ``y = r +
          gamma * (1 - terminated) * max_a Q_target(s', a)`` (vanilla DQN, as the example
          and SB3); ``replay_td_abs_mean`` / ``replay_td_abs_max`` of ``|Q(s, a) - y|``
          under the library's own target network; ``replay_target_gap`` as above on the
          rows' ``s'``; ``replay_reward_mean``, ``replay_terminated_share``, ``replay_size``.
  weights ``param_norm``: the online network's L2 norm over all its parameters.

``offset`` (default 200) places each record mid-way between target syncs: the example syncs
every 250 gradient steps, one per env step, at multiples of 250 env steps (SB3 during the
collection of that step, ours after the gradient step of that number), so at ``k * 5000`` the
target gap would be ~0 for both; at ``k * 5000 + 200`` both targets lag by ~200 gradient steps.
Each record comes after the update of the train item that reached that env step.

One JSON per run, ``<out>/dqn_lunarlander-<library>-seed<seed>.json``: the suite's run record
(``evals``, timings, ``hparams``, ``notes``, ``versions``; ``suite.py report`` reads it) plus
``q_stats`` (one dict per record, with ``env_steps``) and ``probe_checksum``; written after every
evaluation and record. ``plot`` draws every such file in ``--out`` into ``dqn_q_stats.png``.

Run (each ~30 min for 300k env steps on one thread)::

    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/dqn_q_stats.py run --library ours --seed 0
    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/dqn_q_stats.py run --library sb3 --seed 0
    python benchmarks/dqn_q_stats.py plot --out benchmarks/results/2026-11-28
"""

from __future__ import annotations

import time

START_TIME = time.time()  # the suite's set-up time starts with the script

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from _children import versions
from off_policy import effective_hparams
from suite import RunRecorder, run_ours, write_record

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
TASK = "dqn_lunarlander"
CONFIG = "examples/dqn_lunarlander.yaml"
DEFAULT_OUT = BENCH_DIR / "results" / "2026-11-28"
LIBRARIES = ("ours", "sb3")
# The replay draws' generator is this script's own (seed + this), apart from every generator of the run.
REPLAY_DRAW_SEED_OFFSET = 7_919


@dataclass(frozen=True)
class Transitions:
    """Replayed 1-step transitions as float tensors: what the TD error needs."""

    obs: Tensor
    actions: Tensor
    rewards: Tensor
    next_obs: Tensor
    terminated: Tensor


def probe_states(env_id: str, count: int, seed: int) -> np.ndarray:
    """``count`` observations of ``env_id`` under a uniformly random policy, env and actions seeded by ``seed``.

    Episodes are played back to back (the first reset seeded, the later ones continuing the
    env's generator), so the set holds early, middle and late states of many episodes.

    Raises:
        ValueError: If ``count`` is not >= 1.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    env = gym.make(env_id)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    states = []
    while len(states) < count:
        states.append(obs)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.asarray(states, dtype=np.float32)


class QStatistics:
    """Records the Q statistics of one run (see the module docstring) when they are due.

    Args:
        probe: The probe observations, ``[N, obs_dim]``.
        gamma: The discount of the 1-step target.
        every: Env steps between records.
        offset: Env steps after each multiple of ``every`` where the record is due.
        replay_rows: Rows drawn from the replay buffer per record.
        seed: Seed of the replay draws' own generator.

    Raises:
        ValueError: If ``every`` < 1, ``offset`` is not in [0, every), or ``replay_rows`` < 1.
    """

    def __init__(self, probe: np.ndarray, *, gamma: float, every: int, offset: int, replay_rows: int, seed: int) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        if not 0 <= offset < every:
            raise ValueError(f"offset must be in [0, every={every}), got {offset}")
        if replay_rows < 1:
            raise ValueError(f"replay_rows must be >= 1, got {replay_rows}")
        self.probe = torch.as_tensor(probe)
        self.gamma, self.every, self.offset, self.replay_rows = gamma, every, offset, replay_rows
        self.rng = np.random.default_rng(seed)
        self.records: list[dict[str, Any]] = []
        self._next_due = offset if offset > 0 else every
        self._last_greedy: Tensor | None = None

    def due(self, env_steps: int) -> bool:
        """Whether a record is due at ``env_steps`` (the first call at or past each due step)."""
        return env_steps >= self._next_due

    @torch.no_grad()
    def record(self, env_steps: int, online: nn.Module, target: nn.Module, replay: Callable[[np.ndarray], Transitions],
               replay_size: int) -> dict[str, Any]:
        """Compute and keep one record.

        Args:
            env_steps: The run's env steps so far.
            online: The online Q network (observations -> ``[B, actions]``).
            target: The target Q network.
            replay: Ring positions -> those rows of the replay buffer.
            replay_size: How many rows the buffer holds (positions are drawn below it).

        Returns:
            The record (also appended to ``records``).
        """
        while self._next_due <= env_steps:
            self._next_due += self.every
        q_probe, q_probe_target = online(self.probe), target(self.probe)
        greedy = q_probe.argmax(-1)
        changed = math.nan if self._last_greedy is None else (greedy != self._last_greedy).float().mean().item()
        self._last_greedy = greedy
        rows = replay(self.rng.integers(0, replay_size, size=self.replay_rows))
        q_taken = online(rows.obs).gather(-1, rows.actions.unsqueeze(-1)).squeeze(-1)
        q_next_online, q_next_target = online(rows.next_obs), target(rows.next_obs)
        targets = rows.rewards + self.gamma * (1.0 - rows.terminated) * q_next_target.max(-1).values
        td_abs = (q_taken - targets).abs()
        num_actions = q_probe.shape[-1]
        entry = {
            "env_steps": int(env_steps),
            "probe_v_mean": q_probe.max(-1).values.mean().item(),
            "probe_v_max": q_probe.max().item(),
            "probe_target_gap": (q_probe - q_probe_target).abs().mean().item(),
            "probe_greedy_changed": changed,
            "probe_action_share": torch.bincount(greedy, minlength=num_actions).div(len(greedy)).tolist(),
            "replay_q_mean": q_taken.mean().item(),
            "replay_q_max": q_taken.max().item(),
            "replay_target_mean": targets.mean().item(),
            "replay_td_abs_mean": td_abs.mean().item(),
            "replay_td_abs_max": td_abs.max().item(),
            "replay_target_gap": (q_next_online - q_next_target).abs().mean().item(),
            "replay_reward_mean": rows.rewards.mean().item(),
            "replay_terminated_share": rows.terminated.mean().item(),
            "replay_size": int(replay_size),
            "param_norm": torch.sqrt(sum(p.detach().pow(2).sum() for p in online.parameters())).item(),
        }
        self.records.append(entry)
        return entry


def _floats(values: np.ndarray) -> Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.float32))


def ours_replay(buffer: Any) -> Callable[[np.ndarray], Transitions]:
    """Rows of our ``ReplayBuffer`` by ring position, read from its ``state_dict`` (views, no copy, no RNG)."""
    columns = buffer.state_dict()["columns"]

    def rows(positions: np.ndarray) -> Transitions:
        return Transitions(
            obs=_floats(columns["obs"][positions]),
            actions=torch.as_tensor(columns["actions"][positions]).long(),
            rewards=_floats(columns["rewards"][positions]),
            next_obs=_floats(columns["new_obs"][positions]),
            terminated=_floats(columns["terminateds"][positions]),
        )

    return rows


def sb3_replay(buffer: Any) -> Callable[[np.ndarray], Transitions]:
    """Rows of SB3's ``ReplayBuffer`` (env 0) by position; terminated is SB3's ``done * (1 - timeout)``."""

    def rows(positions: np.ndarray) -> Transitions:
        done, timeout = buffer.dones[positions, 0], buffer.timeouts[positions, 0]
        return Transitions(
            obs=_floats(buffer.observations[positions, 0]),
            actions=torch.as_tensor(buffer.actions[positions, 0].reshape(-1)).long(),
            rewards=_floats(buffer.rewards[positions, 0]),
            next_obs=_floats(buffer.next_observations[positions, 0]),
            terminated=_floats(done * (1.0 - timeout)),
        )

    return rows


def ours_callback(stats: QStatistics, record: dict[str, Any], path: Path) -> Any:
    """A Lightning callback for the suite's ``run_ours``: after each train item's update, a record when one is due."""
    import lightning.pytorch as pl

    from lightning_rl.core.columns import DEFAULT_MODULE_ID

    class RecordQStatistics(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:  # fmt: skip
            data = trainer.datamodule
            env_steps = data.num_env_steps_sampled_lifetime
            if not stats.due(env_steps) or len(data.replay_buffer) == 0:
                return
            module = pl_module.module[DEFAULT_MODULE_ID]
            stats.record(env_steps, module.q_net, module.target_q_net, ours_replay(data.replay_buffer),
                         len(data.replay_buffer))  # fmt: skip
            write_record(path, record)

    return RecordQStatistics()


def sb3_callback(stats: QStatistics, record: dict[str, Any], path: Path) -> Any:
    """An SB3 callback for the suite's ``run_sb3``: at each rollout's start, i.e. after the previous rollout's
    update, a record when one is due."""
    from stable_baselines3.common.callbacks import BaseCallback

    class RecordQStatistics(BaseCallback):
        def _on_rollout_start(self) -> None:
            buffer = self.model.replay_buffer
            size = buffer.buffer_size if buffer.full else buffer.pos
            if not stats.due(self.model.num_timesteps) or size == 0:
                return
            stats.record(self.model.num_timesteps, self.model.q_net, self.model.q_net_target, sb3_replay(buffer), size)
            write_record(path, record)

        def _on_step(self) -> bool:
            return True

    return RecordQStatistics()


def run(args: argparse.Namespace) -> Path:
    """``run``: one library and seed, its record in ``<out>/dqn_lunarlander-<library>-seed<seed>.json``."""
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{TASK}-{args.library}-seed{args.seed}.json"
    hparams = effective_hparams("dqn", REPO_ROOT / CONFIG, args.max_env_steps)
    hparams["data"]["seed"] = args.seed
    probe = probe_states(hparams["data"]["env"], args.probe_states, args.seed)
    stats = QStatistics(probe, gamma=hparams["model"]["gamma"], every=args.every, offset=args.offset,
                        replay_rows=args.replay_rows, seed=args.seed + REPLAY_DRAW_SEED_OFFSET)  # fmt: skip
    record = {
        "task": TASK, "library": args.library, "seed": args.seed, "config": CONFIG, "algo": "dqn",
        "max_env_steps": args.max_env_steps, "extra_args": [], "threads": args.threads, "status": "started",
        "evals": [], "hparams": hparams, "notes": [], "versions": versions(),
        "q_stats_settings": {"every": args.every, "offset": args.offset, "probe_states": args.probe_states,
                             "replay_rows": args.replay_rows},
        "probe_checksum": float(probe.astype(np.float64).sum()), "q_stats": stats.records,
    }  # fmt: skip
    write_record(path, record)
    recorder = RunRecorder(path, record)
    if args.library == "ours":
        run_ours(record, recorder, [ours_callback(stats, record, path)])
    else:
        from _sb3_suite import run_sb3

        run_sb3(record, recorder, [sb3_callback(stats, record, path)])
    write_record(path, record)
    return path


# ----------------------------------------------------------------------------------------
# plot: every run file of --out, one line per run, one panel per statistic
# ----------------------------------------------------------------------------------------

PANELS = (
    ("evals", "return_mean", "eval return (10 greedy episodes)"),
    ("q_stats", "probe_v_mean", "probe: mean max_a Q"),
    ("q_stats", "probe_v_max", "probe: largest max_a Q"),
    ("q_stats", "replay_q_mean", "replay: mean Q(s, a)"),
    ("q_stats", "replay_q_max", "replay: max Q(s, a)"),
    ("q_stats", "replay_td_abs_mean", "replay: mean |TD error| (own target)"),
    ("q_stats", "probe_target_gap", "probe: mean |Q - Q_target|"),
    ("q_stats", "replay_target_gap", "replay: mean |Q - Q_target| on s'"),
    ("q_stats", "probe_greedy_changed", "probe: greedy action changed"),
    ("q_stats", "param_norm", "online weights' L2 norm"),
    ("q_stats", "replay_terminated_share", "replay: terminated share"),
    ("q_stats", "replay_reward_mean", "replay: mean reward"),
)


def plot(args: argparse.Namespace) -> Path:
    """``plot``: ``<out>/dqn_q_stats.png`` from every ``dqn_lunarlander-*.json`` with ``q_stats`` in ``--out``.

    Raises:
        SystemExit: If ``--out`` holds no such file.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    runs = [json.loads(p.read_text()) for p in sorted(out.glob(f"{TASK}-*-seed*.json"))]
    runs = [r for r in runs if r.get("q_stats")]
    if not runs:
        raise SystemExit(f"no {TASK}-*.json run files with q_stats in {out}")
    figure, axes = plt.subplots(6, 2, figsize=(12, 19), sharex=True)
    for axis, (series, key, title) in zip(axes.flat, PANELS):
        for r in runs:
            points = [(p["env_steps"], p[key]) for p in r[series] if p.get(key) is not None]
            style = "-" if r["library"] == "ours" else "--"
            axis.plot(*zip(*points), style, linewidth=1.2, label=f"{r['library']} seed {r['seed']}")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    axes.flat[0].set_ylim(bottom=max(axes.flat[0].get_ylim()[0], -1000))
    axes.flat[0].legend()
    for axis in axes[-1]:
        axis.set_xlabel("env steps")
    figure.suptitle("DQN LunarLander-v3 (examples/dqn_lunarlander.yaml): ours (solid) beside SB3 (dashed)")
    figure.tight_layout(rect=(0, 0, 1, 0.98))  # the top 2% for the title
    target = out / "dqn_q_stats.png"
    figure.savefig(target, dpi=90)
    plt.close(figure)
    return target


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("run", help="train one library and seed, recording Q statistics")
    train.add_argument("--library", choices=LIBRARIES, required=True)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--max-env-steps", type=int, default=300_000)
    train.add_argument("--every", type=int, default=5_000, help="env steps between records (default: %(default)s)")
    train.add_argument("--offset", type=int, default=200,
                       help="env steps after each multiple of --every where a record is due (default: %(default)s)")
    train.add_argument("--probe-states", type=int, default=2_000, help="default: %(default)s")
    train.add_argument("--replay-rows", type=int, default=2_000, help="default: %(default)s")
    train.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default: %(default)s)")
    train.add_argument("--out", default=str(DEFAULT_OUT), help="default: %(default)s")
    draw = commands.add_parser("plot", help="dqn_q_stats.png of the run files in --out")
    draw.add_argument("--out", default=str(DEFAULT_OUT), help="default: %(default)s")
    args = parser.parse_args(argv)
    if args.command == "run" and args.max_env_steps < 1:
        parser.error(f"--max-env-steps must be >= 1, got {args.max_env_steps}")
    return args


def main() -> None:
    args = parse_args()
    print(f"wrote {run(args) if args.command == 'run' else plot(args)}")


if __name__ == "__main__":
    main()
