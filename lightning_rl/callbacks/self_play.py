"""``SelfPlayLeague``: self-play against frozen snapshots of the main module, a league that grows as main improves.

For example::

    trainer = Trainer(callbacks=[SelfPlayLeague(main_module_id="main", opponent_sampling="pfsp",
                                                fixed_opponents=["random", "heuristic"], fixed_opponent_share=0.2)])
    trainer.fit(PPOLearner(...), datamodule=MultiAgentDataModule("pettingzoo.classic.connect_four_v3", ...))

Training episodes seat the main module against an opponent drawn per episode:

1. with probability ``fixed_opponent_share``, one of ``fixed_opponents`` (the parameter-free
   modules of :mod:`lightning_rl.env.opponents`, in the Learner as ``fixed_<name>``, never
   trained);
2. otherwise main itself (with probability ``main_probability``, and always while the league
   is empty) or a league snapshot.

Within each pool (the fixed opponents, the league) the opponent is drawn uniformly
(``opponent_sampling="uniform"``) or by prioritized fictitious self-play (``"pfsp"``,
AlphaStar's): opponent ``i`` with weight ``(1 - p_i) ** pfsp_exponent``, ``p_i`` main's running
win rate against it in training games (:mod:`~lightning_rl.callbacks.opponent_win_rates`; about
the last ``win_rate_window`` games, 0.5 before the first), so the opponents main beats least are
met most: once main beats random, the fixed share goes mostly to the heuristic.

Every ``evaluate_every_n_rollouts`` train items main plays every league member and every fixed
opponent. It is snapshotted (a frozen copy joins the league: ``Learner.add_module``, not in
``policies_to_train``) only when its win rate reaches ``win_rate_threshold`` against **each**
member, not on average: a league main beats on average can still hold a member main loses to,
and snapshotting then only adds look-alikes of main. The fixed opponents do not gate snapshots
(they are the yardstick logged at each evaluation, and a snapshot that loses to the heuristic
is still a useful sparring partner). Past ``max_league_size`` the oldest snapshot leaves the
league (under the every-member rule it is the one main has beaten for longest). A snapshot that
left the league stays in the Learner until the next evaluation (then ``Learner.remove_module``):
training episodes begun against it may still be running, and their agents keep their modules
to the end.

The league is part of the checkpoint: a resumed fit goes on with the same snapshots (the
Learner's checkpoint rebuilds their modules), the same win-rate estimates, the same count of
rollouts and the same snapshot numbering; only the returns of the games running at the
checkpoint are not kept (a resumed fit starts new games). Every draw comes from a generator
seeded by ``(seed, episode id)`` and the episode ids are seeded, so one seed gives the same
match-ups and the same league history. The league's mapping is installed on the data module in
the callback's ``setup``, which Lightning runs before the Learner's: the Learner then builds the
modules that mapping uses, ``main_module_id`` alone at the start; the fixed opponents are added
when training starts.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer

from lightning_rl.callbacks.opponent_win_rates import (
    OpponentWinRates,
    Tally,
    TrainingGameScorer,
    check_pfsp_exponent,
)
from lightning_rl.core.arguments import check_bool, check_choice, check_int, check_number, is_int
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.core.module_checks import validate_module_id
from lightning_rl.core.rl_module_specs import RLModuleSpec
from lightning_rl.env.matches import seat_mapping, win_rate
from lightning_rl.env.multi_agent_episode import AgentID, ModuleID, MultiAgentEpisode
from lightning_rl.env.opponents import OPPONENTS
from lightning_rl.learner import Learner
from lightning_rl.learner.lightning_hooks import log_env_step

# What the callback needs of the fit's data module (``MultiAgentDataModule`` has them).
_DATAMODULE_API = ("possible_agents", "set_policy_mapping_fn", "play_episodes")

OPPONENT_SAMPLINGS = ("uniform", "pfsp")
"""The values of ``opponent_sampling``."""

FIXED_OPPONENT_PREFIX = "fixed_"
"""Fixed opponent ``name`` plays under the module id ``f"fixed_{name}"``."""

WIN_RATE_KEY = "league/win_rate"
MIN_WIN_RATE_KEY = "league/min_win_rate"
SIZE_KEY = "league/size"
SNAPSHOTS_ADDED_KEY = "league/snapshots_added"
FIXED_SHARE_KEY = "league/fixed_opponent_share"
TRAIN_WIN_RATE_MIN_KEY = "league/train_win_rate_min"
TRAIN_WIN_RATE_MEAN_KEY = "league/train_win_rate_mean"
VS_PREFIX = "league/win_rate_vs_"
TRAIN_VS_PREFIX = "league/train_win_rate_vs_"


class SelfPlayLeague(Callback):
    """Self-play with a league of frozen snapshots of the main module (see the module docstring).

    Args:
        main_module_id: The module being trained; the Learner must hold it when ``fit`` starts.
        evaluate_every_n_rollouts: Train items (rollouts) between two evaluations against the league.
        evaluation_num_episodes: Episodes each rank plays per evaluation, split as evenly as
            possible over the league's members and the fixed opponents (at least one each),
            main in each seat in turn.
        win_rate_threshold: The win rate (over all ranks' evaluation episodes; draws are not
            wins) main must reach against every league member to be added to the league.
        max_league_size: The most snapshots the league holds; the oldest leaves past it (and the
            Learner at the next evaluation).
        main_probability: The chance that a training episode not against a fixed opponent is
            against the current main itself rather than a league snapshot.
        snapshot_prefix: Snapshot ``n`` (counting from 0 over the whole fit) gets the module
            id ``f"{snapshot_prefix}{n}"``.
        seed: Seeds the per-episode choice of seats and opponent (with the episode's id). The
            fixed opponents' random moves come from the data module's sampling stream (seeded
            per rank, saved in checkpoints).
        evaluation_explore: Whether evaluation episodes sample actions (``True``) or play
            greedily. Greedy main against a greedy snapshot repeats the same game for each
            seat, so sampling measures the policies far better.
        opponent_sampling: How a league snapshot, and a fixed opponent, is drawn from its pool:
            ``"uniform"``, or ``"pfsp"`` (weight ``(1 - p) ** pfsp_exponent`` on main's running
            win rate ``p`` against it).
        pfsp_exponent: PFSP's exponent: 2 is AlphaStar's ``f_hard``; 1 is linear in main's
            loss rate; 0 is uniform.
        win_rate_window: About how many of the latest training games against an opponent its
            win-rate estimate spans (counts decay by ``1 - 1 / win_rate_window`` per game).
        fixed_opponents: Names in :data:`lightning_rl.env.opponents.OPPONENTS` (``"random"``,
            ``"heuristic"``) to train against and to measure main by at each evaluation
            (``league/win_rate_vs_<name>``).
        fixed_opponent_share: The chance that a training episode is against one of
            ``fixed_opponents`` (drawn among them by ``opponent_sampling``).

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
        opponent_sampling: str = "uniform",
        pfsp_exponent: float = 2.0,
        win_rate_window: int = 200,
        fixed_opponents: Sequence[str] = (),
        fixed_opponent_share: float = 0.0,
    ) -> None:
        _check_arguments(
            main_module_id=main_module_id,
            snapshot_prefix=snapshot_prefix,
            counts={
                "evaluate_every_n_rollouts": evaluate_every_n_rollouts,
                "evaluation_num_episodes": evaluation_num_episodes,
                "max_league_size": max_league_size,
            },
            fractions={
                "win_rate_threshold": win_rate_threshold,
                "main_probability": main_probability,
                "fixed_opponent_share": fixed_opponent_share,
            },
            seed=seed,
            evaluation_explore=evaluation_explore,
        )
        check_choice("opponent_sampling", opponent_sampling, choices=OPPONENT_SAMPLINGS, where="SelfPlayLeague")
        check_pfsp_exponent(pfsp_exponent)
        _check_fixed_opponents(fixed_opponents, fixed_opponent_share, main_module_id)
        self.main_module_id = main_module_id
        self.evaluate_every_n_rollouts = evaluate_every_n_rollouts
        self.evaluation_num_episodes = evaluation_num_episodes
        self.win_rate_threshold = float(win_rate_threshold)
        self.max_league_size = max_league_size
        self.main_probability = float(main_probability)
        self.snapshot_prefix = snapshot_prefix
        self.seed = seed
        self.evaluation_explore = evaluation_explore
        self.opponent_sampling = opponent_sampling
        self.pfsp_exponent = float(pfsp_exponent)
        self.fixed_opponents = list(fixed_opponents)
        self.fixed_opponent_share = float(fixed_opponent_share)
        #: The snapshots' module ids, oldest first.
        self.league: list[ModuleID] = []
        #: Snapshots that left the league but not yet the Learner (see the module's docstring).
        self.retired: list[ModuleID] = []
        #: Snapshots added over the whole fit (removed ones included): the next one's number.
        self.snapshots_added = 0
        #: Train items seen over the whole fit.
        self.rollouts = 0
        #: Main's mean win rate over the league at the last evaluation; ``None`` before the first match against a snapshot.
        self.last_win_rate: float | None = None
        #: Main's lowest win rate against a league member at the last evaluation (what decides a snapshot).
        self.last_min_win_rate: float | None = None
        #: Main's running win rates against its opponents in training games (what PFSP weighs).
        self.win_rates = OpponentWinRates(win_rate_window)
        self._scorer = TrainingGameScorer(main_module_id)
        self._agents: list[AgentID] = []
        # The fixed opponents' module ids, once they are in the Learner (the mapping draws them only then).
        self._fixed_module_ids: list[ModuleID] = []

    @property
    def state_key(self) -> str:
        """Keyed by the main module, so that two leagues (of two main modules) keep separate states."""
        return self._generate_state_key(main_module_id=self.main_module_id)

    @property
    def fixed_module_ids(self) -> list[ModuleID]:
        """The module ids the fixed opponents play under: ``fixed_<name>``."""
        return [f"{FIXED_OPPONENT_PREFIX}{name}" for name in self.fixed_opponents]

    # ------------------------------------------------------------------------------------
    # Lightning hooks
    # ------------------------------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """At the start of ``fit``: check the data module and install the league's mapping on it.

        Lightning calls this before the Learner's ``setup``, which builds the modules the data
        module's mapping uses (``module_spaces``): with the league's mapping, an empty league
        and no fixed opponent added yet, that is ``main_module_id`` alone. The mapping reads
        the league when it is called, so a league restored from a checkpoint later is the one
        it draws from.

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
        self._fixed_module_ids = []
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
        """Add the fixed opponents the Learner lacks; check that it holds every snapshot (after any checkpoint was restored).

        Raises:
            ValueError: Naming the snapshots the Learner lacks.
        """
        learner = _learner(pl_module)
        held = learner.module
        missing = [module_id for module_id in self.league + self.retired if module_id not in held]
        if missing:
            raise ValueError(
                f"SelfPlayLeague's league {self.league} was restored, but the Learner lacks {missing}; "
                "resume from a checkpoint of the same fit (it holds the snapshots' weights)"
            )
        main = learner.module[self.main_module_id]
        for name, module_id in zip(self.fixed_opponents, self.fixed_module_ids):
            if module_id not in held:  # a resumed fit's Learner rebuilt it from the checkpoint
                spec = RLModuleSpec(
                    module_class=OPPONENTS[name],
                    observation_space=main.observation_space,
                    action_space=main.action_space,
                    # Torch's global generator: while sampling, the data module's per-rank stream, which
                    # checkpoints save (a seed of its own would repeat its draws after a resume).
                    model_config={"seed": None},
                )
                trained = [m for m in learner.module.keys() if learner.should_module_be_updated(m)]
                learner.add_module(module_id=module_id, module_spec=spec, new_should_module_be_updated=trained)
        self._fixed_module_ids = self.fixed_module_ids

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Score the rollout's finished games; every ``evaluate_every_n_rollouts``-th, evaluate main and grow the league.

        Under DDP every rank counts the same rollouts, sums the game results over the ranks and
        reaches the same decision (the win rates are averaged over ranks), so the snapshot is
        added (a collective call) on all, and every rank draws from the same estimates.
        """
        learner = _learner(pl_module)
        self.rollouts += 1
        tally = self._score_training_games(trainer, learner, batch)
        evaluation = None
        if self.rollouts % self.evaluate_every_n_rollouts == 0:
            evaluation = self.update_league(trainer, learner)
        self._log(learner, batch, tally, evaluation)

    def state_dict(self) -> dict[str, Any]:
        """The league, the retired snapshots, the counters, the last win rates and the running estimates, as plain data."""
        return {
            "league": list(self.league),
            "retired": list(self.retired),
            "snapshots_added": self.snapshots_added,
            "rollouts": self.rollouts,
            "last_win_rate": self.last_win_rate,
            "last_min_win_rate": self.last_min_win_rate,
            "win_rates": self.win_rates.state_dict(),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        A checkpoint written before the running estimates existed (without ``win_rates`` and
        ``last_min_win_rate``) loads with none: PFSP starts from 0.5 for every snapshot.

        Raises:
            ValueError: For a state without those entries or with values of the wrong kind.
        """
        league, retired = state_dict.get("league"), state_dict.get("retired")
        added, rollouts = state_dict.get("snapshots_added"), state_dict.get("rollouts")
        last, last_min = state_dict.get("last_win_rate"), state_dict.get("last_min_win_rate")
        if (
            not _is_module_id_list(league)
            or not _is_module_id_list(retired)
            or not is_int(added)
            or not is_int(rollouts)
            or not all(value is None or isinstance(value, float) for value in (last, last_min))
        ):
            raise ValueError(
                "SelfPlayLeague: a checkpoint's state must hold league and retired (lists of module ids), "
                f"snapshots_added and rollouts (ints), last_win_rate and last_min_win_rate (float or None), got "
                f"{dict(state_dict)!r}"
            )
        self.win_rates.load_state_dict(state_dict.get("win_rates", {}))
        self.league, self.retired = list(league), list(retired)
        self.snapshots_added, self.rollouts = added, rollouts
        self.last_win_rate, self.last_min_win_rate = last, last_min

    # ------------------------------------------------------------------------------------
    # The league
    # ------------------------------------------------------------------------------------

    def policy_mapping_fn(self, agent_id: AgentID, episode: MultiAgentEpisode) -> ModuleID:
        """The training episodes' mapping: main in one seat, one opponent in every other.

        Every choice comes from a generator seeded by ``(seed, episode.id_)``, so the calls for
        one episode (one per agent) agree on main's seat, uniform over the agents; the opponent
        is drawn as the module docstring says, from the league and estimates of the moment
        the opponent's agent is first mapped.

        Raises:
            ValueError: For an agent that is not one of the env's agents.
        """
        if agent_id not in self._agents:
            raise ValueError(f"SelfPlayLeague: agent {agent_id!r} is not one of the env's agents {self._agents}")
        rng = random.Random(f"{self.seed}/{episode.id_}")
        if agent_id == self._agents[rng.randrange(len(self._agents))]:
            return self.main_module_id
        return self._draw_opponent(rng)

    def opponent_probabilities(self) -> dict[ModuleID, float]:
        """The chance of each opponent (main itself included) in a training episode now, by module id."""
        probabilities: dict[ModuleID, float] = {}
        fixed = self.fixed_opponent_share if self._fixed_module_ids else 0.0
        weights = self._weights(self._fixed_module_ids)
        for module_id, weight in zip(self._fixed_module_ids, weights):
            probabilities[module_id] = fixed * weight / sum(weights)
        rest = 1.0 - fixed
        if not self.league:
            probabilities[self.main_module_id] = rest
            return probabilities
        probabilities[self.main_module_id] = rest * self.main_probability
        weights = self._weights(self.league)
        for module_id, weight in zip(self.league, weights):
            probabilities[module_id] = rest * (1.0 - self.main_probability) * weight / sum(weights)
        return probabilities

    def update_league(self, trainer: Trainer, learner: Learner) -> dict[ModuleID, float]:
        """Drop retired snapshots from the Learner, evaluate main, snapshot main if it beats every league member.

        An empty league has nothing to measure main against (against itself it wins half of
        the decided games at best), so the first evaluation adds main's first snapshot at once.
        Called from :meth:`on_train_batch_end`; may change ``learner``'s modules.

        Returns:
            Main's win rate against each league member (as the league was before any snapshot
            this call adds) and each fixed opponent, by module id.
        """
        while self.retired:
            module_id = self.retired.pop(0)
            learner.remove_module(module_id)
            self.win_rates.forget(module_id)
        rates = self._evaluate(trainer, learner, self.league + self._fixed_module_ids)
        if not self.league:
            self._add_snapshot(learner)
            return rates
        member_rates = [rates[member] for member in self.league]
        self.last_win_rate = statistics.fmean(member_rates)
        self.last_min_win_rate = min(member_rates)
        if self.last_min_win_rate >= self.win_rate_threshold:
            self._add_snapshot(learner)
        return rates

    def _draw_opponent(self, rng: random.Random) -> ModuleID:
        # Draw the fixed-opponent coin only when there are fixed opponents: without them the draws are the same as
        # they were before fixed opponents existed.
        if self._fixed_module_ids and self.fixed_opponent_share > 0:
            if rng.random() < self.fixed_opponent_share:
                return self._draw_from(self._fixed_module_ids, rng)
        if not self.league or rng.random() < self.main_probability:
            return self.main_module_id
        return self._draw_from(self.league, rng)

    def _draw_from(self, pool: list[ModuleID], rng: random.Random) -> ModuleID:
        """One of ``pool`` (the league, or the fixed opponents), by ``opponent_sampling``."""
        if self.opponent_sampling == "pfsp":
            return rng.choices(pool, weights=self._weights(pool))[0]
        return pool[rng.randrange(len(pool))]

    def _weights(self, pool: list[ModuleID]) -> list[float]:
        if self.opponent_sampling == "pfsp":
            return self.win_rates.pfsp_weights(pool, self.pfsp_exponent)
        return [1.0] * len(pool)

    def _score_training_games(self, trainer: Trainer, learner: Learner, train_item: Any) -> Tally:
        """Score the train item's finished games, summed over the ranks; add them to the running estimates.

        Returns:
            ``{opponent: [main's wins, games]}`` over all ranks (main itself for self-play games).
        """
        data = getattr(train_item, "data", None)
        local = self._scorer.score(getattr(data, "episodes", None) or [])
        # A fixed order of every opponent an episode can have met, the same on every rank.
        opponents = list(dict.fromkeys([self.main_module_id, *self.league, *self.retired, *self._fixed_module_ids]))
        counts = [local.get(opponent, [0.0, 0.0]) for opponent in opponents]
        summed = trainer.strategy.reduce(
            torch.tensor(counts, dtype=torch.float64, device=learner.device), reduce_op="sum"
        ).tolist()
        tally = {opponent: pair for opponent, pair in zip(opponents, summed) if pair[1] > 0}
        self.win_rates.record({opponent: pair for opponent, pair in tally.items() if opponent != self.main_module_id})
        return tally

    def _evaluate(self, trainer: Trainer, learner: Learner, opponents: list[ModuleID]) -> dict[ModuleID, float]:
        """Main's win rate against each of ``opponents``, averaged over ranks; ``{}`` for none."""
        if not opponents:
            return {}
        datamodule = trainer.datamodule
        rates = []
        for opponent, num_episodes in zip(opponents, _split(self.evaluation_num_episodes, len(opponents))):
            episodes = datamodule.play_episodes(
                num_episodes=max(num_episodes, 1),
                policy_mapping_fn=seat_mapping(self.main_module_id, opponent, self._agents),
                explore=self.evaluation_explore,
            )
            rates.append(win_rate(episodes, self.main_module_id))
        # Every rank plays as many games, so the mean of the ranks' rates is the rate over all games.
        local = torch.tensor(rates, dtype=torch.float64, device=learner.device)
        return dict(zip(opponents, trainer.strategy.reduce(local, reduce_op="mean").tolist()))

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

    def _log(
        self, learner: Learner, train_item: Any, tally: Tally, evaluation: Mapping[ModuleID, float] | None
    ) -> None:
        """Log the league's scalars at the train epoch's end, at the env-step count.

        Per epoch rather than per step: Lightning writes per-step values only every
        ``log_every_n_steps`` items, which an evaluation every few rollouts would mostly miss.
        Sizes are the epoch's largest; rates and shares its mean over the rollouts that had them.
        """
        values: dict[str, tuple[float, str]] = {
            SIZE_KEY: (float(len(self.league)), "max"),
            SNAPSHOTS_ADDED_KEY: (float(self.snapshots_added), "max"),
        }
        games = sum(pair[1] for pair in tally.values())
        if games and self.fixed_opponents:
            fixed_games = sum(tally.get(module_id, [0.0, 0.0])[1] for module_id in self._fixed_module_ids)
            values[FIXED_SHARE_KEY] = (fixed_games / games, "mean")
        if self.league:
            estimates = [self.win_rates.estimate(member) for member in self.league]
            values[TRAIN_WIN_RATE_MIN_KEY] = (min(estimates), "mean")
            values[TRAIN_WIN_RATE_MEAN_KEY] = (statistics.fmean(estimates), "mean")
        for name, module_id in zip(self.fixed_opponents, self._fixed_module_ids):
            values[f"{TRAIN_VS_PREFIX}{name}"] = (self.win_rates.estimate(module_id), "mean")
        if evaluation is not None:
            members = [evaluation[member] for member in evaluation if member not in self._fixed_module_ids]
            if members:
                values[WIN_RATE_KEY] = (statistics.fmean(members), "mean")
                values[MIN_WIN_RATE_KEY] = (min(members), "mean")
            for name, module_id in zip(self.fixed_opponents, self._fixed_module_ids):
                values[f"{VS_PREFIX}{name}"] = (evaluation[module_id], "mean")
        for key, (value, reduce_fx) in values.items():
            learner.log(key, value, on_step=False, on_epoch=True, reduce_fx=reduce_fx, batch_size=1)
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


