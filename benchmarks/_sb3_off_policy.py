"""Child script of ``benchmarks/off_policy.py``: Stable-Baselines3's DQN or SAC with our config's settings.

The parent passes our run's effective hyperparameters (``--hparams``, the model's and the
data module's init arguments). They map onto SB3 as follows; SB3 counts ``train_freq`` in
vector steps and ``learning_starts`` / DQN's ``target_update_interval`` in env steps:

  both   ``make_vec_env(env, n_envs=num_envs, seed=seed, vec_env_cls=DummyVecEnv)``;
         ``buffer_size=replay_buffer_capacity``, ``learning_starts``, ``batch_size=minibatch_size``,
         ``gamma``, ``tau``, ``train_freq=(train_freq // num_envs, "step")``, ``gradient_steps``,
         ``n_steps=n_step``, ``policy_kwargs=dict(net_arch=fcnet_hiddens,
         activation_fn=fcnet_activation)``; ``learn(total_timesteps=--max-env-steps)``. SB3
         also acts uniformly at random before ``learning_starts`` (per env step, where ours
         decides per train item), but takes its first update only once it holds *more*
         than ``learning_starts`` steps (ours: at least): a ``NOTE`` says when that moves
         the first update.
  DQN    ``learning_rate=lr`` (a schedule ``[[timestep, lr], ...]`` as a function of SB3's
         progress, ``sb3_schedule``), ``max_grad_norm=grad_clip`` (inf for none), epsilon
         ``[[0, e0], [T, e1]]`` as ``exploration_initial_eps=e0``, ``exploration_final_eps=e1``,
         ``exploration_fraction=T / total_timesteps`` (SB3 moves epsilon per vector step,
         ours per train item, and flips one coin per vector step where ours flips one per
         env); ``target_update_interval = target_network_update_freq * train_freq /
         gradient_steps`` env steps, the env steps between our syncs: SB3 syncs during
         collection, between its updates, and a ``NOTE`` says whether it then syncs after
         the same updates as ours. SB3's DQN is vanilla DQN: the target network both picks
         and values the bootstrap action (no double Q), no dueling heads, and its loss is
         always the Huber loss (``smooth_l1_loss``, delta 1, the same function as our
         ``td_error_loss_fn: huber``); ``NOTE`` lines name what the config sets otherwise.
  SAC    ``learning_rate``: SB3 has one for actor, critics and temperature (a ``NOTE`` if
         ours differ; the critics' is used), ``ent_coef="auto_<initial_alpha>"``,
         ``target_entropy`` (``"auto"`` is ``-dim(A)`` in both), ``target_update_interval=
         target_network_update_freq`` (SB3 counts it within each update's gradient steps,
         ours over the run: the same for 1). SB3 steps the temperature, then the critics,
         then the actor against the just-updated critics; ours computes the three losses
         from the same weights. SB3's SAC does not clip gradients (a ``NOTE`` if ours does).

Evaluation is the parent's (``off_policy.GreedyEvaluation`` with ``model.predict(obs,
deterministic=True)``), after every ``rollouts_per_epoch`` rollouts (train items), between
an update and the next collection, and after the last; its time is not training time.

Output protocol: that of ``off_policy.ChildClock``, plus ``NOTE <text>`` lines. Needs
``pip install stable-baselines3`` (the ``bench`` extra).

Run alone::

    python benchmarks/_sb3_off_policy.py --max-env-steps 50000 --seed 0 \\
        --hparams "$(python benchmarks/off_policy.py --algo dqn --print-hparams)"
"""

from __future__ import annotations

import time

START_TIME = time.time()  # before the heavy imports: the run's clock starts with the script

import bisect
import json
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from stable_baselines3 import DQN, SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from _handwritten_common import ACTIVATIONS
from off_policy import ChildClock, GreedyEvaluation, child_parser, evaluation_due, unavailable


