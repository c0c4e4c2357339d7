"""The self-play league: matches and win rates, snapshots added and frozen, the cap, the mapping, resume."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import assert_same, make_trainer
from lightning.pytorch import Callback, LightningDataModule
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_rl import Columns, MultiRLModuleSpec, RLModuleSpec
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.callbacks import SelfPlayLeague
from lightning_rl.core.data_contract import DataOffer
from lightning_rl.core.rl_modules import MultiRLModule
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.env.matches import seat_mapping, win_rate
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode
from lightning_rl.env.multi_agent_runner import MultiAgentEnvRunner
from lightning_rl.env.opponents import ConnectFourHeuristicModule, RandomLegalModule
from lightning_rl.env.policy_mapping import module_spaces

AGENTS = ["player_0", "player_1"]
MAIN = "main"
OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT_SPACE = gym.spaces.Discrete(2)


def _game(
    mapping: Any, main_result: float, episode_id: str | None = None, results: dict[str, float] | None = None
) -> MultiAgentEpisode:
    """A two-turn game over ``AGENTS``: main's agent ends with ``main_result``, the other with its negation.

    ``results`` gives main's result against some opponents instead.
    """
    episode = MultiAgentEpisode(episode_id, agent_to_module_mapping_fn=mapping)
    episode.add_env_reset({"player_0": 0})
    episode.add_env_step({"player_1": 0}, {"player_0": 1}, {})
    opponents = {episode.module_for(agent) for agent in AGENTS} - {MAIN}
    main_result = (results or {}).get(next(iter(opponents), MAIN), main_result)
    returns = {agent: main_result if episode.module_for(agent) == MAIN else -main_result for agent in AGENTS}
    done = {"player_0": True, "player_1": True, "__all__": True}
    episode.add_env_step({"player_0": 1, "player_1": 1}, {"player_1": 2}, returns, terminateds=done)
    return episode


class LeagueData(LightningDataModule):
    """A stand-in for MultiAgentDataModule: PPO batches for main, and matches whose outcome the test picks.

    Args:
        num_items: Train items per epoch.
        main_result: Main's return in every match (1 win, 0 draw, -1 loss).
    """

    possible_agents = AGENTS

    def __init__(self, num_items: int = 4, main_result: float = 1.0, results: dict[str, float] | None = None) -> None:
        super().__init__()
        self.num_items = num_items
        self.main_result = main_result
        self.results = results or {}  # main's result against these opponents, instead of main_result
        self.policy_mapping_fn: Any = None
        self.matches: list[tuple[str, int, bool]] = []  # (opponent, episodes, explore) per call
        self.main_seats: list[str] = []

    def train_dataloader(self) -> Any:
        return _BatchesForEveryModule(self.trainer.lightning_module, self.num_items)

    def set_policy_mapping_fn(self, fn: Any) -> None:
        self.policy_mapping_fn = fn

    @property
    def module_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        return module_spaces(AGENTS, lambda agent: OBS_SPACE, lambda agent: ACT_SPACE, self.policy_mapping_fn)

    def data_offer(self) -> DataOffer:
        offered = None if type(self).module_spaces is None else (lambda: self.module_spaces)
        return DataOffer(frozenset({"batch"}), module_spaces=offered)

    def accept_requirements(self, requirements: Any) -> None:
        pass

    def play_episodes(self, *, num_episodes: int, policy_mapping_fn: Any, explore: bool = False) -> list:
        episodes = [_game(policy_mapping_fn, self.main_result, results=self.results) for _ in range(num_episodes)]
        opponents = {episode.module_for(agent) for episode in episodes for agent in AGENTS} - {MAIN}
        self.matches.append((opponents.pop(), num_episodes, explore))
        self.main_seats += [agent for episode in episodes for agent in AGENTS if episode.module_for(agent) == MAIN]
        return episodes


class _BatchesForEveryModule:
    """Train items with a PPO batch for every module the Learner holds when the item is made, snapshots included.

    So a snapshot stays unchanged only because it is frozen, not for lack of data.
    """

    def __init__(self, learner: PPOLearner, num_items: int) -> None:
        self.learner, self.num_items = learner, num_items

    def __len__(self) -> int:
        return self.num_items

    def __iter__(self) -> Any:
        for seed in range(self.num_items):
            modules = self.learner.module
            # Fixed opponents have no weights to train, and no forward_train to run.
            batch = {module_id: _ppo_batch(seed) for module_id in modules.keys() if list(modules[module_id].parameters())}
            yield TrainItem(TrainingData(batch=batch), timesteps={"num_env_steps_sampled_lifetime": 32 * (seed + 1)})


def _ppo_batch(seed: int, rows: int = 32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        Columns.OBS: rng.normal(size=(rows, 4)).astype(np.float32),
        Columns.ACTIONS: rng.integers(0, 2, rows),
        Columns.ACTION_LOGP: rng.normal(-0.7, 0.3, rows).astype(np.float32),
        Columns.ADVANTAGES: rng.normal(size=rows).astype(np.float32),
        Columns.VALUE_TARGETS: rng.normal(size=rows).astype(np.float32),
    }


def _learner(**kwargs: Any) -> PPOLearner:
    torch.manual_seed(3)
    spec = RLModuleSpec(
        module_class=PPOModule, observation_space=OBS_SPACE, action_space=ACT_SPACE, model_config={"fcnet_hiddens": [8]}
    )
    return PPOLearner(
        MultiRLModuleSpec({MAIN: spec}),
        lr=1e-2,
        num_epochs=1,
        minibatch_size=None,
        shuffle_batch_per_epoch=False,
        **kwargs,
    )


def _weights(learner: PPOLearner, module_id: str) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in learner.module[module_id].state_dict().items()}


class _RecordSnapshots(Callback):
    """After the league's hook: the weights of main and of every snapshot at the item it was added."""

    def __init__(self) -> None:
        self.at_addition: dict[str, tuple[dict, dict]] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for module_id in pl_module.module.keys():
            if module_id != MAIN and module_id not in self.at_addition:
                self.at_addition[module_id] = (_weights(pl_module, module_id), _weights(pl_module, MAIN))


