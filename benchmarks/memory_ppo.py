"""Memory: PPO with an LSTM on CartPole without velocities, beside sb3-contrib's RecurrentPPO (issue 29).

Four arms, each a fresh subprocess per seed with one thread (``OMP_NUM_THREADS`` =
``MKL_NUM_THREADS`` = ``torch.set_num_threads`` = ``--threads``, default 1), arms' order
rotated per seed:

  lstm          ours: ``examples/ppo_cartpole_novel_lstm.yaml`` on ``lightning_rl/CartPoleNoVel-v1``
                (LSTM of 64 cells, policy and value LSTMs apart);
  ff_novel      ours, the same config with the LSTM keys taken out of ``model_config``
                (``[64]`` ReLU MLPs, nothing else changed): the same PPO without memory, which
                should stay well below 450 on this env;
  sb3_lstm      sb3-contrib's ``RecurrentPPO`` (``MlpLstmPolicy``) with rl-baselines3-zoo's
                ``CartPoleNoVel-v1`` settings, read from the same config file, on the same env;
  ff_cartpole   ours ``ff_novel`` on plain ``CartPole-v1``: feed-forward PPO where it needs no
                memory, for the speed ratio.

Our arms are ``Trainer.fit`` through ``LightningRLCLI`` (what ``lightning-rl fit --config``
runs), with ``seed_everything`` and the envs' base seed set to the run's seed, the budget as
``data.init_args.max_env_steps``, logger, checkpoints, progress bar and the config's
callbacks off (``off_policy.build_cli``); a callback times the loop and every evaluation.
The lr and clip schedules of every arm anneal linearly to 0 over the run's budget, as SB3's
``lin_`` schedules do over ``total_timesteps``, so a shorter run is the same recipe, shorter.

Evaluation is the same in all arms: after every ``rollouts_per_epoch`` rollouts (20 x 256 =
5120 env steps) and after the last one, ``evaluation_num_episodes`` (10) greedy episodes;
ours on ``min(num_envs, episodes)`` envs of the data module's own, RecurrentPPO's on as many
gymnasium envs (SAME_STEP autoreset, seeded ``seed + 1_000_003`` and moving on per
evaluation, observations normalized by its ``VecNormalize`` statistics, LSTM state reset
where an episode starts).

Per arm the table gives: the final evaluation's mean return, the env steps of the first
evaluation >= 450 (``-``: none within the run), wall time (launch to exit, everything),
train s (the training loop without evaluation) and env steps/s = env steps / train s. Then
the medians over seeds and issue 29's targets: LSTM return >= RecurrentPPO's, LSTM env
steps/s >= 3x RecurrentPPO's, LSTM env steps/s >= 0.75x our feed-forward PPO's (on the same
env, ``ff_novel``; ``ff_cartpole`` beside it), LSTM >= 450 within 200k on every seed and
``ff_novel`` below 200. An arm that cannot run (``lstm`` before recurrent PPO lands: the
module refuses ``use_lstm``; ``sb3_lstm`` without sb3-contrib) is skipped with its error.

Writes ``<out>/memory_ppo.json`` (every run's evaluations and timings, the summary, versions
and the machine's load average before and after) and ``<out>/memory_ppo.png`` (evaluation
return vs env steps, a thin line per seed, mean over seeds bold) when matplotlib is installed.

Run::

    python benchmarks/memory_ppo.py                                   # 4 arms x seeds 0 1 2, 200k env steps each
    python benchmarks/memory_ppo.py --seeds 0 --max-env-steps 20000 --arms ff_novel sb3_lstm ff_cartpole
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from _children import fmt, print_versions, rotated, write_json
from off_policy import EVALUATION_SEED_OFFSET, ChildClock, run_child, steps_per_second, steps_to

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
CONFIG = "examples/ppo_cartpole_novel_lstm.yaml"
ARMS = ("lstm", "ff_novel", "sb3_lstm", "ff_cartpole")
OURS_ARMS = ("lstm", "ff_novel", "ff_cartpole")
# The model_config keys of the recurrent cell; the feed-forward arms drop them (and so run
# today, before PPOModule knows them).
RECURRENT_KEYS = (
    "use_lstm", "lstm_cell_size", "max_seq_len", "lstm_use_prev_action", "lstm_use_prev_reward", "recurrent_cell",
)  # fmt: skip
SOLVED = 450.0  # issue 29: evaluation >= 450 within 200k env steps
FF_CEILING = 200.0  # issue 29: the same PPO without the LSTM stays below this
TARGETS = {"lstm_vs_sb3_speed": 3.0, "lstm_vs_ff_speed": 0.75}


def load_config(config: Path) -> dict[str, Any]:
    """The config's model and data ``init_args`` (every setting the other arms copy is written there)."""
    raw = yaml.safe_load(config.read_text())
    return {"model": raw["model"]["init_args"], "data": raw["data"]["init_args"]}