def unsupported(algo: str, model: dict[str, Any], data: dict[str, Any]) -> str | None:
    """What of the config has no SB3 equivalent here (the run is then left out), or None."""
    checks = [
        (not data["prioritized_replay"], "prioritized_replay"),
        (
            isinstance(data["env"], str) and not (data["wrappers"] or data["evaluation_wrappers"]),
            "env callables or wrappers",
        ),
        (data["random_actions_before_learning_starts"], "random_actions_before_learning_starts=False"),
        (
            model["model_config"]["fcnet_activation"] in ACTIVATIONS,
            f"activation {model['model_config']['fcnet_activation']!r}",
        ),
        (data["train_freq"] % data["num_envs"] == 0, "train_freq not a multiple of num_envs"),
    ]
    if algo == "dqn":
        epsilon = model["epsilon"]
        checks += [
            (model["grad_clip"] is None or model["grad_clip_by"] == "global_norm", f"grad_clip_by={model['grad_clip_by']!r}"),
            (not isinstance(epsilon, list) or (len(epsilon) <= 2 and epsilon[0][0] == 0),
             f"epsilon schedule {epsilon!r} (SB3 anneals linearly from step 0, once)"),
        ]  # fmt: skip
    missing = [what for ok, what in checks if not ok]
    return ", ".join(missing) if missing else None


def sb3_schedule(setting: float | list[list[float]], total_timesteps: int) -> float | Callable[[float], float]:
    """Our schedule setting as SB3 takes it: a number, or a function of SB3's ``progress_remaining``.

    Our piecewise-linear ``[[timestep, value], ...]`` (held constant outside its timesteps)
    is read at ``(1 - progress_remaining) * total_timesteps`` env steps.
    """
    if isinstance(setting, (int, float)):
        return float(setting)
    timesteps, values = zip(*setting)

    def schedule(progress_remaining: float) -> float:
        return float(np.interp((1.0 - progress_remaining) * total_timesteps, timesteps, values))

    return schedule


def per_optimizer(model: dict[str, Any], name: str) -> dict[str, Any]:
    """SAC's ``actor_<name>``, ``critic_<name>``, ``alpha_<name>``, each defaulting to the Learner's ``<name>``."""
    return {
        w: model[name] if model[f"{w}_{name}"] is None else model[f"{w}_{name}"] for w in ("actor", "critic", "alpha")
    }


def first_update(train_freq: int, learning_starts: int, strictly_more: bool) -> int:
    """Env steps sampled when the first update comes: after the first item with >= (or >) ``learning_starts``."""
    items = learning_starts // train_freq + (1 if strictly_more or learning_starts % train_freq else 0)
    return max(items, 1) * train_freq