def _fit(tmp_path: Path, league: SelfPlayLeague, data: LeagueData, learner: PPOLearner | None = None, **kwargs) -> Any:
    learner = learner or _learner()
    ckpt_path = kwargs.pop("ckpt_path", None)
    trainer = make_trainer(tmp_path, callbacks=[league, *kwargs.pop("callbacks", [])], **kwargs)
    trainer.fit(learner, datamodule=data, ckpt_path=ckpt_path)
    return learner, trainer


# ----------------------------------------------------------------------------------------
# Matches
# ----------------------------------------------------------------------------------------


def test_seat_mapping_seats_main_in_each_seat_in_turn_and_keeps_an_episodes_seats():
    mapping = seat_mapping(MAIN, "rival", AGENTS)
    episodes = [MultiAgentEpisode(f"e{k}") for k in range(4)]
    for k, episode in enumerate(episodes):
        assert mapping(AGENTS[k % 2], episode) == MAIN
        assert mapping(AGENTS[1 - k % 2], episode) == "rival"
    # Asked again (a later chunk of the same episode), an episode keeps its seats.
    assert [mapping("player_0", episode) for episode in episodes] == [MAIN, "rival", MAIN, "rival"]


def test_seat_mapping_refuses_one_module_in_both_roles_too_few_seats_and_unknown_agents():
    with pytest.raises(ValueError, match="two different modules"):
        seat_mapping(MAIN, MAIN, AGENTS)
    with pytest.raises(ValueError, match="at least two distinct agents"):
        seat_mapping(MAIN, "rival", ["player_0", "player_0"])
    with pytest.raises(ValueError, match="'player_9' is not one of the seats"):
        seat_mapping(MAIN, "rival", AGENTS)("player_9", MultiAgentEpisode())


def test_win_rate_counts_strictly_larger_returns_and_not_draws():
    mapping = seat_mapping(MAIN, "rival", AGENTS)
    episodes = [_game(mapping, result) for result in (1.0, 1.0, 0.0, -1.0)]
    assert win_rate(episodes, MAIN) == 0.5
    assert win_rate(episodes, "rival") == 0.25


def test_win_rate_refuses_no_episodes_and_episodes_without_the_module_or_an_opponent():
    with pytest.raises(ValueError, match="no episodes"):
        win_rate([], MAIN)
    with pytest.raises(ValueError, match="has no agent of it"):
        win_rate([_game(seat_mapping(MAIN, "rival", AGENTS), 1.0)], "ghost")
    with pytest.raises(ValueError, match="has no opponent of it"):
        win_rate([_game(lambda agent, episode: MAIN, 1.0)], MAIN)


def test_matches_of_real_connect_four_games_seat_main_in_turn_and_score_the_heuristic_above_random():
    pytest.importorskip("pettingzoo")
    runner = MultiAgentEnvRunner("pettingzoo.classic.connect_four_v3", num_envs=1, seed=0)
    spaces = (runner.observation_space("player_0"), runner.action_space("player_0"))
    modules = MultiRLModule(
        {MAIN: ConnectFourHeuristicModule(*spaces, {"seed": 0}), "rival": RandomLegalModule(*spaces, {"seed": 1})}
    )
    episodes = runner.sample_episodes(
        modules, num_episodes=40, policy_mapping_fn=seat_mapping(MAIN, "rival", runner.possible_agents)
    )
    main_seats = [agent for episode in episodes for agent in AGENTS if episode.module_for(agent) == MAIN]
    assert main_seats == AGENTS * 20
    assert win_rate(episodes, MAIN) >= 0.8 and win_rate(episodes, "rival") <= 0.2