def annealed(setting: Any, budget: int) -> list[list[float]]:
    """``setting``'s starting value, annealed linearly to 0 over ``budget`` env steps (SB3's ``lin_``)."""
    start = setting[0][1] if isinstance(setting, list) else setting
    return [[0, float(start)], [budget, 0.0]]


def ours_overrides(arm: str, settings: dict[str, Any], budget: int) -> list[str]:
    """CLI flags for one of our arms, on top of ``off_policy.cli_overrides`` (seed, budget, quiet)."""
    model = settings["model"]
    flags = [
        "--model.init_args.lr", json.dumps(annealed(model["lr"], budget)),
        "--model.init_args.clip_param", json.dumps(annealed(model["clip_param"], budget)),
    ]  # fmt: skip
    if arm != "lstm":
        feed_forward = {key: value for key, value in model["model_config"].items() if key not in RECURRENT_KEYS}
        flags += ["--model.init_args.model_config", json.dumps(feed_forward)]
    if arm == "ff_cartpole":
        flags += ["--data.init_args.env", "CartPole-v1"]
    return flags


# ----------------------------------------------------------------------------------------
# Children: ours (Trainer.fit of the config) and sb3-contrib's RecurrentPPO
# ----------------------------------------------------------------------------------------


def run_ours_child(args: argparse.Namespace) -> None:
    """``--child ours --arm A``: one Trainer.fit of the config with the arm's overrides, timed."""
    import torch
    from off_policy import build_cli, make_timing_callback, unavailable

    torch.set_num_threads(args.threads)
    flags = ours_overrides(args.arm, load_config(REPO_ROOT / args.config), args.max_env_steps)
    try:
        cli = build_cli(REPO_ROOT / args.config, args.seed, args.max_env_steps, flags)
    except Exception as error:  # noqa: BLE001 (a config today's modules refuse, e.g. use_lstm): skip the arm
        # The first cause names the setting; what wraps it (the CLI's error path) says less.
        while (error.__cause__ or error.__context__) is not None:
            error = error.__cause__ or error.__context__
        unavailable(f"{type(error).__name__}: {error}".replace("\n", " "))
        return
    clock = ChildClock()
    cli.trainer.callbacks.append(make_timing_callback(clock, torch.get_num_threads()))
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    clock.finish()