def dqn_sync_note(model: dict[str, Any], data: dict[str, Any], interval: int, budget: int) -> str:
    """Whether SB3's target syncs (every ``interval`` env steps) fall after the same updates as ours.

    Simulates both schedules over the run: ours syncs after every ``target_network_update_freq``-th
    gradient step (counted over the run, ``gradient_steps`` per update); SB3 syncs at vector
    steps that are multiples of ``interval // num_envs``, during collection, i.e. after the
    updates of the earlier items. Syncs before the first update or after the last common
    one change nothing and are not compared.
    """
    tf, n, ls = data["train_freq"], data["num_envs"], data["learning_starts"]
    freq, steps = model["target_network_update_freq"], model["gradient_steps"]
    items = math.ceil(budget / tf)
    ours_updates = [k for k in range(1, items + 1) if k * tf >= ls]
    sb3_updates = [k for k in range(1, items + 1) if k * tf > ls]
    ours: Counter[float] = Counter()
    for j in range(1, len(ours_updates) + 1):
        for s in range((j - 1) * steps + 1, j * steps + 1):
            if s % freq == 0:
                ours[j if s == j * steps else j - 0.5] += 1  # j - 0.5: in the middle of update j
    sb3: Counter[float] = Counter()
    per_vector_step = max(interval // n, 1)
    for c in range(per_vector_step, items * (tf // n) + 1, per_vector_step):
        item = math.ceil(c / (tf // n))
        sb3[bisect.bisect_left(sb3_updates, item)] += 1  # the updates before this item (sorted)
    common = min(len(ours_updates), len(sb3_updates))
    ours_j = sorted((j, c) for j, c in ours.items() if 0 < j < common)
    sb3_j = sorted((j, c) for j, c in sb3.items() if 0 < j < common)
    head = (f"target network: SB3 target_update_interval={interval} env steps for our target_network_update_freq="
            f"{freq} gradient steps with {steps} per update of {tf} env steps")  # fmt: skip
    if ours_j == sb3_j:
        return f"{head}: SB3 syncs after the same updates as ours"
    return f"{head}: NOT after the same updates ((update, syncs) pairs): ours {ours_j[:4]}..., SB3 {sb3_j[:4]}..."


def dqn(
    model: dict[str, Any], data: dict[str, Any], env: Any, budget: int, seed: int, device: str = "cpu"
) -> tuple[DQN, list[str]]:
    notes = []
    net = model["model_config"]
    if model["double_q"]:
        notes.append("SB3's DQN is vanilla DQN: the target network picks the bootstrap action (ours: double Q)")
    if net.get("dueling"):
        notes.append("SB3's DQN has no dueling heads (ours: dueling)")
    if model["td_error_loss_fn"] != "huber":
        notes.append(f"SB3's DQN loss is Huber (ours: {model['td_error_loss_fn']})")
    epsilon = model["epsilon"] if isinstance(model["epsilon"], list) else [[0, model["epsilon"]]]
    (_, eps_start), (eps_end_step, eps_end) = epsilon[0], epsilon[-1]
    tf, steps, freq = data["train_freq"], model["gradient_steps"], model["target_network_update_freq"]
    exact_interval = freq * tf / steps  # env steps between our syncs
    interval = max(round(exact_interval), data["num_envs"])
    if interval != exact_interval:
        notes.append(f"our target sync every {exact_interval:g} env steps is not an SB3 interval; SB3 uses {interval}")
    notes.append(dqn_sync_note(model, data, interval, budget))
    agent = DQN(
        "MlpPolicy",
        env,
        learning_rate=sb3_schedule(model["lr"], budget),
        buffer_size=data["replay_buffer_capacity"],
        learning_starts=data["learning_starts"],
        batch_size=model["minibatch_size"],
        tau=model["tau"],
        gamma=model["gamma"],
        train_freq=(tf // data["num_envs"], "step"),
        gradient_steps=steps,
        n_steps=model["n_step"],
        target_update_interval=interval,
        exploration_initial_eps=eps_start,
        exploration_final_eps=eps_end,
        exploration_fraction=eps_end_step / budget if eps_end_step > 0 else 1.0,
        max_grad_norm=math.inf if model["grad_clip"] is None else model["grad_clip"],
        policy_kwargs={"net_arch": list(net["fcnet_hiddens"]), "activation_fn": ACTIVATIONS[net["fcnet_activation"]]},
        device=device,
        seed=seed,
    )
    return agent, notes


def sac(
    model: dict[str, Any], data: dict[str, Any], env: Any, budget: int, seed: int, device: str = "cpu"
) -> tuple[SAC, list[str]]:
    notes = []
    net = model["model_config"]
    lrs = per_optimizer(model, "lr")
    if any(lr != lrs["critic"] for lr in lrs.values()):
        notes.append(f"SB3's SAC has one learning rate; ours are {lrs}: SB3 uses the critics' for all three")
    clips = per_optimizer(model, "grad_clip")
    if any(clip is not None for clip in clips.values()):
        notes.append(f"SB3's SAC does not clip gradients (ours: {clips})")
    if model["target_network_update_freq"] != 1:
        notes.append(
            "SB3 counts target_update_interval within each update's gradient steps, ours over the run: "
            f"target_network_update_freq={model['target_network_update_freq']} syncs at other steps"
        )
    agent = SAC(
        "MlpPolicy",
        env,
        learning_rate=sb3_schedule(lrs["critic"], budget),
        buffer_size=data["replay_buffer_capacity"],
        learning_starts=data["learning_starts"],
        batch_size=model["minibatch_size"],
        tau=model["tau"],
        gamma=model["gamma"],
        train_freq=(data["train_freq"] // data["num_envs"], "step"),
        gradient_steps=model["gradient_steps"],
        n_steps=model["n_step"],
        ent_coef=f"auto_{model['initial_alpha']}",
        target_entropy=model["target_entropy"],
        target_update_interval=model["target_network_update_freq"],
        policy_kwargs={"net_arch": list(net["fcnet_hiddens"]), "activation_fn": ACTIVATIONS[net["fcnet_activation"]]},
        device=device,
        seed=seed,
    )
    return agent, notes


class EvaluateAndTime(BaseCallback):
    """Starts the training clock; evaluates after every ``rollouts_per_epoch`` rollouts (each one train item).

    ``on_rollout_start`` comes after the previous rollout's update, so an evaluation there sees
    the weights ours would evaluate at its epoch end.

    Args:
        clock: What is told when training starts and around each evaluation.
        evaluation: The greedy episodes to play.
        data: Our data module's hyperparameters (``rollouts_per_epoch``).
        act: Observations of the evaluation envs -> actions; default: the model's greedy
            ``predict`` (pass one that normalizes observations first when the model
            trains on a ``VecNormalize`` env).
    """

    def __init__(
        self,
        clock: ChildClock,
        evaluation: GreedyEvaluation,
        data: dict[str, Any],
        act: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        super().__init__()
        self.clock, self.evaluation, self.data = clock, evaluation, data
        self.act = act or (lambda obs: self.model.predict(obs, deterministic=True)[0])
        self.items = 0

    def _on_training_start(self) -> None:
        self.clock.training_start()

    def _on_rollout_start(self) -> None:
        if self.items and evaluation_due(self.items, self.data):
            self.evaluate()

    def _on_rollout_end(self) -> None:
        self.items += 1

    def _on_step(self) -> bool:
        return True

    def evaluate(self) -> None:
        """Play the evaluation episodes greedily with the current weights."""
        self.clock.evaluation_started()
        self.clock.evaluation_finished(self.model.num_timesteps, self.evaluation.run(self.act))


def main() -> None:
    args = child_parser(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    hparams = json.loads(args.hparams)
    algo, model, data = hparams["algo"], hparams["model"], hparams["data"]
    reason = unsupported(algo, model, data)
    if reason:
        unavailable(f"SB3 has no equivalent of {reason}")
        return
    env = make_vec_env(data["env"], n_envs=data["num_envs"], seed=args.seed, vec_env_cls=DummyVecEnv,
                       env_kwargs=data["env_kwargs"])  # fmt: skip
    agent: BaseAlgorithm
    if algo == "dqn":
        agent, notes = dqn(model, data, env, args.max_env_steps, args.seed, args.device)
    else:
        agent, notes = sac(model, data, env, args.max_env_steps, args.seed, args.device)
    tf, ls = data["train_freq"], data["learning_starts"]
    ours_first, sb3_first = first_update(tf, ls, strictly_more=False), first_update(tf, ls, strictly_more=True)
    if ours_first != sb3_first:
        notes.append(f"SB3's first update comes after {sb3_first} env steps, ours after {ours_first}")
    for note in notes:
        print(f"NOTE {note}", flush=True)

    clock = ChildClock()
    evaluation = GreedyEvaluation(data, args.seed)
    callback = EvaluateAndTime(clock, evaluation, data)
    agent.learn(total_timesteps=args.max_env_steps, callback=callback)
    callback.evaluate()  # after the last update (its rollout's evaluation would come at the next rollout's start)
    clock.training_end(agent.num_timesteps, torch.get_num_threads())
    env.close()
    evaluation.close()
    clock.finish()


if __name__ == "__main__":
    main()