# ----------------------------------------------------------------------------------------
# The training mapping
# ----------------------------------------------------------------------------------------


def _league_with_members(members: list[str], **kwargs: Any) -> SelfPlayLeague:
    league = SelfPlayLeague(**kwargs)
    learner = _learner()
    learner.build()
    league.setup(SimpleNamespace(datamodule=LeagueData()), learner, "fit")
    league.league = list(members)
    return league


def _match_ups(league: SelfPlayLeague, count: int) -> list[tuple[str, str]]:
    return [
        (league.policy_mapping_fn("player_0", e), league.policy_mapping_fn("player_1", e))
        for e in (MultiAgentEpisode(f"episode-{k}") for k in range(count))
    ]


def test_the_mapping_gives_one_episode_the_same_answers_and_seats_main_in_both_seats():
    league = _league_with_members(["main_v0", "main_v1"], main_probability=0.0)
    match_ups = _match_ups(league, 400)
    assert match_ups == _match_ups(league, 400)  # the same episode ids: the same answers
    assert all(match_up.count(MAIN) == 1 for match_up in match_ups)
    seat_0 = sum(match_up[0] == MAIN for match_up in match_ups)
    assert 160 < seat_0 < 240
    opponents = [module_id for match_up in match_ups for module_id in match_up if module_id != MAIN]
    assert 160 < opponents.count("main_v0") < 240 and opponents.count("main_v1") == 400 - opponents.count("main_v0")


def test_the_opponent_is_main_itself_with_main_probability_and_always_while_the_league_is_empty():
    match_ups = _match_ups(_league_with_members(["main_v0", "main_v1"], main_probability=0.3), 2000)
    self_play = sum(match_up == (MAIN, MAIN) for match_up in match_ups) / len(match_ups)
    assert 0.25 < self_play < 0.35
    assert set(_match_ups(_league_with_members([], main_probability=0.0), 50)) == {(MAIN, MAIN)}


def test_the_runner_plays_training_episodes_with_the_leagues_match_ups():
    pytest.importorskip("pettingzoo")
    runner = MultiAgentEnvRunner("pettingzoo.classic.connect_four_v3", num_envs=4, seed=0)
    spaces = (runner.observation_space("player_0"), runner.action_space("player_0"))
    modules = MultiRLModule({module_id: RandomLegalModule(*spaces, {"seed": 0}) for module_id in (MAIN, "main_v0")})
    league = _league_with_members(["main_v0"], main_probability=0.0)
    runner.set_policy_mapping_fn(league.policy_mapping_fn)
    episodes = runner.sample(modules, num_env_steps=100)
    assert len(episodes) > 10
    for episode in episodes:
        assert sorted(episode.module_for(agent) for agent in AGENTS) == ["main", "main_v0"]


def test_another_seed_draws_other_match_ups():
    members = ["main_v0", "main_v1", "main_v2"]
    assert _match_ups(_league_with_members(members, seed=0), 50) != _match_ups(
        _league_with_members(members, seed=1), 50
    )


# ----------------------------------------------------------------------------------------
# The league under Trainer.fit
# ----------------------------------------------------------------------------------------


def test_a_winning_main_is_snapshotted_and_the_snapshots_stay_frozen(tmp_path: Path):
    league, recorder = SelfPlayLeague(evaluate_every_n_rollouts=2, evaluation_num_episodes=4), _RecordSnapshots()
    data = LeagueData(num_items=6, main_result=1.0)
    learner, trainer = _fit(tmp_path, league, data, callbacks=[recorder])

    # The first evaluation seeds the empty league; each later one (won 4 of 4) adds a snapshot.
    assert league.league == ["main_v0", "main_v1", "main_v2"] and league.snapshots_added == 3
    assert list(learner.module.keys()) == [MAIN, "main_v0", "main_v1", "main_v2"]
    assert [learner.should_module_be_updated(m) for m in learner.module.keys()] == [True, False, False, False]
    assert league.last_win_rate == 1.0
    # Each snapshot was main's copy when added, and has not moved since while main kept training.
    for module_id, (snapshot, main) in recorder.at_addition.items():
        assert_same(snapshot, main, module_id)
        assert_same(_weights(learner, module_id), snapshot, module_id)
    assert not torch.equal(_weights(learner, MAIN)["pi.0.weight"], recorder.at_addition["main_v0"][1]["pi.0.weight"])
    assert trainer.callback_metrics["league/size"].item() == 3
    assert trainer.callback_metrics["league/snapshots_added"].item() == 3
    assert trainer.callback_metrics["league/win_rate"].item() == 1.0
    # The data module trains with the league's mapping; matches sample actions and play each seat in turn.
    assert data.policy_mapping_fn == league.policy_mapping_fn
    assert data.matches == [("main_v0", 4, True), ("main_v0", 2, True), ("main_v1", 2, True)]
    assert data.main_seats == ["player_0", "player_1"] * 4


