"""``MultiAgentDataModule``: on-policy rollouts of a PettingZoo environment, for several RL modules at once.

The multi-agent counterpart of ``OnPolicyDataModule``. Each train item is one rollout of this
rank's env copies, sampled with the Learner's current modules: every agent acts with the module
``policy_mapping_fn`` maps it to, one forward pass per module per step. The item holds
``MultiAgentEpisode`` chunks; the Learner's connector splits them into each agent's own
trajectory, batches the agents by module and trains every module in ``policies_to_train``.

Evaluation plays complete episodes with the training mapping (``eval/episode_return_mean`` is
the sum over agents, RLlib's convention) and, for each name in ``evaluation_opponents``, as
many games of the Learner's ``evaluation_module_id`` against that fixed opponent, half in each
seat: ``eval/win_rate_vs_<name>``.

A callback may change the mapping while training runs (``set_policy_mapping_fn``; the self-play
league does) and play matches of its own (``play_episodes``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from lightning_rl.core.arguments import check_bool, check_choice, check_int, check_num_envs, check_number
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.core.data_contract import ENV_STEPS, DataOffer, SpacePair
from lightning_rl.core.rl_modules import MultiRLModule
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.data.acting_module import learner_acting_modules
from lightning_rl.data.ranked_datamodule import EVALUATION_SEED_OFFSET, RankedDataModule
from lightning_rl.env.matches import seat_mapping, win_rate
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode
from lightning_rl.env.multi_agent_runner import (
    MULTI_AGENT_VECTORIZE_MODES,
    MultiAgentEnvRunner,
    MultiAgentVectorizeMode,
)
from lightning_rl.env.nonfinite import ON_NONFINITE_CHOICES, OnNonFinite
from lightning_rl.env.opponents import OPPONENTS
from lightning_rl.env.pettingzoo_env import check_pettingzoo_env_name
from lightning_rl.env.policy_mapping import PolicyMappingFn, resolve_policy_mapping_fn

NUM_AGENT_STEPS_SAMPLED_LIFETIME = "num_agent_steps_sampled_lifetime"
# The module id an evaluation opponent plays under, beside the main module alone.
OPPONENT_MODULE_ID = "fixed_opponent"
# Counters summed over the ranks; every other statistic is averaged over the ranks that have it.
_SUMMED = (
    "num_episodes",
    "num_episodes_lifetime",
    "num_env_steps_sampled",
    "num_agent_steps_sampled",
    "num_env_steps_sampled_lifetime",
    "num_agent_steps_sampled_lifetime",
    "env_steps_per_sec",
)
_EXTREMES = {"episode_return_min": np.nanmin, "episode_return_max": np.nanmax}
# The statistics every runner reports (``MultiAgentEnvRunner.get_metrics``), besides the per-agent and per-module returns.
_RUNNER_KEYS = _SUMMED + ("episode_return_mean", "episode_return_min", "episode_return_max", "episode_len_mean")


class MultiAgentDataModule(RankedDataModule):
    """Samples on-policy rollouts of a PettingZoo environment for PPO-like Learners with several modules.

    On several ranks each rank samples its own env copies, seeded apart, and every size below is
    per rank except ``max_env_steps`` and ``evaluation_num_episodes``, which count over all ranks.

    Args:
        env: A PettingZoo env by import path: a module with ``parallel_env`` (used when it has
            one: ``"mpe2.simple_spread_v3"``) or ``env`` (the turn-based AEC API:
            ``"pettingzoo.classic.connect_four_v3"``), or ``"package.module.factory"`` naming a
            function that returns a Parallel or AEC env; or such a callable itself.
        env_kwargs: Keyword arguments for the env constructor (``{"N": 3, "max_cycles": 25}``).
        policy_mapping_fn: Which module each agent acts with: ``"shared"`` (every agent uses
            ``default_policy``), ``"per_agent"`` (a module per agent, named after it), or a
            callable ``(agent_id, episode) -> module_id``, called once per agent per episode.
        num_envs: Env copies stepped together per rollout, per rank.
        rollout_fragment_length: Env steps per env copy per rollout (a turn-based env takes one
            agent's move per env step). Episodes still running are cut and continue in the next
            rollout.
        seed: Base seed: rank ``r``'s env copy ``i`` first resets with ``seed + r * 10_000_000 + i``
            (evaluation copies ``1_000_003`` further on). ``None`` draws one from numpy's global
            generator (``seed_everything`` seeds it).
        rollouts_per_epoch: Train items per Lightning epoch (evaluation and checkpoints happen at
            epoch ends).
        max_env_steps: Stop once this many env steps were sampled over all ranks and the whole run.
        evaluation_num_episodes: Complete episodes per evaluation over all ranks, with the training
            mapping; and as many per opponent in ``evaluation_opponents``.
        evaluation_num_envs: Env copies stepped together during evaluation (default ``num_envs``),
            at most the episodes this rank plays.
        evaluation_explore: Whether evaluation samples actions instead of acting greedily.
        evaluation_opponents: Fixed opponents to measure ``evaluation_module_id`` against, by name:
            ``"random"`` (uniform over legal moves) and ``"heuristic"`` (connect four: win, else
            block, else random). Logged as ``eval/win_rate_vs_<name>`` (mean over both seats).
        evaluation_module_id: The Learner's module that plays the opponents; needed with
            ``evaluation_opponents``.
        episode_stats_window: Completed episodes per rank behind the ``env_runners`` returns.
        sample_timeout_s: The most seconds one rollout (or evaluation) may take on a rank: a
            ``SampleTimeoutError`` naming the env copy that did not return ends the fit, where a
            hanging env would hang it for good; ``None`` waits forever. Env exceptions and NaN or
            infinite rewards and observations are errors naming the copy, the agent and the step.
        on_nonfinite: ``"raise"`` (default) for a NaN or infinite reward or observation, or
            ``"drop_episode"`` to throw that episode away and go on (see ``MultiAgentEnvRunner``).
        restart_failed_sub_environments: Rebuild an env copy that raises (or, with
            ``vectorize_mode="async"``, whose worker dies or hangs past ``sample_timeout_s``),
            drop its unfinished episode and go on (counted as
            ``env_runners/num_env_restarts_lifetime``), instead of ending the fit with the error.
        vectorize_mode: ``"sync"`` (default) steps the env copies one after the other in the
            training process; ``"async"`` steps each in a worker process of its own, in
            parallel, where a hang (even in C code, which ``"sync"`` cannot interrupt) ends
            in ``sample_timeout_s`` and SIGTERM stops the fit at once (see
            ``MultiAgentEnvRunner``). The modules act in the training process either way, and
            a seed gives the same episodes in both modes.

    Raises:
        ValueError: Naming the argument, for an env path that names nothing, an unknown mapping
            or opponent name, invalid sizes or a negative seed.
    """

    def __init__(
        self,
        env: str | Callable[..., Any],
        *,
        env_kwargs: dict[str, Any] | None = None,
        policy_mapping_fn: str | PolicyMappingFn = "shared",
        num_envs: int = 1,
        rollout_fragment_length: int = 100,
        seed: int | None = None,
        rollouts_per_epoch: int = 10,
        max_env_steps: int | None = None,
        evaluation_num_episodes: int = 10,
        evaluation_num_envs: int | None = None,
        evaluation_explore: bool = False,
        evaluation_opponents: Sequence[str] = (),
        evaluation_module_id: str | None = None,
        episode_stats_window: int = 100,
        sample_timeout_s: float | None = 60.0,
        on_nonfinite: OnNonFinite = "raise",
        restart_failed_sub_environments: bool = False,
        vectorize_mode: MultiAgentVectorizeMode = "sync",
    ) -> None:
        super().__init__(
            seed=seed, evaluation_num_episodes=evaluation_num_episodes, evaluation_num_envs=evaluation_num_envs
        )
        if isinstance(env, str):
            check_pettingzoo_env_name(env)
        elif not callable(env):
            raise ValueError(f"env must be a PettingZoo env import path or a callable that makes one, got {env!r}")
        self.policy_mapping_fn = resolve_policy_mapping_fn(policy_mapping_fn)
        check_num_envs("num_envs", num_envs)
        check_number("sample_timeout_s", sample_timeout_s, low=0, low_open=True, finite=True, optional=True)
        if on_nonfinite not in ON_NONFINITE_CHOICES:
            raise ValueError(f"on_nonfinite must be one of {list(ON_NONFINITE_CHOICES)}, got {on_nonfinite!r}")
        check_bool("restart_failed_sub_environments", restart_failed_sub_environments)
        check_choice("vectorize_mode", vectorize_mode, choices=MULTI_AGENT_VECTORIZE_MODES)
        for name, value in (
            ("rollout_fragment_length", rollout_fragment_length),
            ("rollouts_per_epoch", rollouts_per_epoch),
            ("episode_stats_window", episode_stats_window),
        ):
            check_int(name, value)
        check_int("max_env_steps", max_env_steps, optional=True)
        self.evaluation_opponents = list(evaluation_opponents)
        unknown = [name for name in self.evaluation_opponents if name not in OPPONENTS]
        if unknown:
            raise ValueError(f"evaluation_opponents: unknown opponents {unknown}; known: {sorted(OPPONENTS)}")
        if self.evaluation_opponents and evaluation_module_id is None:
            raise ValueError(
                "evaluation_opponents need evaluation_module_id: the Learner's module that plays them (e.g. 'main')"
            )
        # Callables are not plain data: keep them out of the hyperparameters saved in checkpoints.
        ignore = [name for name, value in (("env", env), ("policy_mapping_fn", policy_mapping_fn)) if callable(value)]
        self.save_hyperparameters(ignore=ignore)
        self.env = env
        # The env- and agent-step counters over all ranks, by the names the timesteps and the state use.
        self._lifetime = {NUM_ENV_STEPS_SAMPLED_LIFETIME: 0, NUM_AGENT_STEPS_SAMPLED_LIFETIME: 0}
        # The training runner's statistics while it is closed between stages (see ``teardown``).
        self._train_runner_state: dict[str, Any] | None = None
        # The random stream actions are sampled from (see ``_sampling_stream``), made on first use.
        self._sampling_rng_state: dict[str, Any] | None = None

    # ------------------------------------------------------------------------------------
    # Runners, spaces and the mapping
    # ------------------------------------------------------------------------------------

    @functools.cached_property
    def train_runner(self) -> MultiAgentEnvRunner:
        """This rank's training env copies (built on first use; rebuilt, they go on from the last ones' statistics)."""
        runner = self._make_runner(self.hparams.num_envs, self.rank_seed(0))
        if self._train_runner_state is not None:
            runner.set_state(self._train_runner_state)
        return runner

    @functools.cached_property
    def eval_runner(self) -> MultiAgentEnvRunner:
        """This rank's evaluation env copies, apart from the training ones (built on first use)."""
        # No more copies than the episodes this rank plays: the others would only be stepped.
        num_envs = min(self.hparams.evaluation_num_envs or self.hparams.num_envs, self.evaluation_episodes_per_rank)
        return self._make_runner(num_envs, self.rank_seed(EVALUATION_SEED_OFFSET))

    @property
    def possible_agents(self) -> list[str]:
        """Every agent the env may have, as PettingZoo's ``possible_agents`` lists them."""
        return list(self.train_runner.possible_agents)

    @property
    def module_spaces(self) -> dict[str, tuple[Any, Any]]:
        """``{module_id: (observation_space, action_space)}`` of every module the mapping uses.

        The Learner builds its modules from these at ``setup`` (one per id, when its spec leaves
        the spaces out).
        """
        return self.train_runner.module_spaces()

    @property
    def env_steps_per_rollout(self) -> int:
        """Env steps per train item on one rank: ``num_envs * rollout_fragment_length``.

        Not named ``train_batch_size`` as on the single-agent data modules: a module's rows per
        rollout depend on how many agents map to it and how many steps they take, so the
        Learner's check of ``minibatch_size`` against the train batch does not apply.
        """
        return self.hparams.num_envs * self.hparams.rollout_fragment_length

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps sampled for training over all ranks and the whole run."""
        return self._lifetime[NUM_ENV_STEPS_SAMPLED_LIFETIME]

    @property
    def num_agent_steps_sampled_lifetime(self) -> int:
        """Agent steps (actions taken) sampled for training over all ranks and the whole run."""
        return self._lifetime[NUM_AGENT_STEPS_SAMPLED_LIFETIME]

    def set_policy_mapping_fn(self, policy_mapping_fn: str | PolicyMappingFn) -> None:
        """Map agents to modules with ``policy_mapping_fn`` from the next training episode on.

        Episodes already running keep the modules they were mapped to. Called by callbacks that
        change match-ups while training runs (``SelfPlayLeague``).
        """
        self.policy_mapping_fn = resolve_policy_mapping_fn(policy_mapping_fn)
        if "train_runner" in self.__dict__:
            self.train_runner.set_policy_mapping_fn(self.policy_mapping_fn)

    # ------------------------------------------------------------------------------------
    # Train and evaluation items
    # ------------------------------------------------------------------------------------

    def sample_train_item(self) -> TrainItem:
        """Sample one rollout with the current modules on this rank; return the train item.

        On several ranks this is a collective call (one ``all_gather`` of a small vector).

        Returns:
            ``TrainItem(TrainingData(episodes=[MultiAgentEpisode, ...]), timesteps=..., env_runners=...)``
            with the env- and agent-step counters summed over the ranks as timesteps.
        """
        runner = self.train_runner
        with self._acting_modules() as modules, self._sampling_stream(_device_of(modules)):
            episodes = runner.sample(modules, num_env_steps=self.hparams.rollout_fragment_length, explore=True)
        metrics = self._metrics_over_ranks(runner.get_metrics())
        self._lifetime[NUM_ENV_STEPS_SAMPLED_LIFETIME] += int(metrics["num_env_steps_sampled"])
        self._lifetime[NUM_AGENT_STEPS_SAMPLED_LIFETIME] += int(metrics["num_agent_steps_sampled"])
        metrics.update(self._lifetime)
        return TrainItem(TrainingData(episodes=episodes), timesteps=dict(self._lifetime), env_runners=metrics)

    def sample_eval_item(self) -> TrainItem:
        """Play this rank's share of the evaluation episodes, and of the games against each opponent.

        Returns:
            A ``TrainItem`` of the complete episodes played with the training mapping, with
            ``{"win_rate_vs_<name>": this rank's rate}`` in ``env_runners`` (the Learner logs them
            as ``eval/...``, averaged over the ranks, which play equal shares).
        """
        per_rank = self.evaluation_episodes_per_rank
        explore = self.hparams.evaluation_explore
        win_rates = {}
        with self._acting_modules() as modules:
            episodes = self.eval_runner.sample_episodes(
                modules, num_episodes=per_rank, explore=explore, policy_mapping_fn=self.policy_mapping_fn
            )
            for name in self.evaluation_opponents:
                win_rates[f"win_rate_vs_{name}"] = self._win_rate_against(name, modules, per_rank, explore)
        timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: self.num_env_steps_sampled_lifetime}
        return TrainItem(TrainingData(episodes=episodes), timesteps=timesteps, env_runners=win_rates)

    def play_episodes(
        self, *, num_episodes: int, policy_mapping_fn: PolicyMappingFn, explore: bool = False
    ) -> list[MultiAgentEpisode]:
        """Play ``num_episodes`` complete episodes on this rank's evaluation envs with the Learner's modules.

        For callbacks that hold matches of their own (the self-play league); training episodes
        are not disturbed. Under FSDP2 every rank must call it at the same point.

        Args:
            num_episodes: Episodes to play on this rank.
            policy_mapping_fn: The match-up: ``(agent_id, episode) -> module_id``.
            explore: Sample actions instead of acting greedily.
        """
        check_int("num_episodes", num_episodes)
        with self._acting_modules() as modules:
            return self.eval_runner.sample_episodes(
                modules, num_episodes=num_episodes, explore=explore, policy_mapping_fn=policy_mapping_fn
            )

    # ------------------------------------------------------------------------------------
    # Lightning hooks
    # ------------------------------------------------------------------------------------

    def teardown(self, stage: str) -> None:
        """Close the env copies (rebuilt, counters kept, if the data module is used again)."""
        train_runner = self.__dict__.pop("train_runner", None)
        if train_runner is not None:
            self._train_runner_state = train_runner.get_state()
            train_runner.close()
        eval_runner = self.__dict__.pop("eval_runner", None)
        if eval_runner is not None:
            eval_runner.close()

    def state_dict(self) -> dict[str, Any]:
        """The counters over all ranks and this rank's runner statistics, for Lightning checkpoints."""
        runner = self.__dict__.get("train_runner")
        return {
            **self._lifetime,
            "train_runner": runner.get_state() if runner is not None else self._train_runner_state,
            "sampling_rng_state": _copied(self._sampling_rng_state),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()``: a resumed run continues the counters and episode statistics.

        Every rank restores rank 0's runner statistics (its episode window; the env seeds stay
        apart by rank).
        """
        self._lifetime = {key: int(state_dict[key]) for key in self._lifetime}
        # Lightning hands every rank rank 0's state: rank 0 goes on with its own stream, the other
        # ranks start streams of their own (seeded by rank and progress), never rank 0's.
        rank = self.placement()[0]
        self._sampling_rng_state = _copied(state_dict.get("sampling_rng_state")) if rank == 0 else None
        self._train_runner_state = state_dict.get("train_runner")
        if self._train_runner_state is not None and "train_runner" in self.__dict__:
            self.train_runner.set_state(self._train_runner_state)

    # ------------------------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------------------------

    def _make_runner(self, num_envs: int, seed: int) -> MultiAgentEnvRunner:
        return MultiAgentEnvRunner(
            self.env,
            env_kwargs=self.hparams.env_kwargs,
            num_envs=num_envs,
            policy_mapping_fn=self.policy_mapping_fn,
            seed=seed,
            episode_stats_window=self.hparams.episode_stats_window,
            sample_timeout_s=self.hparams.sample_timeout_s,
            on_nonfinite=self.hparams.on_nonfinite,
            restart_failed_sub_environments=self.hparams.restart_failed_sub_environments,
            vectorize_mode=self.hparams.vectorize_mode,
            check_interrupt=self.stop_if_sigterm_received,
        )

    @contextlib.contextmanager
    def _sampling_stream(self, device: torch.device) -> Iterator[None]:
        """Sample training actions from this rank's own random stream, kept between rollouts.

        ``seed_everything`` gives every rank the same torch generators, and a board game resets
        to the same position on every rank: drawn from the shared streams, the ranks would play
        the very same games. This stream (the CPU generator's, and the acting device's when the
        modules act on a GPU) is seeded from the rank's env seed and saved in checkpoints, so a
        run is reproducible and a resumed one goes on drawing where it stopped; the global
        generators (minibatch shuffling) are left as they were.
        """
        on_cuda = device.type == "cuda"
        if self._sampling_rng_state is None:
            self._sampling_rng_state = {"seed": self.rank_seed(0) + self.num_env_steps_sampled_lifetime}
        state = self._sampling_rng_state
        with torch.random.fork_rng(devices=[device] if on_cuda else [], device_type="cuda"):
            if "cpu" in state:
                torch.set_rng_state(state["cpu"])
            else:
                torch.manual_seed(state["seed"])  # seeds the GPUs' generators too
            if on_cuda and "cuda" in state:
                torch.cuda.set_rng_state(state["cuda"], device)
            yield
            state["cpu"] = torch.get_rng_state()
            if on_cuda:
                state["cuda"] = torch.cuda.get_rng_state(device)

    @contextlib.contextmanager
    def _acting_modules(self) -> Iterator[MultiRLModule]:
        with learner_acting_modules(self.trainer) as modules:
            yield modules

    def _win_rate_against(self, name: str, modules: MultiRLModule, num_episodes: int, explore: bool) -> float:
        """This rank's win rate of ``evaluation_module_id`` against the fixed opponent ``name``, both seats."""
        main_id = self.hparams.evaluation_module_id
        if main_id not in modules:
            raise ValueError(
                f"evaluation_module_id={main_id!r}: the Learner has no such module; it has {sorted(modules.keys())}"
            )
        main = modules[main_id]
        # Seeded per rank: an evaluation of the same weights plays the same games.
        opponent = OPPONENTS[name](
            observation_space=main.observation_space,
            action_space=main.action_space,
            model_config={"seed": self.rank_seed(EVALUATION_SEED_OFFSET)},
        )
        opponent_id = OPPONENT_MODULE_ID if main_id != OPPONENT_MODULE_ID else f"{OPPONENT_MODULE_ID}_2"
        match = MultiRLModule({main_id: main, opponent_id: opponent.to(_device_of(main))})
        mapping = seat_mapping(main_id, opponent_id, self.eval_runner.possible_agents)
        episodes = self.eval_runner.sample_episodes(
            match, num_episodes=num_episodes, explore=explore, policy_mapping_fn=mapping
        )
        return win_rate(episodes, main_id)

    def _metric_keys(self) -> list[str]:
        """Every ``env_runners`` key a rank may report: the runner's own, and one per agent and per module."""
        learner_modules = sorted(self.trainer.lightning_module.module.keys())
        return (
            sorted(_RUNNER_KEYS)
            + [f"agent_episode_return_mean/{agent}" for agent in self.train_runner.possible_agents]
            + [f"module_episode_return_mean/{module_id}" for module_id in learner_modules]
        )

    def _metrics_over_ranks(self, local: dict[str, float]) -> dict[str, float]:
        """``local`` statistics merged over the ranks: counters summed, minima and maxima kept, means averaged.

        Ranks see the same agents and modules but not always the same keys (a module whose agents
        finished no episode yet has no return), so the key list is the union over this rank's
        runner's agents and modules, and a rank without a value does not count in its mean.
        """
        world_size = self.placement()[1]
        if world_size == 1:
            return dict(local)
        keys = self._metric_keys()
        vector = np.array([local.get(key, np.nan) for key in keys], dtype=np.float64)
        rows = self._gather(vector)
        merged = {}
        for index, key in enumerate(keys):
            column = rows[:, index]
            if np.isnan(column).all():
                continue
            reduce = np.nansum if key in _SUMMED else _EXTREMES.get(key, np.nanmean)
            merged[key] = float(reduce(column))
        return merged

    # ------------------------------------------------------------------------------------
    # The data contract (``lightning_rl.core.data_contract``: this class is a ``DataSource``)
    # ------------------------------------------------------------------------------------

    def data_offer(self) -> DataOffer:
        """Multi-agent episodes, and a space pair per module the policy mapping uses (``module_spaces``).

        No train batch: a module's rows per rollout depend on how many agents map to it and how
        many steps they take (see ``env_steps_per_rollout``). Its step count is env steps.
        """
        return DataOffer(frozenset({"episodes"}), module_spaces=self._offered_module_spaces, step_name=ENV_STEPS)

    def _offered_module_spaces(self) -> dict[str, SpacePair]:
        return self.module_spaces


def _device_of(module: Any) -> torch.device:
    tensor = next(module.parameters(), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def _copied(rng_state: dict[str, Any] | None) -> dict[str, Any] | None:
    """A copy of a sampling stream's state, so that a saved or loaded state never moves with the stream."""
    if rng_state is None:
        return None
    return {key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in rng_state.items()}
