"""``SelfPlayLeague``: self-play against frozen snapshots of the main module, a league that grows as main improves.

    trainer = Trainer(callbacks=[SelfPlayLeague(main_module_id="main", win_rate_threshold=0.6)])
    trainer.fit(PPOLearner(...), datamodule=MultiAgentDataModule("pettingzoo.classic.connect_four_v3", ...))

Training episodes seat the main module against an opponent drawn per episode: main itself
(with probability ``main_probability``, and always while the league is empty) or a league
snapshot. Every ``evaluate_every_n_rollouts`` train items, main plays the league; once its
win rate reaches ``win_rate_threshold``, a frozen copy of main joins the league
(``Learner.add_module``, not in ``policies_to_train``), and past ``max_league_size`` the
oldest snapshot leaves it. A snapshot that left the league stays in the Learner until the
next evaluation (then ``Learner.remove_module``): training episodes begun against it may
still be running, and their agents keep their modules to the end.

The league is part of the checkpoint: a resumed fit goes on with the same snapshots (the
Learner's checkpoint rebuilds their modules), the same count of rollouts and the same
snapshot numbering. The league's mapping is installed on the data module in the callback's
``setup``, which Lightning runs before the Learner's: the Learner then builds the modules
that mapping uses, ``main_module_id`` alone at the start.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer

from lightning_rl.core.arguments import check_bool, check_int, check_number, is_int
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.core.module_checks import validate_module_id
from lightning_rl.env.matches import seat_mapping, win_rate
from lightning_rl.env.multi_agent_episode import AgentID, ModuleID, MultiAgentEpisode
from lightning_rl.learner import Learner
from lightning_rl.learner.lightning_hooks import log_env_step

# What the callback needs of the fit's data module (``MultiAgentDataModule`` has them).
_DATAMODULE_API = ("possible_agents", "set_policy_mapping_fn", "play_episodes")

WIN_RATE_KEY = "league/win_rate"
SIZE_KEY = "league/size"
SNAPSHOTS_ADDED_KEY = "league/snapshots_added"


class SelfPlayLeague(Callback):
    """Self-play with a league of frozen snapshots of the main module.

    Args:
        main_module_id: The module being trained; the Learner must hold it when ``fit`` starts.
        evaluate_every_n_rollouts: Train items (rollouts) between two evaluations against the league.
        evaluation_num_episodes: Episodes each rank plays per evaluation, split as evenly as
            possible over the league's members, main in each seat in turn.
        win_rate_threshold: The win rate (over all ranks' evaluation episodes; draws are not
            wins) at which main is added to the league.
        max_league_size: The most snapshots the league holds; the oldest leaves past it (and the
            Learner at the next evaluation).
        main_probability: The chance that a training episode's opponent is the current main
            itself rather than a league snapshot.
        snapshot_prefix: Snapshot ``n`` (counting from 0 over the whole fit) gets the module
            id ``f"{snapshot_prefix}{n}"``.
        seed: Seeds the per-episode choice of seats and opponent (with the episode's id).
        evaluation_explore: Whether evaluation episodes sample actions (``True``) or play
            greedily. Greedy main against a greedy snapshot repeats the same game for each
            seat, so sampling measures the policies far better.

    Raises:
        ValueError: For an argument out of its range, naming it; at the start of ``fit``, for
            a Learner without the main module or a data module without ``possible_agents``,
            ``set_policy_mapping_fn`` and ``play_episodes``.
    """

    def __init__(
        self,
        main_module_id: str = "main",
        *,
        evaluate_every_n_rollouts: int = 10,
        evaluation_num_episodes: int = 20,
        win_rate_threshold: float = 0.6,
        max_league_size: int = 8,
        main_probability: float = 0.2,
        snapshot_prefix: str = "main_v",
        seed: int = 0,
        evaluation_explore: bool = True,
    ) -> None:
        _check_arguments(
            main_module_id=main_module_id,
            snapshot_prefix=snapshot_prefix,
            counts={
                "evaluate_every_n_rollouts": evaluate_every_n_rollouts,
                "evaluation_num_episodes": evaluation_num_episodes,
                "max_league_size": max_league_size,
            },
            fractions={"win_rate_threshold": win_rate_threshold, "main_probability": main_probability},
            seed=seed,
            evaluation_explore=evaluation_explore,
        )
        self.main_module_id = main_module_id
        self.evaluate_every_n_rollouts = evaluate_every_n_rollouts
        self.evaluation_num_episodes = evaluation_num_episodes
        self.win_rate_threshold = float(win_rate_threshold)
        self.max_league_size = max_league_size
        self.main_probability = float(main_probability)
        self.snapshot_prefix = snapshot_prefix
        self.seed = seed
        self.evaluation_explore = evaluation_explore
        #: The snapshots' module ids, oldest first.
        self.league: list[ModuleID] = []
        #: Snapshots that left the league but not yet the Learner (see the module's docstring).
        self.retired: list[ModuleID] = []
        #: Snapshots added over the whole fit (removed ones included): the next one's number.
        self.snapshots_added = 0
        #: Train items seen over the whole fit.
        self.rollouts = 0
        #: The win rate of the last evaluation; ``None`` before the first match against a snapshot.
        self.last_win_rate: float | None = None
        self._agents: list[AgentID] = []

    @property
    def state_key(self) -> str:
        """Keyed by the main module, so that two leagues (of two main modules) keep separate states."""
        return self._generate_state_key(main_module_id=self.main_module_id)

    # ------------------------------------------------------------------------------------
    # Lightning hooks
    # ------------------------------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """At the start of ``fit``: check the data module and install the league's mapping on it.

        Lightning calls this before the Learner's ``setup``, which builds the modules the data
        module's mapping uses (``module_spaces``): with the league's mapping and an empty
        league, that is ``main_module_id`` alone. The mapping reads the league when it is
        called, so a league restored from a checkpoint later is the one it draws from.

        Raises:
            ValueError: For a data module without ``possible_agents``, ``set_policy_mapping_fn``
                and ``play_episodes``, or an env of fewer than two agents.
        """
        if stage != "fit":
            return
        datamodule = trainer.datamodule
        missing = [name for name in _DATAMODULE_API if not hasattr(datamodule, name)]
        if missing:
            raise ValueError(
                f"SelfPlayLeague needs a multi-agent data module (MultiAgentDataModule) with {list(_DATAMODULE_API)}; "
                f"{type(datamodule).__name__} has no {missing}"
            )
        self._agents = list(datamodule.possible_agents)
        if len(self._agents) < 2:
            raise ValueError(f"SelfPlayLeague needs a game of two or more agents, the env has {self._agents}")
        datamodule.set_policy_mapping_fn(self.policy_mapping_fn)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Check that the Learner holds the main module.

        Raises:
            ValueError: For a Learner without ``main_module_id`` (e.g. one given a spec of other modules).
        """
        learner = _learner(pl_module)
        if self.main_module_id not in learner.module:
            raise ValueError(
                f"SelfPlayLeague trains the module {self.main_module_id!r}, but the Learner holds "
                f"{sorted(learner.module.keys())}; give the Learner a spec for it, or pass main_module_id"
            )

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Check that the Learner holds every snapshot (after any checkpoint was restored).

        Raises:
            ValueError: Naming the snapshots the Learner lacks.
        """
        held = _learner(pl_module).module
        missing = [module_id for module_id in self.league + self.retired if module_id not in held]
        if missing:
            raise ValueError(
                f"SelfPlayLeague's league {self.league} was restored, but the Learner lacks {missing}; "
                "resume from a checkpoint of the same fit (it holds the snapshots' weights)"
            )

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Count the rollout; every ``evaluate_every_n_rollouts``-th, evaluate main and grow the league.

        Under DDP every rank counts the same rollouts and reaches the same decision (the
        win rate is averaged over ranks), so the snapshot is added (a collective call) on all.
        """
        self.rollouts += 1
        if self.rollouts % self.evaluate_every_n_rollouts == 0:
            self._log(pl_module, batch, self.update_league(trainer, _learner(pl_module)))

    def state_dict(self) -> dict[str, Any]:
        """The league, the retired snapshots, the counters and the last win rate, as plain data."""
        return {
            "league": list(self.league),
            "retired": list(self.retired),
            "snapshots_added": self.snapshots_added,
            "rollouts": self.rollouts,
            "last_win_rate": self.last_win_rate,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            ValueError: For a state without those entries or with values of the wrong kind.
        """
        league, retired = state_dict.get("league"), state_dict.get("retired")
        added, rollouts, last = (
            state_dict.get("snapshots_added"),
            state_dict.get("rollouts"),
            state_dict.get("last_win_rate"),
        )
        if (
            not _is_module_id_list(league)
            or not _is_module_id_list(retired)
            or not is_int(added)
            or not is_int(rollouts)
            or not (last is None or isinstance(last, float))
        ):
            raise ValueError(
                "SelfPlayLeague: a checkpoint's state must hold league and retired (lists of module ids), "
                f"snapshots_added and rollouts (ints) and last_win_rate (float or None), got {dict(state_dict)!r}"
            )
        self.league, self.retired = list(league), list(retired)
        self.snapshots_added, self.rollouts, self.last_win_rate = added, rollouts, last

    # ------------------------------------------------------------------------------------
    # The league
    # ------------------------------------------------------------------------------------

    def policy_mapping_fn(self, agent_id: AgentID, episode: MultiAgentEpisode) -> ModuleID:
        """The training episodes' mapping: main in one seat, one opponent in every other.

        Every choice comes from a generator seeded by ``(seed, episode.id_)``, so the calls for
        one episode (one per agent) agree: main's seat is uniform over the agents, and the
        opponent is main itself with probability ``main_probability`` (always while the league
        is empty), else a league member drawn uniformly.

        Raises:
            ValueError: For an agent that is not one of the env's agents.
        """
        if agent_id not in self._agents:
            raise ValueError(f"SelfPlayLeague: agent {agent_id!r} is not one of the env's agents {self._agents}")
        rng = random.Random(f"{self.seed}/{episode.id_}")
        if agent_id == self._agents[rng.randrange(len(self._agents))]:
            return self.main_module_id
        if not self.league or rng.random() < self.main_probability:
            return self.main_module_id
        return self.league[rng.randrange(len(self.league))]

    def update_league(self, trainer: Trainer, learner: Learner) -> float | None:
        """Drop retired snapshots from the Learner, evaluate main against the league, snapshot main if it wins enough.

        An empty league has nothing to measure main against (against itself it wins half of
        the decided games at best), so the first evaluation adds main's first snapshot at once.
        Called from :meth:`on_train_batch_end`; may change ``learner``'s modules.

        Returns:
            Main's win rate against the league, ``None`` when the league was empty.
        """
        while self.retired:
            learner.remove_module(self.retired.pop(0))
        if not self.league:
            self._add_snapshot(learner)
            return None
        self.last_win_rate = self._evaluate(trainer, learner)
        if self.last_win_rate >= self.win_rate_threshold:
            self._add_snapshot(learner)
        return self.last_win_rate

    def _evaluate(self, trainer: Trainer, learner: Learner) -> float:
        """Main's win rate against the league members, averaged over ranks."""
        datamodule = trainer.datamodule
        wins = games = 0.0
        for member, num_episodes in zip(self.league, _split(self.evaluation_num_episodes, len(self.league))):
            if num_episodes == 0:
                continue
            episodes = datamodule.play_episodes(
                num_episodes=num_episodes,
                policy_mapping_fn=seat_mapping(self.main_module_id, member, self._agents),
                explore=self.evaluation_explore,
            )
            wins += win_rate(episodes, self.main_module_id) * len(episodes)
            games += len(episodes)
        # Every rank plays as many games, so the mean of the ranks' rates is the rate over all games.
        local = torch.tensor(wins / games, dtype=torch.float64, device=learner.device)
        return float(trainer.strategy.reduce(local, reduce_op="mean"))

    def _add_snapshot(self, learner: Learner) -> None:
        """Add a frozen copy of main to the league; retire the oldest snapshot past the cap."""
        module_id = f"{self.snapshot_prefix}{self.snapshots_added}"
        # The modules trained now stay trained; the snapshot, not among them, is frozen.
        trained = [m for m in learner.module.keys() if learner.should_module_be_updated(m)]
        learner.add_module(
            module_id=module_id,
            module_spec=learner.module_spec.rl_module_specs[self.main_module_id],
            new_should_module_be_updated=trained,
        )
        learner.set_module_state({module_id: learner.get_module_state(self.main_module_id)[self.main_module_id]})
        self.league.append(module_id)
        self.snapshots_added += 1
        while len(self.league) > self.max_league_size:
            self.retired.append(self.league.pop(0))

    def _log(self, learner: LightningModule, train_item: Any, league_win_rate: float | None) -> None:
        """Log the league's scalars at the train epoch's end, at the env-step count.

        Per epoch rather than per step: Lightning writes per-step values only every
        ``log_every_n_steps`` items, which an evaluation every few rollouts would mostly miss.
        """
        learner.log(SIZE_KEY, float(len(self.league)), on_step=False, on_epoch=True, reduce_fx="max", batch_size=1)
        learner.log(
            SNAPSHOTS_ADDED_KEY,
            float(self.snapshots_added),
            on_step=False,
            on_epoch=True,
            reduce_fx="max",
            batch_size=1,
        )
        if league_win_rate is not None:
            learner.log(WIN_RATE_KEY, league_win_rate, on_step=False, on_epoch=True, reduce_fx="mean", batch_size=1)
        env_steps = getattr(train_item, "timesteps", {}).get(NUM_ENV_STEPS_SAMPLED_LIFETIME)
        if env_steps is not None:
            log_env_step(learner, env_steps, on_step=False)


def _check_arguments(
    *,
    main_module_id: Any,
    snapshot_prefix: Any,
    counts: dict[str, Any],
    fractions: dict[str, Any],
    seed: Any,
    evaluation_explore: Any,
) -> None:
    """Raise ``ValueError`` naming the first of ``SelfPlayLeague``'s arguments that is out of its range."""
    validate_module_id(main_module_id)
    if not isinstance(snapshot_prefix, str) or not snapshot_prefix or f"{snapshot_prefix}0" == main_module_id:
        raise ValueError(
            f"SelfPlayLeague: snapshot_prefix must be a non-empty str that does not make main's id, got "
            f"{snapshot_prefix!r}"
        )
    validate_module_id(f"{snapshot_prefix}0")
    for name, value in counts.items():
        check_int(name, value, where="SelfPlayLeague")
    for name, value in fractions.items():
        check_number(name, value, low=0, high=1, where="SelfPlayLeague")
    if not is_int(seed):
        raise ValueError(f"SelfPlayLeague: seed must be an int, got {seed!r}")
    check_bool("evaluation_explore", evaluation_explore, where="SelfPlayLeague")


def _learner(pl_module: LightningModule) -> Learner:
    if not isinstance(pl_module, Learner):
        raise ValueError(f"SelfPlayLeague works with a lightning_rl Learner, got {type(pl_module).__name__}")
    return pl_module


def _is_module_id_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(module_id, str) for module_id in value)


def _split(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` counts that differ by at most one, the larger first."""
    return [total // parts + (index < total % parts) for index in range(parts)]