def test_the_leagues_mapping_is_installed_before_the_learner_builds_so_it_builds_main_alone(tmp_path: Path):
    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=None)
    league = SelfPlayLeague(evaluate_every_n_rollouts=2)
    _fit(tmp_path, league, LeagueData(num_items=2), learner=learner)
    assert list(learner.module.keys()) == [MAIN, "main_v0"]


@pytest.mark.parametrize("main_result", [0.0, -1.0])
def test_a_main_that_draws_or_loses_does_not_grow_the_league(tmp_path: Path, main_result: float):
    league = SelfPlayLeague(evaluate_every_n_rollouts=1, evaluation_num_episodes=4)
    learner, trainer = _fit(tmp_path, league, LeagueData(num_items=3, main_result=main_result))
    assert league.league == ["main_v0"] and list(learner.module.keys()) == [MAIN, "main_v0"]
    assert league.last_win_rate == 0.0 and trainer.callback_metrics["league/win_rate"].item() == 0.0


def test_past_the_cap_the_oldest_snapshot_leaves_the_league_at_once_and_the_learner_at_the_next_update(tmp_path: Path):
    league = SelfPlayLeague(evaluate_every_n_rollouts=1, evaluation_num_episodes=2, max_league_size=2)
    data = LeagueData(num_items=4)
    learner, trainer = _fit(tmp_path, league, data)
    assert league.league == ["main_v2", "main_v3"] and league.snapshots_added == 4
    # main_v1 left the league at the last update: no new episode meets it, running ones still may.
    assert league.retired == ["main_v1"]
    assert list(learner.module.keys()) == [MAIN, "main_v1", "main_v2", "main_v3"]
    assert data.matches[-2:] == [("main_v1", 1, True), ("main_v2", 1, True)]
    assert {data.policy_mapping_fn(agent, MultiAgentEpisode(f"e{k}")) for k in range(50) for agent in AGENTS} == {
        MAIN,
        "main_v2",
        "main_v3",
    }
    assert trainer.callback_metrics["league/size"].item() == 2


def test_a_resumed_fit_continues_the_league_exactly(tmp_path: Path):
    def league() -> SelfPlayLeague:
        return SelfPlayLeague(evaluate_every_n_rollouts=3, evaluation_num_episodes=2, max_league_size=2)

    uninterrupted_league = league()
    uninterrupted, _ = _fit(tmp_path / "a", uninterrupted_league, LeagueData(num_items=4), max_epochs=3)

    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last=True)
    _fit(
        tmp_path / "b",
        league(),
        LeagueData(num_items=4),
        max_epochs=2,
        callbacks=[checkpoints],
        enable_checkpointing=True,
    )
    resumed_league = league()
    resumed, _ = _fit(
        tmp_path / "c", resumed_league, LeagueData(num_items=4), max_epochs=3, ckpt_path=checkpoints.last_model_path
    )

    assert resumed_league.state_dict() == uninterrupted_league.state_dict()
    assert resumed_league.league == ["main_v2", "main_v3"] and resumed_league.rollouts == 12
    assert resumed_league.retired == ["main_v1"] and list(resumed.module.keys()) == [
        MAIN,
        "main_v1",
        "main_v2",
        "main_v3",
    ]
    assert_same(resumed.get_module_state(), uninterrupted.get_module_state())


def _leagues_under_ddp(rank: int, world_size: int, root: str) -> dict[float, dict[str, Any]]:
    """Fits on 2 ranks, for two thresholds: rank 0's main wins every match, rank 1's loses every one (a rate of 0.5)."""
    results = {}
    for threshold in (0.5, 0.6):
        league = SelfPlayLeague(evaluate_every_n_rollouts=1, evaluation_num_episodes=2, win_rate_threshold=threshold)
        data = LeagueData(num_items=3, main_result=1.0 if rank == 0 else -1.0)
        learner, _ = _fit(Path(root) / str(threshold), league, data, strategy="ddp", devices=world_size)
        weights = {module_id: _weights(learner, module_id) for module_id in learner.module.keys()}
        results[threshold] = {
            "state": league.state_dict(),
            "weights": {module_id: {k: v.numpy() for k, v in w.items()} for module_id, w in weights.items()},
        }
    return results


def test_under_ddp_the_win_rate_is_averaged_over_ranks_and_every_rank_grows_the_same_league(tmp_path: Path):
    from ranks import run_on_ranks

    by_rank = run_on_ranks(_leagues_under_ddp, str(tmp_path))
    for threshold, league in ((0.5, ["main_v0", "main_v1", "main_v2"]), (0.6, ["main_v0"])):
        rank_0, rank_1 = by_rank[0][threshold], by_rank[1][threshold]
        assert rank_0["state"] == rank_1["state"]
        assert rank_0["state"]["league"] == league and rank_0["state"]["last_win_rate"] == 0.5
        for module_id, weights in rank_0["weights"].items():
            for name, value in weights.items():
                np.testing.assert_array_equal(value, rank_1["weights"][module_id][name], err_msg=f"{module_id}/{name}")