def _check_fixed_opponents(fixed_opponents: Any, share: float, main_module_id: str) -> None:
    """Raise ``ValueError`` for unknown or repeated fixed opponents, a share without any, or a name that makes main's id."""
    if isinstance(fixed_opponents, str) or not isinstance(fixed_opponents, Sequence):
        raise ValueError(f"SelfPlayLeague: fixed_opponents must be a list of names, got {fixed_opponents!r}")
    unknown = [name for name in fixed_opponents if name not in OPPONENTS]
    if unknown:
        raise ValueError(f"SelfPlayLeague: fixed_opponents {unknown} unknown; known: {sorted(OPPONENTS)}")
    if len(set(fixed_opponents)) != len(fixed_opponents):
        raise ValueError(f"SelfPlayLeague: fixed_opponents names one opponent twice: {list(fixed_opponents)}")
    if share > 0 and not fixed_opponents:
        raise ValueError(f"SelfPlayLeague: fixed_opponent_share is {share}, but fixed_opponents is empty")
    if main_module_id in {f"{FIXED_OPPONENT_PREFIX}{name}" for name in fixed_opponents}:
        raise ValueError(f"SelfPlayLeague: main_module_id {main_module_id!r} is a fixed opponent's module id")


def _learner(pl_module: LightningModule) -> Learner:
    if not isinstance(pl_module, Learner):
        raise ValueError(f"SelfPlayLeague works with a lightning_rl Learner, got {type(pl_module).__name__}")
    return pl_module


def _is_module_id_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(module_id, str) for module_id in value)


def _split(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` counts that differ by at most one, the larger first."""
    return [total // parts + (index < total % parts) for index in range(parts)]