def run_sb3_child(args: argparse.Namespace) -> None:
    """``--child sb3``: RecurrentPPO with the zoo's CartPoleNoVel-v1 settings (read from the config), timed.

    The zoo's ``policy_kwargs`` (``ortho_init=False``, ReLU, ``lstm_hidden_size=64``,
    ``enable_critic_lstm=True``, ``net_arch=dict(pi=[64], vf=[64])``) are SB3's names for the
    config's ``model_config``; ``normalize: true`` is ``VecNormalize`` with the config's gamma
    and clip; ``max_grad_norm``/``vf_coef`` are the config's ``grad_clip``/``vf_loss_coeff``.
    """
    if importlib.util.find_spec("sb3_contrib") is None:
        print("UNAVAILABLE reason=sb3-contrib is not installed (pip install 'lightning-rl[bench]')", flush=True)
        return
    import gymnasium as gym
    import torch
    from _sb3_suite import sb3_schedule
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    import lightning_rl.env.wrappers  # noqa: F401  registers lightning_rl/CartPoleNoVel-v1

    torch.set_num_threads(args.threads)
    settings = load_config(REPO_ROOT / args.config)
    model_args, data = settings["model"], settings["data"]
    config = model_args["model_config"]
    budget, seed = args.max_env_steps, args.seed
    activations = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh}
    hiddens = list(config.get("fcnet_hiddens", [64]))
    num_envs, fragment = int(data["num_envs"]), int(data["rollout_fragment_length"])
    # make_vec_env resets env i with seed + i, as our runner does.
    env = VecNormalize(
        make_vec_env(data["env"], n_envs=num_envs, seed=seed),
        norm_obs=bool(data.get("normalize_observations")),
        norm_reward=bool(data.get("normalize_rewards")),
        clip_obs=float(data.get("normalization_clip", 10.0)),
        clip_reward=float(data.get("normalization_clip", 10.0)),
        gamma=float(data.get("normalization_gamma", model_args["gamma"])),
    )
    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        n_steps=fragment,
        batch_size=int(model_args["minibatch_size"]),
        n_epochs=int(model_args["num_epochs"]),
        gamma=float(model_args["gamma"]),
        gae_lambda=float(model_args["gae_lambda"]),
        ent_coef=float(model_args["entropy_coeff"]),
        vf_coef=float(model_args["vf_loss_coeff"]),
        max_grad_norm=float(model_args["grad_clip"]),
        learning_rate=sb3_schedule(annealed(model_args["lr"], budget), budget),
        clip_range=sb3_schedule(annealed(model_args["clip_param"], budget), budget),
        clip_range_vf=model_args.get("vf_clip_param"),
        policy_kwargs={
            "ortho_init": False,
            "activation_fn": activations[config.get("fcnet_activation", "relu")],
            "lstm_hidden_size": int(config.get("lstm_cell_size", 64)),
            # Ours with vf_share_layers: one LSTM for both heads, which is SB3's shared_lstm.
            "shared_lstm": bool(config.get("vf_share_layers", False)),
            "enable_critic_lstm": not config.get("vf_share_layers", False),
            "net_arch": {"pi": hiddens, "vf": hiddens},
        },
        seed=seed,
        device="cpu",
        verbose=0,
    )

    num_episodes = int(data.get("evaluation_num_episodes", 10))
    eval_envs_count = int(data.get("evaluation_num_envs") or min(num_envs, num_episodes))
    eval_envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(data["env"])] * eval_envs_count, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    clock = ChildClock()
    state = {"rollouts": 0, "evaluated_at": -1, "evaluations": 0}

    def evaluate() -> None:
        """Greedy episodes, as ours: the first ``num_episodes`` to end on ``eval_envs_count`` envs."""
        clock.evaluation_started()
        obs, _ = eval_envs.reset(seed=seed + EVALUATION_SEED_OFFSET + state["evaluations"] * eval_envs_count)
        state["evaluations"] += 1
        lstm_states, starts = None, np.ones(eval_envs_count, dtype=bool)
        running, finished = np.zeros(eval_envs_count), []
        while len(finished) < num_episodes:
            actions, lstm_states = model.predict(
                env.normalize_obs(obs), state=lstm_states, episode_start=starts, deterministic=True
            )
            obs, rewards, terminated, truncated, _ = eval_envs.step(actions)
            running += rewards
            starts = terminated | truncated  # SAME_STEP: obs is already the next episode's first
            for i in np.flatnonzero(starts):
                finished.append(float(running[i]))
                running[i] = 0.0
        clock.evaluation_finished(int(model.num_timesteps), finished[:num_episodes])
        state["evaluated_at"] = state["rollouts"]

    class EvaluateEveryEpoch(BaseCallback):
        """Evaluate after every ``rollouts_per_epoch``-th update: at the next rollout's start."""

        def _on_rollout_start(self) -> None:
            epoch_end = state["rollouts"] and state["rollouts"] % int(data["rollouts_per_epoch"]) == 0
            if epoch_end and state["evaluated_at"] != state["rollouts"]:
                evaluate()

        def _on_rollout_end(self) -> None:
            state["rollouts"] += 1

        def _on_step(self) -> bool:
            return True

    clock.training_start()
    model.learn(total_timesteps=budget, callback=EvaluateEveryEpoch())
    if state["evaluated_at"] != state["rollouts"]:
        evaluate()  # after the last update
    clock.training_end(int(model.num_timesteps), torch.get_num_threads())
    clock.finish()


# ----------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------


def child_command(arm: str, seed: int, args: argparse.Namespace) -> list[str]:
    child = "sb3" if arm == "sb3_lstm" else "ours"
    return [
        sys.executable, str(Path(__file__).resolve()), "--child", child, "--arm", arm, "--config", args.config,
        "--seeds", str(seed), "--max-env-steps", str(args.max_env_steps), "--threads", str(args.threads),
    ]  # fmt: skip


def final_return(record: dict[str, Any]) -> float | None:
    return record["evals"][-1][1] if record["status"] == "DONE" and record["evals"] else None