def test_the_league_state_round_trips_loads_a_state_from_before_the_estimates_and_refuses_malformed_ones():
    league = SelfPlayLeague()
    old_state = {
        "league": ["main_v3", "main_v4"],
        "retired": ["main_v2"],
        "snapshots_added": 5,
        "rollouts": 50,
        "last_win_rate": 0.7,
    }
    league.load_state_dict(old_state)  # a checkpoint written before PFSP: no estimates, no minimum
    assert league.state_dict() == {**old_state, "last_min_win_rate": None, "win_rates": {}}
    state = {**old_state, "last_min_win_rate": 0.55, "win_rates": {"main_v3": [3.5, 7.25], "fixed_random": [9.0, 9.0]}}
    league.load_state_dict(state)
    assert league.state_dict() == state and league.win_rates.estimate("main_v3") == pytest.approx(4.5 / 9.25)
    with pytest.raises(ValueError, match="league and retired \\(lists of module ids\\)"):
        league.load_state_dict({**state, "league": "main_v3"})
    with pytest.raises(ValueError, match="win_rates must map opponent module ids to \\[wins, games\\]"):
        league.load_state_dict({**state, "win_rates": {"main_v3": [8.0, 7.0]}})


def test_fit_stops_at_the_start_without_the_main_module_or_a_multi_agent_data_module(tmp_path: Path):
    # The league's mapping sends the agents to 'hero': the Learner's setup finds its spec lacks it.
    with pytest.raises(ValueError, match="maps agents to modules \\['hero'\\], but the module spec has no module"):
        _fit(tmp_path, SelfPlayLeague("hero"), LeagueData())

    class LeagueDataWithoutModuleSpaces(LeagueData):
        module_spaces = None

    with pytest.raises(ValueError, match="trains the module 'hero', but the Learner holds \\['main'\\]"):
        _fit(tmp_path, SelfPlayLeague("hero"), LeagueDataWithoutModuleSpaces())

    class SingleAgentData(LightningDataModule):
        def train_dataloader(self) -> Any:
            return _BatchesForEveryModule(self.trainer.lightning_module, 1)

    with pytest.raises(ValueError, match="SingleAgentData has no \\['possible_agents', 'set_policy_mapping_fn', 'play_episodes'\\]"):
        _fit(tmp_path, SelfPlayLeague(), SingleAgentData())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"evaluate_every_n_rollouts": 0}, "evaluate_every_n_rollouts must be an int >= 1"),
        ({"evaluation_num_episodes": 2.0}, "evaluation_num_episodes must be an int >= 1"),
        ({"max_league_size": 0}, "max_league_size must be an int >= 1"),
        ({"win_rate_threshold": 1.5}, "win_rate_threshold must be a number in \\[0, 1\\]"),
        ({"main_probability": -0.1}, "main_probability must be a number in \\[0, 1\\]"),
        ({"snapshot_prefix": "main.v"}, "must not contain '.'"),
        ({"snapshot_prefix": ""}, "snapshot_prefix must be a non-empty str"),
        ({"main_module_id": "v0", "snapshot_prefix": "v"}, "does not make main's id"),
        ({"seed": 1.5}, "seed must be an int"),
        ({"evaluation_explore": "yes"}, "evaluation_explore must be True or False"),
        ({"main_module_id": ""}, "non-empty"),
    ],
)
def test_arguments_out_of_range_are_refused_naming_them(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        SelfPlayLeague(**kwargs)


def _connect_four_fit(root: Path, budget: int, ckpt_path: str | None = None) -> tuple[PPOLearner, SelfPlayLeague, Any]:
    from lightning_rl.data import MultiAgentDataModule

    torch.manual_seed(0)
    league = SelfPlayLeague(evaluate_every_n_rollouts=1, evaluation_num_episodes=2, win_rate_threshold=0.0)
    data = MultiAgentDataModule(
        "pettingzoo.classic.connect_four_v3", num_envs=2, rollout_fragment_length=16, seed=0,
        rollouts_per_epoch=2, max_env_steps=budget, evaluation_num_episodes=2,
    )  # fmt: skip
    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=None)
    checkpoints = ModelCheckpoint(dirpath=root / "ckpts", save_last=True)
    trainer = make_trainer(root, max_epochs=-1, callbacks=[league, checkpoints], enable_checkpointing=True)
    trainer.fit(learner, datamodule=data, ckpt_path=ckpt_path)
    return learner, league, checkpoints


