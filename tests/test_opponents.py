"""The fixed opponents on PettingZoo's real connect_four: legal moves only, wins taken, threats blocked."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")
from pettingzoo.classic import connect_four_v3  # noqa: E402

from lightning_rl.env.opponents import OPPONENTS, ConnectFourHeuristicModule, RandomLegalModule  # noqa: E402


def _spaces():
    env = connect_four_v3.env()
    return env.observation_space("player_0"), env.action_space("player_0")


def _opponent(cls, seed: int | None):
    observation_space, action_space = _spaces()
    return cls(observation_space, action_space, model_config={"seed": seed})


def _act(module, observations: list[dict]) -> np.ndarray:
    batch = {
        "obs": torch.as_tensor(np.stack([o["observation"] for o in observations])),
        "action_mask": torch.as_tensor(np.stack([o["action_mask"] for o in observations])),
    }
    return module.forward_inference(batch)["actions"].numpy()


def _env_after(moves: list[int]):
    env = connect_four_v3.env()
    env.reset(seed=0)
    for move in moves:
        env.step(move)
    return env


def _observation(env) -> dict:
    return env.observe(env.agent_selection)


def _winning_columns_in_env(moves: list[int]) -> set[int]:
    """The columns that win at once for the player to move after ``moves``, found by playing each in the env."""
    agent = _env_after(moves).agent_selection
    wins = set()
    for column in range(7):
        env = _env_after(moves)
        if _observation(env)["action_mask"][column]:
            env.step(column)
            if env.terminations[agent] and env.rewards[agent] == 1:
                wins.add(column)
    return wins


def _completing_columns(boards: np.ndarray, plane: int) -> np.ndarray:
    """``[N, 7]`` bool: where a piece of ``plane``'s player would complete four now, for boards ``[N, 6, 7, 2]``.

    Written with numpy slices (not the module's convolutions), column by column.
    """
    occupied = boards.sum(axis=3) > 0
    completes = np.zeros((len(boards), 7), dtype=bool)
    for column in range(7):
        landing_row = (~occupied[:, :, column]).sum(axis=1) - 1
        open_column = landing_row >= 0
        pieces = boards[:, :, :, plane].astype(bool)
        pieces[np.flatnonzero(open_column), landing_row[open_column], column] = True
        completes[:, column] = _has_four(pieces) & open_column
    return completes


def _has_four(p: np.ndarray) -> np.ndarray:
    """``[N]`` bool: whether each of the boards ``[N, 6, 7]`` holds four in a row in any direction."""
    lines = (
        p[:, :, :-3] & p[:, :, 1:-2] & p[:, :, 2:-1] & p[:, :, 3:],
        p[:, :-3] & p[:, 1:-2] & p[:, 2:-1] & p[:, 3:],
        p[:, :-3, :-3] & p[:, 1:-2, 1:-2] & p[:, 2:-1, 2:-1] & p[:, 3:, 3:],
        p[:, :-3, 3:] & p[:, 1:-2, 2:-1] & p[:, 2:-1, 1:-2] & p[:, 3:, :-3],
    )
    return np.any([line.any(axis=(1, 2)) for line in lines], axis=0)


def _columns(row: np.ndarray) -> set[int]:
    return {int(column) for column in np.flatnonzero(row)}


def _random_positions(count: int, seed: int) -> list[dict]:
    """Observations of the player to move, at every turn of games of uniform random play."""
    rng = np.random.default_rng(seed)
    env = connect_four_v3.env()
    positions: list[dict] = []
    while len(positions) < count:
        env.reset(seed=int(rng.integers(1 << 30)))
        while not any(env.terminations.values()) and len(positions) < count:
            observation = _observation(env)
            positions.append(observation)
            env.step(int(rng.choice(np.flatnonzero(observation["action_mask"]))))
    return positions


def test_the_observation_has_the_acting_players_pieces_in_plane_0_and_the_bottom_in_row_5():
    env = _env_after([3, 3])  # player_0 then player_1 drop in column 3
    board = _observation(env)["observation"]  # player_0 to move
    assert board[5, 3, 0] == 1 and board[4, 3, 1] == 1
    assert board.sum() == 2


@pytest.mark.parametrize(
    "moves, winning",
    [
        ([0, 6, 0, 6, 0, 5], {0}),  # vertical: three in column 0
        ([1, 1, 2, 2, 3, 6], {0, 4}),  # horizontal: three on the bottom row, open at both ends
        ([0, 1, 1, 2, 2, 3, 2, 3, 3, 6], {3}),  # diagonal up to the right, completed at the top of column 3
    ],
)
def test_the_heuristic_takes_an_immediate_win(moves, winning):
    assert _winning_columns_in_env(moves) == winning  # the position is what the test means
    observation = _observation(_env_after(moves))
    # The checker of the random-position test below agrees.
    assert _columns(_completing_columns(observation["observation"][None], plane=0)[0]) == winning
    for seed in range(5):
        assert int(_act(_opponent(ConnectFourHeuristicModule, seed), [observation])[0]) in winning


def test_the_heuristic_blocks_the_opponents_immediate_win():
    moves = [0, 6, 0, 6, 0]  # player_0 threatens column 0; player_1 to move, with no win of its own
    assert _winning_columns_in_env(moves) == set()
    env = _env_after(moves)
    assert _columns(_completing_columns(_observation(env)["observation"][None], plane=1)[0]) == {0}
    for seed in range(5):
        assert int(_act(_opponent(ConnectFourHeuristicModule, seed), [_observation(env)])[0]) == 0


def test_in_random_positions_the_heuristic_plays_legal_moves_wins_when_it_can_and_else_blocks():
    observations = _random_positions(2000, seed=0)
    actions = _act(_opponent(ConnectFourHeuristicModule, 0), observations)
    boards = np.stack([observation["observation"] for observation in observations])
    all_wins, all_threats = _completing_columns(boards, plane=0), _completing_columns(boards, plane=1)
    took_wins = blocked = 0
    for observation, action, wins, threats in zip(observations, actions, all_wins, all_threats):
        assert observation["action_mask"][action] == 1
        wins, threats = _columns(wins), _columns(threats)
        if wins:
            assert action in wins
            took_wins += 1
        elif threats:
            assert action in threats
            blocked += 1
    # Enough of both cases that the checks above mean something.
    assert took_wins > 100 and blocked > 100


def test_random_legal_plays_only_legal_moves_and_every_legal_one():
    observations = _random_positions(300, seed=1)
    module = _opponent(RandomLegalModule, 0)
    seen = np.zeros(7, dtype=bool)
    for _ in range(10):
        actions = _act(module, observations)
        masks = np.stack([o["action_mask"] for o in observations])
        assert masks[np.arange(len(actions)), actions].all()
        seen[actions] = True
    assert seen.all()


def test_random_legal_without_a_mask_is_uniform_over_all_actions():
    module = RandomLegalModule(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4), model_config={"seed": 0})
    actions = module.forward_exploration({"obs": torch.zeros(4000, 3)})["actions"]
    counts = torch.bincount(actions, minlength=4)
    assert actions.dtype == torch.int64
    assert counts.min() > 900 and counts.max() < 1100


def test_the_same_seed_gives_the_same_choices_and_another_seed_others():
    observations = _random_positions(200, seed=2)
    for cls in OPPONENTS.values():
        first, again, other = (_act(_opponent(cls, seed), observations) for seed in (7, 7, 8))
        assert (first == again).all()
        assert (first != other).any()


def test_without_a_seed_the_choices_come_from_torchs_global_generator():
    # What the league's fixed opponents use: the data module's sampling stream governs (and
    # checkpoints) their draws, so a resumed fit does not replay the draws of its start.
    observations = _random_positions(200, seed=2)
    for cls in OPPONENTS.values():
        module = _opponent(cls, None)
        torch.manual_seed(5)
        seeded = torch.get_rng_state()
        first = _act(module, observations)
        assert not torch.equal(torch.get_rng_state(), seeded)  # it drew from the global stream
        torch.manual_seed(5)
        assert (_act(module, observations) == first).all()
        torch.manual_seed(6)
        assert (_act(module, observations) != first).any()


def _play_games(players: list[dict]) -> list[dict[str, float]]:
    """Play one game per entry of ``players`` (``{agent: module}``) over AEC envs in lock step.

    Each turn, every module acts once for all the games where one of its agents is to move.
    Returns each game's returns per agent.
    """
    envs = [connect_four_v3.env() for _ in players]
    for game, env in enumerate(envs):
        env.reset(seed=game)
    returns = [dict.fromkeys(env.possible_agents, 0.0) for env in envs]
    while any(env.agents for env in envs):
        to_move: dict[int, list[int]] = {}
        for game, env in enumerate(envs):
            if not env.agents:
                continue
            _, reward, termination, truncation, _ = env.last()
            returns[game][env.agent_selection] += reward
            if termination or truncation:
                env.step(None)
            else:
                to_move.setdefault(id(players[game][env.agent_selection]), []).append(game)
        for games in to_move.values():
            module = players[games[0]][envs[games[0]].agent_selection]
            actions = _act(module, [_observation(envs[game]) for game in games])
            for game, action in zip(games, actions):
                envs[game].step(int(action))
    return returns


def test_the_heuristic_beats_random_in_at_least_80_percent_of_200_games_in_both_seats():
    heuristic, random_player = _opponent(ConnectFourHeuristicModule, 0), _opponent(RandomLegalModule, 1)
    seats = [("player_0", "player_1") if game % 2 == 0 else ("player_1", "player_0") for game in range(200)]
    returns = _play_games([{seat: heuristic, other: random_player} for seat, other in seats])
    wins = sum(game[seat] > game[other] for game, (seat, other) in zip(returns, seats))
    assert wins >= 160


def test_a_mask_of_the_wrong_shape_or_without_a_legal_action_is_refused():
    module = _opponent(RandomLegalModule, 0)
    obs = torch.zeros(2, 6, 7, 2)
    with pytest.raises(ValueError, match=r"'action_mask' has shape \(2, 6\), expected \(2, 7\)"):
        module.forward_inference({"obs": obs, "action_mask": torch.ones(2, 6)})
    with pytest.raises(ValueError, match="allows no action"):
        module.forward_inference({"obs": obs, "action_mask": torch.tensor([[1] * 7, [0] * 7])})


def test_the_opponents_refuse_spaces_they_cannot_play_and_are_never_trained():
    with pytest.raises(ValueError, match=r"Discrete\(n\)"):
        RandomLegalModule(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,)))
    with pytest.raises(ValueError, match=r"connect_four board.*\(4,\)"):
        ConnectFourHeuristicModule(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(7))
    with pytest.raises(ValueError, match="seed"):
        _opponent(RandomLegalModule, -1)
    with pytest.raises(RuntimeError, match="never trained"):
        _opponent(RandomLegalModule, 0).forward_train({"obs": torch.zeros(1, 6, 7, 2)})