def median_of(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def print_table(records: list[dict[str, Any]]) -> None:
    print(
        f"\n{'arm':<13}{'seed':>5}  {'result':<12}{'env steps':>10}{'final eval':>11}{f'to >={SOLVED:g}':>10}"
        f"{'wall s':>9}{'train s':>9}{'eval s':>8}{'steps/s':>9}"
    )
    for r in records:
        print(
            f"{r['variant']:<13}{r['seed']:>5}  {r['status']:<12}{fmt(r['env_steps'], 'd'):>10}"
            f"{fmt(final_return(r), '.1f'):>11}{fmt(steps_to(r, SOLVED), 'd'):>10}{fmt(r['wall_s'], '.1f'):>9}"
            f"{fmt(r['train_s'], '.1f'):>9}{fmt(r['eval_s'], '.1f'):>8}{fmt(steps_per_second(r), '.0f'):>9}"
        )


def summarize(records: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    """Per arm the medians over its finished seeds, then issue 29's ratios and targets."""
    per_arm: dict[str, dict[str, Any]] = {}
    for arm in arms:
        runs = [r for r in records if r["variant"] == arm]
        done = [r for r in runs if r["status"] == "DONE"]
        per_arm[arm] = {
            "seeds_done": [r["seed"] for r in done],
            "final_return": median_of([final_return(r) for r in done]),
            "min_final_return": min((final_return(r) for r in done if final_return(r) is not None), default=None),
            "max_final_return": max((final_return(r) for r in done if final_return(r) is not None), default=None),
            "steps_per_s": median_of([steps_per_second(r) for r in done]),
            "wall_s": median_of([r["wall_s"] for r in done]),
            "steps_to_solved": [steps_to(r, SOLVED) for r in done],
            "skipped": sorted({r.get("reason") or r["status"] for r in runs if r["status"] != "DONE"}),
        }
    lstm, sb3 = per_arm.get("lstm", {}), per_arm.get("sb3_lstm", {})
    ff_novel, ff_cartpole = per_arm.get("ff_novel", {}), per_arm.get("ff_cartpole", {})
    ratios = {
        "lstm_return_minus_sb3": None
        if lstm.get("final_return") is None or sb3.get("final_return") is None
        else lstm["final_return"] - sb3["final_return"],
        "lstm_vs_sb3_speed": ratio(lstm.get("steps_per_s"), sb3.get("steps_per_s")),
        "lstm_vs_ff_novel_speed": ratio(lstm.get("steps_per_s"), ff_novel.get("steps_per_s")),
        "lstm_vs_ff_cartpole_speed": ratio(lstm.get("steps_per_s"), ff_cartpole.get("steps_per_s")),
        "sb3_vs_ff_novel_speed": ratio(sb3.get("steps_per_s"), ff_novel.get("steps_per_s")),
    }
    return {"arms": per_arm, "ratios": ratios}


def verdict(met: bool | None) -> str:
    """A target's line end: met, not met, or not measured (an arm it needs did not run)."""
    return "not measured" if met is None else ("MET" if met else "NOT MET")


def print_summary(summary: dict[str, Any], budget: int) -> None:
    arms, ratios = summary["arms"], summary["ratios"]
    print(f"\nmedians over seeds ({budget} env steps per run)")
    print(f"{'arm':<13}{'seeds':<10}{'final eval':>11}{'min final':>10}{'steps/s':>9}{'wall s':>9}  to >=450 per seed")
    for arm, s in arms.items():
        seeds = ",".join(map(str, s["seeds_done"])) or "-"
        print(
            f"{arm:<13}{seeds:<10}{fmt(s['final_return'], '.1f'):>11}{fmt(s['min_final_return'], '.1f'):>10}"
            f"{fmt(s['steps_per_s'], '.0f'):>9}{fmt(s['wall_s'], '.1f'):>9}  {s['steps_to_solved'] or '-'}"
        )
        for reason in s["skipped"]:
            print(f"{'':<13}skipped: {reason}")
    lstm, ff = arms.get("lstm", {}), arms.get("ff_novel", {})
    diff, speed = ratios["lstm_return_minus_sb3"], ratios["lstm_vs_sb3_speed"]
    solved, ff_max = lstm.get("steps_to_solved"), ff.get("max_final_return")
    lines = [  # (target, measured, met: None when an arm it needs did not run)
        ("LSTM return - RecurrentPPO return >= 0", fmt(diff, "+.1f"), None if diff is None else diff >= 0),
        ("LSTM env steps/s / RecurrentPPO's >= 3", fmt(speed, ".2f"),
         None if speed is None else speed >= TARGETS["lstm_vs_sb3_speed"]),
    ]  # fmt: skip
    for name, label in (("lstm_vs_ff_novel_speed", "ff_novel"), ("lstm_vs_ff_cartpole_speed", "ff_cartpole")):
        value = ratios[name]
        lines.append((f"LSTM env steps/s / {label}'s >= 0.75", fmt(value, ".2f"),
                      None if value is None else value >= TARGETS["lstm_vs_ff_speed"]))  # fmt: skip
    lines += [
        ("LSTM eval >= 450 within 200k, every seed", str(solved or "-"),
         None if not solved else all(steps is not None and steps <= 200_000 for steps in solved)),
        (f"ff_novel final eval < {FF_CEILING:g}, every seed", fmt(ff_max, ".1f") + " (max)",
         None if ff_max is None else ff_max < FF_CEILING),
        ("RecurrentPPO env steps/s / ff_novel's", fmt(ratios["sb3_vs_ff_novel_speed"], ".2f"), "reference"),
    ]  # fmt: skip
    print("\nissue 29 targets")
    for target, measured, met in lines:
        print(f"  {target:<44}{measured:>14}  {met if met == 'reference' else verdict(met)}")


def plot(records: list[dict[str, Any]], arms: list[str], path: Path, budget: int) -> None:
    """Evaluation return vs env steps: a thin line per seed, the mean over seeds (at common steps) bold."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no learning-curve plot (pip install 'lightning-rl[bench]')")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for index, arm in enumerate(arms):
        runs = [r for r in records if r["variant"] == arm and r["evals"]]
        if not runs:
            continue
        color = f"C{index}"
        for r in runs:
            steps, values = zip(*r["evals"])
            ax.plot(steps, values, color=color, alpha=0.3, linewidth=1)
        grid = np.linspace(0, budget, 101)
        mean = np.mean([np.interp(grid, *zip(*r["evals"]), left=np.nan, right=np.nan) for r in runs], axis=0)
        ax.plot(grid, mean, color=color, linewidth=2.5, label=f"{arm} ({len(runs)} seeds)")
    ax.axhline(SOLVED, color="gray", linestyle="--", linewidth=1)
    ax.set(
        xlabel="env steps",
        ylabel="greedy evaluation return (10 episodes)",
        title="CartPole without velocities (ff_cartpole: with them)",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")


def load_average() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--max-env-steps", type=int, default=200_000, help="every run's budget (200k: issue 29)")
    parser.add_argument("--threads", type=int, default=1, help="torch/OMP/MKL threads per run")
    parser.add_argument("--config", default=CONFIG, help="our LSTM config, relative to the repo root")
    parser.add_argument("--timeout", type=float, default=3 * 3600, help="seconds before a run is killed")
    parser.add_argument("--show-output", action="store_true", help="echo the runs' other output as it comes")
    parser.add_argument(
        "--out", default=str(BENCH_DIR / "results" / datetime.date.today().isoformat()),
        help="folder of memory_ppo.json and memory_ppo.png",
    )  # fmt: skip
    parser.add_argument("--child", choices=("ours", "sb3"), help=argparse.SUPPRESS)
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.seed = args.seeds[0]
    return args


def main() -> None:
    args = parse_args()
    if args.child == "ours":
        run_ours_child(args)
        return
    if args.child == "sb3":
        run_sb3_child(args)
        return
    info = print_versions()
    load_before = load_average()
    print(
        f"arms {args.arms}, seeds {args.seeds}, {args.max_env_steps} env steps per run, {args.threads} thread(s) "
        f"per run; load average {load_before}"
    )
    records = []
    for index, seed in enumerate(args.seeds):
        for arm in rotated(list(args.arms), index):
            print(f"running {arm} seed {seed} ...", flush=True)
            started = time.perf_counter()
            record = run_child(child_command(arm, seed, args), arm, seed, args)
            record["wall_s"] = time.perf_counter() - started
            if record["status"] != "DONE":
                # Say why at once: an arm that cannot run yet (lstm before recurrent PPO) is skipped.
                reason = record.get("reason") or " / ".join(record.get("error_tail", [])[-2:]) or "no output"
                record["reason"] = f"{record['status']}: {reason}"
                print(f"  skipped {arm} seed {seed}: {record['reason']}", flush=True)
            records.append(record)
    print_table(records)
    summary = summarize(records, list(args.arms))
    print_summary(summary, args.max_env_steps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(records, list(args.arms), out / "memory_ppo.png", args.max_env_steps)
    payload = {
        "args": {k: v for k, v in vars(args).items() if k not in ("child", "arm")},
        "versions": {**info, "sb3-contrib": _version("sb3-contrib")},
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "runs": records,
        "summary": summary,
    }
    write_json(str(out / "memory_ppo.json"), payload)


def _version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