def test_snapshots_added_mid_fit_on_connect_four_are_restored_on_resume(tmp_path: Path):
    pytest.importorskip("pettingzoo")
    first, first_league, checkpoints = _connect_four_fit(tmp_path / "a", budget=64)
    assert first_league.league == ["main_v0", "main_v1"]
    resumed, resumed_league, _ = _connect_four_fit(tmp_path / "b", budget=128, ckpt_path=checkpoints.last_model_path)
    # Restored, then two more rollouts: two more snapshots, numbered on.
    assert resumed_league.rollouts == 4 and resumed_league.league == ["main_v0", "main_v1", "main_v2", "main_v3"]
    for module_id in first_league.league:
        assert_same(_weights(resumed, module_id), _weights(first, module_id), module_id)
    assert not resumed.should_module_be_updated("main_v0") and resumed.should_module_be_updated(MAIN)


# ----------------------------------------------------------------------------------------
# PFSP, fixed opponents, the every-member rule
# ----------------------------------------------------------------------------------------


def _finished_game(episode_id: str, mapping: dict[str, str], returns: dict[str, float]) -> MultiAgentEpisode:
    """A finished one-chunk game in which ``mapping``'s modules played and ended with ``returns``."""
    episode = MultiAgentEpisode(episode_id, agent_to_module_mapping_fn=lambda agent, _: mapping[agent])
    episode.add_env_reset({"player_0": 0})
    episode.add_env_step({"player_1": 0}, {"player_0": 1}, {})
    done = {"player_0": True, "player_1": True, "__all__": True}
    episode.add_env_step({"player_0": 1, "player_1": 1}, {"player_1": 2}, returns, terminateds=done)
    return episode


def test_training_games_are_scored_per_opponent_over_their_chunks_draws_not_wins():
    from lightning_rl.callbacks.opponent_win_rates import TrainingGameScorer

    scorer = TrainingGameScorer(MAIN)
    seats = {"player_0": MAIN, "player_1": "main_v0"}
    # A game cut by the rollout: its first chunk holds main's reward, the game ends in the next rollout.
    first = MultiAgentEpisode("long", agent_to_module_mapping_fn=lambda agent, _: seats[agent])
    first.add_env_reset({"player_0": 0})
    first.add_env_step({"player_1": 0}, {"player_0": 1}, {"player_0": 1.0})
    assert scorer.score([first]) == {}
    rest = first.cut()
    done = {"player_0": True, "player_1": True, "__all__": True}
    rest.add_env_step({"player_0": 1, "player_1": 1}, {"player_1": 2}, {"player_1": 0.5}, terminateds=done)
    tally = scorer.score([
        rest,
        _finished_game("draw", seats, {"player_0": 0.0, "player_1": 0.0}),
        _finished_game("loss", {"player_0": "fixed_random", "player_1": MAIN}, {"player_0": 1.0, "player_1": -1.0}),
        _finished_game("self", {"player_0": MAIN, "player_1": MAIN}, {"player_0": 1.0, "player_1": -1.0}),
    ])  # fmt: skip
    # 1.0 + 0 against 0.5: a win; the draw is no win; main against itself counts as a game without wins.
    assert tally == {"main_v0": [1.0, 2.0], "fixed_random": [0.0, 1.0], MAIN: [0.0, 1.0]}


def test_running_estimates_decay_with_newer_games_and_start_at_one_half():
    from lightning_rl.callbacks.opponent_win_rates import OpponentWinRates

    rates = OpponentWinRates(window=10)
    assert rates.estimate("main_v0") == 0.5
    rates.record({"main_v0": (10.0, 10.0)})
    assert rates.estimate("main_v0") == pytest.approx(11 / 12)
    rates.record({"main_v0": (0.0, 20.0)})  # 20 newer losses: the 10 wins decay by 0.9 ** 20
    decayed = 10 * 0.9**20
    assert rates.estimate("main_v0") == pytest.approx((decayed + 1) / (decayed + 20 + 2))
    assert rates.pfsp_weights(["main_v0", "new"], 2.0) == pytest.approx([(1 - rates.estimate("main_v0")) ** 2, 0.25])
    with pytest.raises(ValueError, match="win_rate_window must be an int >= 1"):
        OpponentWinRates(0)


