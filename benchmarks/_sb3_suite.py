"""The SB3 side of ``benchmarks/suite.py``: Stable-Baselines3's PPO, SAC or DQN from our run's hyperparameters.

The run file holds our run's effective hyperparameters (the Learner's and the data module's
init arguments, see ``off_policy.effective_hparams``). SAC and DQN map as
``benchmarks/_sb3_off_policy.py`` says. PPO maps as follows:

  env       ``make_vec_env(env, n_envs=num_envs, seed=seed, env_kwargs=env_kwargs,
            vec_env_cls=DummyVecEnv)`` (env i starts at seed + i, as ours), wrapped in
            ``VecNormalize(norm_obs=normalize_observations, norm_reward=normalize_rewards,
            clip_obs=clip_reward=normalization_clip, gamma=normalization_gamma)`` when the
            config normalizes; evaluation acts on observations normalized by its statistics
            (``normalize_obs``, which does not update them), as ours does.
  rollout   ``n_steps=rollout_fragment_length``, ``batch_size=minibatch_size`` (None: the
            whole rollout), ``n_epochs=num_epochs``, ``gamma``, ``gae_lambda``.
  loss      ``clip_range=clip_param``, ``ent_coef=entropy_coeff``, ``vf_coef=vf_loss_coeff``,
            ``normalize_advantage=normalize_advantages``, ``max_grad_norm=grad_clip``
            (inf for none), no value clipping (SB3's ``clip_range_vf`` clips the value's
            change, ours' ``vf_clip_param`` the squared error: a config must set it to null).
  schedules ``learning_rate`` and ``clip_range`` may be our piecewise lists: SB3 calls them
            with ``progress_remaining = 1 - num_timesteps / total_timesteps`` after each
            rollout, which is turned back into the env-step count our schedule reads then.
  network   ``policy_kwargs`` from the ``model_config`` (``sb3_policy_kwargs``):
            ``net_arch=dict(pi=..., vf=...)`` from ``pi_fcnet_hiddens`` / ``vf_fcnet_hiddens``
            (each ``fcnet_hiddens`` when unset), ``activation_fn`` from the activation both
            networks share, ``ortho_init`` (SB3's gains sqrt(2), 0.01 for the policy head, 1
            for the value head, as ours; off: PyTorch's default init in both), ``log_std_init``
            (the state-independent log std's start, ours: ``free_log_std``); Adam with eps 1e-5
            (both).

Not mapped, so refused: shared actor/critic layers (``vf_share_layers``), policy and value
networks of different activations (SB3 has one ``activation_fn``), a KL loss,
``shuffle_batch_per_epoch: false``, entropy schedules, clipping by value, env factories or
wrappers (the env must be a registered id).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecNormalize

from lightning_rl.core.encoders import OBSERVATION_ENCODER_KEYS
from lightning_rl.core.mlp import separate_network_layers
from lightning_rl.core.recurrent import RECURRENT_KEYS

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from _handwritten_common import ACTIVATIONS
from _sb3_off_policy import EvaluateAndTime, dqn, first_update, sac, sb3_schedule
from _sb3_off_policy import unsupported as unsupported_off_policy
from off_policy import ChildClock, GreedyEvaluation


# The PPOModule's model_config keys this file maps onto SB3's policy (sb3_policy_kwargs).
MAPPED_MODEL_CONFIG = {
    "fcnet_hiddens", "fcnet_activation", "vf_share_layers", "free_log_std", "log_std_init", "ortho_init",
    "pi_fcnet_hiddens", "pi_fcnet_activation", "vf_fcnet_hiddens", "vf_fcnet_activation",
}  # fmt: skip
# The observation encoder's keys act on image observations alone: at their defaults they leave
# the flat observations of the runs SB3's MlpPolicy takes here as they are.
ENCODER_DEFAULTS = {key: spec.default for key, spec in OBSERVATION_ENCODER_KEYS.items()}
# The recurrent keys at their defaults (use_lstm off) leave a feed-forward policy, which SB3's
# MlpPolicy is; a recurrent one is refused (sb3-contrib's RecurrentPPO: benchmarks/memory_ppo.py).
RECURRENT_DEFAULTS = {key: spec.default for key, spec in RECURRENT_KEYS.items()}


def unsupported_ppo(model: dict[str, Any], data: dict[str, Any]) -> str | None:
    """What of a PPO config has no SB3 equivalent here (the run is then refused), or None."""
    net = model["model_config"]
    pi_activation = separate_network_layers(net, "pi")[1]
    vf_activation = separate_network_layers(net, "vf")[1]
    checks = [
        (model["vf_clip_param"] is None, f"vf_clip_param={model['vf_clip_param']!r} (set it to null)"),
        (not model["use_kl_loss"], "use_kl_loss"),
        (not net["vf_share_layers"], "vf_share_layers"),
        (net["free_log_std"], "free_log_std=False"),
        (model["shuffle_batch_per_epoch"], "shuffle_batch_per_epoch=False"),
        (isinstance(model["entropy_coeff"], (int, float)), f"entropy_coeff schedule {model['entropy_coeff']!r}"),
        (model["grad_clip"] is None or model["grad_clip_by"] == "global_norm", f"grad_clip_by={model['grad_clip_by']!r}"),
        (pi_activation == vf_activation, f"policy and value activations {pi_activation!r} and {vf_activation!r}"),
        (pi_activation in ACTIVATIONS, f"activation {pi_activation!r}"),
        (set(net) <= MAPPED_MODEL_CONFIG | ENCODER_DEFAULTS.keys() | RECURRENT_DEFAULTS.keys(),
         f"model_config keys {sorted(set(net) - MAPPED_MODEL_CONFIG - ENCODER_DEFAULTS.keys() - RECURRENT_DEFAULTS.keys())}"),
        (not net.get("use_lstm", False), "use_lstm (a recurrent policy: see benchmarks/memory_ppo.py)"),
        (all(net.get(key, value) == value for key, value in ENCODER_DEFAULTS.items()),
         "conv_filters, conv_activation or image_layout (the CNN of image observations)"),
        (isinstance(data["env"], str) and not (data["wrappers"] or data["evaluation_wrappers"]), "env callables or wrappers"),
    ]  # fmt: skip
    missing = [what for ok, what in checks if not ok]
    return ", ".join(missing) if missing else None


def sb3_policy_kwargs(model_config: dict[str, Any]) -> dict[str, Any]:
    """SB3's ``MlpPolicy`` ``policy_kwargs`` of the same networks as a ``PPOModule`` of ``model_config``.

    Args:
        model_config: The module's resolved ``model_config`` (every key set), one that
            ``unsupported_ppo`` passes: separate networks of one activation, a free log std.
    """
    pi_hiddens, activation = separate_network_layers(model_config, "pi")
    vf_hiddens, _ = separate_network_layers(model_config, "vf")  # its activation is the same (unsupported_ppo)
    return {
        "net_arch": {"pi": pi_hiddens, "vf": vf_hiddens},
        "activation_fn": ACTIVATIONS[activation],
        "ortho_init": model_config["ortho_init"],
        "log_std_init": float(model_config["log_std_init"]),
    }


def ppo(model: dict[str, Any], data: dict[str, Any], env: VecEnv, budget: int, seed: int) -> PPO:
    """SB3's PPO with our run's settings (see the module docstring)."""
    rollout = data["num_envs"] * data["rollout_fragment_length"]
    return PPO(
        "MlpPolicy",
        env,
        learning_rate=sb3_schedule(model["lr"], budget),
        n_steps=data["rollout_fragment_length"],
        batch_size=model["minibatch_size"] or rollout,
        n_epochs=model["num_epochs"],
        gamma=model["gamma"],
        gae_lambda=model["gae_lambda"],
        clip_range=sb3_schedule(model["clip_param"], budget),
        normalize_advantage=model["normalize_advantages"],
        ent_coef=model["entropy_coeff"],
        vf_coef=model["vf_loss_coeff"],
        max_grad_norm=math.inf if model["grad_clip"] is None else model["grad_clip"],
        policy_kwargs=sb3_policy_kwargs(model["model_config"]),
        device="cpu",
        seed=seed,
    )


def run_sb3(
    record: dict[str, Any], clock: ChildClock, callbacks: Sequence[BaseCallback] = (), save_to: Path | None = None
) -> Callable[[np.ndarray], np.ndarray]:
    """Train SB3 on the run ``record`` describes, evaluating as ours does.

    Args:
        record: The run file's record; SB3's ``notes`` (where it differs) are added to it.
        clock: Told when training starts, around each evaluation and at the end (the
            suite's ``RunRecorder``, which writes ``record`` each time).
        callbacks: More SB3 callbacks for ``learn``, after the evaluation's (e.g.
            ``dqn_q_stats.py``'s recorder).
        save_to: Where to save the trained model (``agent.save``, a ``.zip``; with
            ``VecNormalize``'s statistics beside it, ``.vecnormalize.pkl``), if anywhere.

    Returns:
        The trained agent's greedy action for a batch of raw observations (normalized as in
        training when the config normalizes them).

    Raises:
        SystemExit: If the config has no SB3 equivalent here (naming what).
    """
    algo, seed, budget = record["algo"], record["seed"], record["max_env_steps"]
    model, data = record["hparams"]["model"], record["hparams"]["data"]
    reason = unsupported_ppo(model, data) if algo == "ppo" else unsupported_off_policy(algo, model, data)
    if reason:
        raise SystemExit(f"SB3 has no equivalent of {reason}")
    env: VecEnv = make_vec_env(data["env"], n_envs=data["num_envs"], seed=seed, vec_env_cls=DummyVecEnv,
                               env_kwargs=data["env_kwargs"])  # fmt: skip
    normalize = data.get("normalize_observations") or data.get("normalize_rewards")
    if normalize:
        clip = data["normalization_clip"]
        env = VecNormalize(env, norm_obs=data["normalize_observations"], norm_reward=data["normalize_rewards"],
                           clip_obs=clip, clip_reward=clip, gamma=data["normalization_gamma"])  # fmt: skip
    agent: BaseAlgorithm
    notes: list[str] = []
    if algo == "ppo":
        agent = ppo(model, data, env, budget, seed)
    elif algo == "dqn":
        agent, notes = dqn(model, data, env, budget, seed)
    else:
        agent, notes = sac(model, data, env, budget, seed)
    if algo != "ppo":
        ours_first = first_update(data["train_freq"], data["learning_starts"], strictly_more=False)
        sb3_first = first_update(data["train_freq"], data["learning_starts"], strictly_more=True)
        if ours_first != sb3_first:
            notes.append(f"SB3's first update comes after {sb3_first} env steps, ours after {ours_first}")
    record["notes"] = notes  # written with the clock's next update (it holds this record)

    evaluation = GreedyEvaluation(data, seed)
    if normalize and data["normalize_observations"]:

        def act(obs: np.ndarray) -> np.ndarray:
            return agent.predict(env.normalize_obs(obs), deterministic=True)[0]

    else:

        def act(obs: np.ndarray) -> np.ndarray:
            return agent.predict(obs, deterministic=True)[0]

    callback = EvaluateAndTime(clock, evaluation, data, act)
    agent.learn(total_timesteps=budget, callback=[callback, *callbacks])
    callback.evaluate()  # after the last update (its rollout's evaluation would come at the next rollout's start)
    clock.training_end(agent.num_timesteps, torch.get_num_threads())
    if save_to is not None:
        agent.save(save_to)
        if normalize:
            env.save(str(save_to.with_suffix(".vecnormalize.pkl")))
    env.close()
    evaluation.close()
    return act


def saved_act(record: dict[str, Any], path: Path) -> Callable[[np.ndarray], np.ndarray]:
    """The greedy policy ``run_sb3(record, ..., save_to=path)`` saved, read back: what its final evaluation played.

    Observations are normalized by the saved ``VecNormalize`` statistics when the run
    normalized them, as the run's own evaluation did.
    """
    agent = {"ppo": PPO, "dqn": DQN, "sac": SAC}[record["algo"]].load(path, device="cpu")
    data = record["hparams"]["data"]
    if not data.get("normalize_observations"):
        return lambda obs: agent.predict(obs, deterministic=True)[0]
    # VecNormalize.load needs an env of the right spaces to wrap; only its statistics are used.
    env = make_vec_env(data["env"], n_envs=1, env_kwargs=data["env_kwargs"], vec_env_cls=DummyVecEnv)
    statistics = VecNormalize.load(str(path.with_suffix(".vecnormalize.pkl")), env)
    return lambda obs: agent.predict(statistics.normalize_obs(obs), deterministic=True)[0]
