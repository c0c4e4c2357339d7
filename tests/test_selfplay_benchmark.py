"""``benchmarks/multi_agent.py``: ``--final-eval-games N`` (connect four's larger final evaluation), ``--json``.

The in-training evaluation plays 100 games per opponent, too few to decide misses of 0.01-0.04;
``--final-eval-games`` evaluates the final weights with ``lightning-rl evaluate`` on N more
games per fixed opponent, main in each seat equally often. These tests pin the flag's checks and
that the evaluation reports N games per opponent, split evenly over the seats; and that ``--json``
holds every finished run when a long benchmark is stopped part-way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from _helpers import fit_small_self_play

pytest.importorskip("pettingzoo")


@pytest.fixture
def multi_agent_benchmark(import_benchmark) -> ModuleType:
    return import_benchmark("multi_agent")


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
    multi_agent_benchmark: ModuleType, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
):
    with pytest.raises(SystemExit):
        multi_agent_benchmark.parse_args(argv)
    assert message in capsys.readouterr().err


def test_final_evaluation_plays_n_games_per_opponent_half_in_each_seat(
    multi_agent_benchmark: ModuleType, tmp_path: Path
):
    fit_small_self_play(tmp_path)
    ckpt = tmp_path / "checkpoints" / "last.ckpt"

    results = multi_agent_benchmark.final_evaluation(ckpt, num_games=4, seed=0, threads=1)

    assert sorted(results) == ["heuristic", "random"]
    for opponent, record in results.items():
        assert record["num_episodes"] == 4, opponent
        assert record["wins"] + record["draws"] + record["losses"] == 4, opponent
        assert record["win_rate"] == record["wins"] / 4, opponent
        seats = record["seats"]
        assert sorted(seats) == ["player_0", "player_1"], opponent
        for seat in seats.values():
            assert seat["wins"] + seat["draws"] + seat["losses"] == 2, (opponent, seat)


def test_json_holds_every_finished_run_when_the_benchmark_stops(
    multi_agent_benchmark: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A long benchmark stopped mid-way (Ctrl-C, a timeout) keeps every run that finished in its ``--json``."""
    out = tmp_path / "runs.json"
    finished: list[dict] = []

    def run_child(variant: str, seed: int, args: object) -> dict:
        if len(finished) == 3:
            raise KeyboardInterrupt
        record = {"variant": variant, "seed": seed, "status": "OK", "return_mean_per_agent": -20.0 - len(finished),
                  "env_steps_per_s": 100.0, "env_steps": 1000, "returncode": 0}  # fmt: skip
        finished.append(record)
        return record

    monkeypatch.setattr(multi_agent_benchmark, "run_child", run_child)
    monkeypatch.setattr(multi_agent_benchmark, "print_versions", dict)
    argv = ["multi_agent.py", "--variants", "ours", "handwritten", "--seeds", "0", "1", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(KeyboardInterrupt):
        multi_agent_benchmark.main()

    saved = json.loads(out.read_text())
    assert saved["runs"] == finished and len(finished) == 3
    assert saved["config"]["seeds"] == [0, 1]
    # Seed 0 ran ours, then the hand-written loop; seed 1 starts with the hand-written loop (rotated order).
    assert saved["summary"]["ours"]["runs"] == 1 and saved["summary"]["handwritten"]["runs"] == 2