def test_pfsp_draws_each_snapshot_by_the_square_of_mains_loss_rate_against_it():
    members = ["main_v0", "main_v1", "main_v2"]
    league = _league_with_members(members, main_probability=0.0, opponent_sampling="pfsp", win_rate_window=10**6)
    league.win_rates.record({"main_v0": (98.0, 98.0), "main_v1": (49.0, 98.0), "main_v2": (8.0, 98.0)})
    # Estimates 0.99, 0.5 and 0.09: weights 0.0001, 0.25 and 0.8281.
    expected = {member: (1 - league.win_rates.estimate(member)) ** 2 for member in members}
    total = sum(expected.values())
    assert league.opponent_probabilities() == pytest.approx({MAIN: 0.0, **{m: w / total for m, w in expected.items()}})
    opponents = [module_id for match_up in _match_ups(league, 4000) for module_id in match_up if module_id != MAIN]
    for member in members:
        assert opponents.count(member) / 4000 == pytest.approx(expected[member] / total, abs=0.025)
    assert opponents == [m for mu in _match_ups(league, 4000) for m in mu if m != MAIN]  # seeded: the same draws
    uniform = _league_with_members(members, main_probability=0.0)
    uniform.win_rates.record({"main_v0": (98.0, 98.0)})
    assert uniform.opponent_probabilities() == pytest.approx({MAIN: 0.0, **{m: 1 / 3 for m in members}})


def test_fixed_opponents_join_the_learner_untrained_and_take_their_share_of_training_games():
    league = SelfPlayLeague(fixed_opponents=["random"], fixed_opponent_share=0.25, main_probability=0.4)
    learner = _learner()
    learner.build()
    league.setup(SimpleNamespace(datamodule=LeagueData()), learner, "fit")
    assert set(_match_ups(league, 50)) == {(MAIN, MAIN)}  # not in the Learner yet: never drawn
    league.on_train_start(SimpleNamespace(), learner)
    assert list(learner.module.keys()) == [MAIN, "fixed_random"] and not learner.should_module_be_updated("fixed_random")
    assert isinstance(learner.module["fixed_random"], RandomLegalModule)
    assert learner.module["fixed_random"].generator is None  # draws from the sampling stream, which is saved
    league.league = ["main_v0"]
    match_ups = _match_ups(league, 4000)
    opponents = [next((m for m in match_up if m != MAIN), MAIN) for match_up in match_ups]
    assert opponents.count("fixed_random") / 4000 == pytest.approx(0.25, abs=0.02)
    # The other games: main itself with main_probability, else the league.
    assert opponents.count(MAIN) / 4000 == pytest.approx(0.75 * 0.4, abs=0.02)
    assert league.opponent_probabilities() == pytest.approx({"fixed_random": 0.25, MAIN: 0.3, "main_v0": 0.45})


def test_main_is_snapshotted_only_when_it_beats_every_member_not_on_average(tmp_path: Path):
    # Main beats main_v0 and loses to main_v1: a mean of 0.5 reaches the threshold, the minimum does not.
    league = SelfPlayLeague(evaluate_every_n_rollouts=1, evaluation_num_episodes=4, win_rate_threshold=0.5)
    data = LeagueData(num_items=4, main_result=1.0, results={"main_v1": -1.0})
    _, trainer = _fit(tmp_path, league, data)
    assert league.league == ["main_v0", "main_v1"]
    assert league.last_win_rate == 0.5 and league.last_min_win_rate == 0.0
    # The epoch's mean over its evaluations against a league: 1.0 (main_v0 alone), then 0.0 twice.
    assert trainer.callback_metrics["league/min_win_rate"].item() == pytest.approx(1 / 3)
    assert data.matches[-2:] == [("main_v0", 2, True), ("main_v1", 2, True)]


def test_fixed_opponents_are_played_at_each_evaluation_and_logged_without_gating_snapshots(tmp_path: Path):
    league = SelfPlayLeague(
        evaluate_every_n_rollouts=2, evaluation_num_episodes=4, fixed_opponents=["random"], fixed_opponent_share=0.5
    )
    data = LeagueData(num_items=4, main_result=1.0, results={"fixed_random": -1.0})
    learner, trainer = _fit(tmp_path, league, data)
    # Both evaluations played the fixed opponent; main lost to it, and was snapshotted all the same.
    assert data.matches == [("fixed_random", 4, True), ("main_v0", 2, True), ("fixed_random", 2, True)]
    assert league.league == ["main_v0", "main_v1"]
    assert trainer.callback_metrics["league/win_rate_vs_random"].item() == 0.0
    assert sorted(learner.module.keys()) == ["fixed_random", MAIN, "main_v0", "main_v1"]


def test_arguments_of_pfsp_and_fixed_opponents_are_checked():
    for kwargs, message in [
        ({"opponent_sampling": "elo"}, "opponent_sampling must be one of \\('uniform', 'pfsp'\\)"),
        ({"pfsp_exponent": -1.0}, "pfsp_exponent must be a finite number >= 0"),
        ({"win_rate_window": 0}, "win_rate_window must be an int >= 1"),
        ({"fixed_opponents": ["champion"]}, "fixed_opponents \\['champion'\\] unknown"),
        ({"fixed_opponents": "random"}, "fixed_opponents must be a list of names"),
        ({"fixed_opponents": ["random", "random"]}, "names one opponent twice"),
        ({"fixed_opponent_share": 0.2}, "fixed_opponent_share is 0.2, but fixed_opponents is empty"),
        ({"fixed_opponent_share": 1.5, "fixed_opponents": ["random"]}, "fixed_opponent_share must be a number in"),
        ({"main_module_id": "fixed_random", "fixed_opponents": ["random"]}, "is a fixed opponent's module id"),
    ]:
        with pytest.raises(ValueError, match=message):
            SelfPlayLeague(**kwargs)


