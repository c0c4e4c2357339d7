"""``benchmarks/multi_agent.py --game connect_four --final-eval-games N``: the larger final evaluation.

The in-training evaluation plays 100 games per opponent, too few to decide misses of 0.01-0.04;
``--final-eval-games`` evaluates the final weights with ``lightning-rl evaluate`` on N more
games per fixed opponent, main in each seat equally often. These tests pin the flag's checks and
that the evaluation reports N games per opponent, split evenly over the seats.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from _helpers import fit_small_self_play

pytest.importorskip("pettingzoo")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def selfplay_benchmark(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # the benchmarks import their siblings by name
    return importlib.import_module("multi_agent")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--game", "connect_four", "--final-eval-games", "401"], "--final-eval-games must be an even number"),
        (["--game", "connect_four", "--final-eval-games", "-2"], "--final-eval-games must be an even number"),
        (["--final-eval-games", "400"], "are for --game connect_four"),
        (["--checkpoint-dir", "ckpts"], "are for --game connect_four"),
    ],
)
def test_final_eval_flags_refuse_odd_counts_and_other_games(
    selfplay_benchmark: ModuleType, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
):
    with pytest.raises(SystemExit):
        selfplay_benchmark.parse_args(argv)
    assert message in capsys.readouterr().err


def test_final_evaluation_plays_n_games_per_opponent_half_in_each_seat(selfplay_benchmark: ModuleType, tmp_path: Path):
    fit_small_self_play(tmp_path)
    ckpt = tmp_path / "checkpoints" / "last.ckpt"

    results = selfplay_benchmark.final_evaluation(ckpt, num_games=4, seed=0, threads=1)

    assert sorted(results) == ["heuristic", "random"]
    for opponent, record in results.items():
        assert record["num_episodes"] == 4, opponent
        assert record["wins"] + record["draws"] + record["losses"] == 4, opponent
        assert record["win_rate"] == record["wins"] / 4, opponent
        seats = record["seats"]
        assert sorted(seats) == ["player_0", "player_1"], opponent
        for seat in seats.values():
            assert seat["wins"] + seat["draws"] + seat["losses"] == 2, (opponent, seat)