def _pfsp_connect_four_fit(root: Path, budget: int, ckpt_path: str | None = None, callbacks: list | None = None) -> Any:
    """A short connect-four fit with PFSP and both fixed opponents (half the games); returns the league, Learner, Trainer."""
    from lightning_rl.data import MultiAgentDataModule

    torch.manual_seed(0)
    league = SelfPlayLeague(
        evaluate_every_n_rollouts=2, evaluation_num_episodes=3, win_rate_threshold=0.0, opponent_sampling="pfsp",
        fixed_opponents=["random", "heuristic"], fixed_opponent_share=0.5,
    )  # fmt: skip
    data = MultiAgentDataModule(
        "pettingzoo.classic.connect_four_v3", num_envs=4, rollout_fragment_length=24, seed=0,
        rollouts_per_epoch=2, max_env_steps=budget, evaluation_num_episodes=2,
    )  # fmt: skip
    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=None)
    trainer = make_trainer(root, max_epochs=-1, callbacks=[league, *(callbacks or [])], enable_checkpointing=True)
    trainer.fit(learner, datamodule=data, ckpt_path=ckpt_path)
    return league, learner, trainer


def test_a_connect_four_fit_with_pfsp_and_fixed_opponents_scores_its_games_and_resumes_them(tmp_path: Path):
    pytest.importorskip("pettingzoo")
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last=True)
    league, _, trainer = _pfsp_connect_four_fit(tmp_path / "a", budget=4 * 96, callbacks=[checkpoints])
    # 4 rollouts of 96 moves: finished games against both fixed opponents were scored.
    assert {"fixed_random", "fixed_heuristic"} <= set(league.win_rates.counts)
    assert 0 < trainer.callback_metrics["league/fixed_opponent_share"].item() < 1
    for key in ("league/win_rate_vs_random", "league/win_rate_vs_heuristic", "league/train_win_rate_min"):
        assert key in trainer.callback_metrics
    assert league.league == ["main_v0", "main_v1"]
    saved = torch.load(checkpoints.last_model_path, weights_only=True, map_location="cpu")["callbacks"][league.state_key]
    assert saved == league.state_dict() and saved["win_rates"]

    class LeagueAtStart(Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            self.state = trainer.callbacks[0].state_dict()
            self.modules = sorted(pl_module.module.keys())

    at_start = LeagueAtStart()
    resumed_league, learner, _ = _pfsp_connect_four_fit(
        tmp_path / "b", budget=6 * 96, ckpt_path=checkpoints.last_model_path, callbacks=[at_start]
    )
    # Restored as saved (the estimates included), the fixed opponents rebuilt once, untrained.
    assert at_start.state == saved
    assert at_start.modules == ["fixed_heuristic", "fixed_random", MAIN, "main_v0", "main_v1"]
    assert not learner.should_module_be_updated("fixed_heuristic") and resumed_league.rollouts > saved["rollouts"]


def test_under_pfsp_the_fixed_share_goes_mostly_to_the_fixed_opponent_main_beats_least():
    pytest.importorskip("pettingzoo")
    runner = MultiAgentEnvRunner("pettingzoo.classic.connect_four_v3", num_envs=1, seed=0)
    spaces = {"observation_space": runner.observation_space("player_0"), "action_space": runner.action_space("player_0")}
    learner = PPOLearner(MultiRLModuleSpec({MAIN: RLModuleSpec(module_class=PPOModule, **spaces)}), minibatch_size=None)
    learner.build()
    league = SelfPlayLeague(
        fixed_opponents=["random", "heuristic"], fixed_opponent_share=0.5, opponent_sampling="pfsp",
        win_rate_window=10**6,
    )  # fmt: skip
    league.setup(SimpleNamespace(datamodule=LeagueData()), learner, "fit")
    league.on_train_start(SimpleNamespace(), learner)
    league.win_rates.record({"fixed_random": (98.0, 98.0), "fixed_heuristic": (8.0, 98.0)})  # 0.99 and 0.09
    weights = {"fixed_random": 0.01**2, "fixed_heuristic": 0.91**2}
    probabilities = league.opponent_probabilities()
    for module_id, weight in weights.items():
        assert probabilities[module_id] == pytest.approx(0.5 * weight / sum(weights.values()))
    opponents = [next((m for m in match_up if m != MAIN), MAIN) for match_up in _match_ups(league, 2000)]
    assert opponents.count("fixed_heuristic") / 2000 == pytest.approx(probabilities["fixed_heuristic"], abs=0.03)
    runner.close()
