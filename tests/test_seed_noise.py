"""benchmarks/seed_noise.py: the permutation test of a median gap, and the result files it pools."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture
def seed_noise(import_benchmark):
    return import_benchmark("seed_noise")


def test_the_p_value_counts_the_splits_at_or_below_the_observed_median_gap(seed_noise):
    # Of the 20 splits of six runs into 3 + 3, only the observed one and {1, 2, 10} | {3, 11, 12} give a gap of -9.
    assert seed_noise.median_gap_p_value([1.0, 2.0, 3.0], [10.0, 11.0, 12.0]) == (-9.0, 0.1)
    # Ours ahead by the most any split gives: every split's gap is at most this.
    assert seed_noise.median_gap_p_value([10.0, 11.0, 12.0], [1.0, 2.0, 3.0]) == (9.0, 1.0)


def test_past_the_exact_limit_the_p_value_is_estimated_from_seeded_random_splits(seed_noise, monkeypatch):
    rng = np.random.default_rng(3)
    ours, other = list(rng.normal(0.0, 1.0, 10)), list(rng.normal(0.5, 1.0, 10))
    exact = seed_noise.median_gap_p_value(ours, other)  # 184,756 splits, every one counted
    assert seed_noise.exactness(10, 10) == "exact"
    assert seed_noise.exactness(12, 12) == "estimated from 100,000 random splits"
    monkeypatch.setattr(seed_noise, "EXACT_SPLITS_LIMIT", 1000)
    estimate = seed_noise.median_gap_p_value(ours, other)
    assert estimate[0] == exact[0] and estimate[1] != exact[1] and abs(estimate[1] - exact[1]) < 0.01
    assert seed_noise.median_gap_p_value(ours, other) == estimate  # seeded: a report reproduces
    # 40 + 40 runs (10^23 splits): two separated groups give a p-value near 0, swapped exactly 1.
    low, high = list(np.arange(40.0)), list(np.arange(40.0) + 100)
    assert seed_noise.median_gap_p_value(low, high)[1] < 1e-4
    assert seed_noise.median_gap_p_value(high, low)[1] == 1.0


def _suite_record(library: str, seed: int, final: float, status: str = "done") -> dict:
    evals = [{"env_steps": 100, "return_mean": final - 50}, {"env_steps": 200, "return_mean": final}]
    return {"task": "dqn_lunarlander", "library": library, "seed": seed, "max_env_steps": 200, "status": status,
            "evals": evals}


def test_the_report_pools_every_kind_of_result_file_once_per_seed(seed_noise, tmp_path: Path, capsys):
    files = {
        "dqn-ours-seed0.json": _suite_record("ours", 0, 100.0),
        "dqn-ours-seed1.json": _suite_record("ours", 1, 120.0),
        "dqn-ours-seed2.json": _suite_record("ours", 2, 999.0, status="running"),  # unfinished: left out
        "dqn-sb3-seed0.json": _suite_record("sb3", 0, 200.0),
        "dqn-sb3-seed1.json": _suite_record("sb3", 1, 220.0),
        # Runs that also played their final policy (suite.py --final-episodes): that reading is a task of its own.
        "played-ours-seed0.json": {**_suite_record("ours", 0, 50.0), "max_env_steps": 300,
                                   "final_evaluation": {"num_episodes": 100, "return_mean": 240.0}},
        "played-ours-seed1.json": {**_suite_record("ours", 1, 60.0), "max_env_steps": 300,
                                   "final_evaluation": {"num_episodes": 100, "return_mean": 250.0}},
        "played-sb3-seed0.json": {**_suite_record("sb3", 0, 70.0), "max_env_steps": 300,
                                  "final_evaluation": {"num_episodes": 100, "return_mean": 230.0}},
        "spread.json": {"config": {"game": "simple_spread"}, "runs": [
            {"variant": variant, "seed": seed, "status": "OK", "return_mean_per_agent": value, "env_steps": steps}
            for variant, seed, value, steps in [("ours", 0, -19.0, 1000), ("ours", 1, -20.0, 1000),
                                                ("handwritten", 0, -19.5, 1000), ("handwritten", 1, -19.4, 1000),
                                                ("random", 0, -27.0, 800)]
        ]},
        "cql.json": {"args": {"steps": 4000}, "runs": [
            {"variant": variant, "algo": "cql", "dataset": "pendulum/sac-medium-v0", "seed": seed,
             "eval_return_mean": value}
            for variant, seed, value in [("ours", 0, -450.0), ("ours", 1, -400.0), ("d3rlpy", 0, -420.0),
                                         ("d3rlpy", 1, -430.0)]
        ]},
        # Ours with another update order: its own variant, never pooled with the example's runs.
        "cql_critics_first.json": {"args": {"steps": 4000, "cql_update_order": "critics_first"}, "runs": [
            {"variant": "ours", "algo": "cql", "dataset": "pendulum/sac-medium-v0", "seed": seed,
             "eval_return_mean": value} for seed, value in [(0, -300.0), (1, -310.0)]
        ]},
        # Every one of d3rlpy's settings at once: the flags as written, in offline.py's order.
        "cql_matched.json": {"args": {"steps": 4000, "cql_update_order": "critics_first",
                                      "sample_with_replacement": True, "cql_temperature_loss": "alpha",
                                      "cql_critic_eps": 5e-9}, "runs": [
            {"variant": "ours", "algo": "cql", "dataset": "pendulum/sac-medium-v0", "seed": seed,
             "eval_return_mean": value} for seed, value in [(0, -500.0), (1, -450.0)]
        ]},
        # Another penalty weight in both libraries: a task of its own, ours and d3rlpy compared within it.
        "cql_weight_1.json": {"args": {"steps": 4000, "cql_weight": 1.0}, "runs": [
            {"variant": variant, "algo": "cql", "dataset": "pendulum/sac-medium-v0", "seed": seed,
             "eval_return_mean": value}
            for variant, seed, value in [("ours", 0, -200.0), ("ours", 1, -210.0), ("d3rlpy", 0, -300.0),
                                         ("d3rlpy", 1, -310.0)]
        ]},
        # The same id recorded elsewhere (another mean return): another task, though its seeds repeat.
        "cql_other_recording.json": {"args": {"steps": 4000}, "runs": [
            {"variant": variant, "algo": "cql", "dataset": "pendulum/sac-medium-v0", "seed": seed,
             "eval_return_mean": value, "dataset_return_mean": -436.2}
            for variant, seed, value in [("ours", 0, -440.0), ("ours", 1, -430.0), ("d3rlpy", 0, -460.0),
                                         ("d3rlpy", 1, -470.0)]
        ]},
    }  # fmt: skip
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    (tmp_path / "run.log").write_text("not a result")
    # A copy of seed 0's record in another directory counts once.
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "dqn-ours-seed0.json").write_text(json.dumps(files["dqn-ours-seed0.json"]))
    seed_noise.main([str(path) for path in sorted(tmp_path.rglob("*")) if path.is_file()])
    out = capsys.readouterr().out
    assert "ours         n=2   median     110.00" in out
    assert "ours - sb3: median gap -100.00, one-sided permutation p 0.167 (exact; 2 + 2 runs)" in out
    assert "ours - handwritten: median gap -0.05" in out and "ours - random" not in out
    assert "cql pendulum/sac-medium-v0, 4,000 gradient steps:" in out and "ours - d3rlpy: median gap +0.00" in out
    assert "ours --cql-update-order critics_first - d3rlpy: median gap +120.00" in out
    matched = "ours --cql-update-order critics_first --sample-with-replacement --cql-temperature-loss alpha"
    assert f"{matched} --cql-critic-eps 5e-09 - d3rlpy: median gap -50.00" in out
    weight_1 = out.split("cql pendulum/sac-medium-v0, 4,000 gradient steps --cql-weight 1.0:\n")[1]
    assert "ours - d3rlpy: median gap +100.00" in weight_1.split(":\n")[0]
    elsewhere = out.split("cql pendulum/sac-medium-v0 (data -436.2), 4,000 gradient steps:\n")[1]
    assert "ours - d3rlpy: median gap +30.00" in elsewhere.split(":\n")[0]
    assert "dqn_lunarlander, 200 env steps:" in out and "simple_spread, 800 env steps:" in out  # random's own budget
    played = out.split("dqn_lunarlander, 300 env steps, the final policy's 100 episodes on seeds of its own:\n")[1]
    assert "ours         n=2   median     245.00" in played.split(":\n")[0]
    periodic = out.split("dqn_lunarlander, 300 env steps:\n")[1]
    assert "ours         n=2   median      55.00" in periodic.split(":\n")[0]


def test_a_seed_read_twice_with_two_values_is_refused_naming_both_files(seed_noise, tmp_path: Path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "ours-seed0.json").write_text(json.dumps(_suite_record("ours", 0, 100.0)))
    (tmp_path / "b" / "ours-seed0.json").write_text(json.dumps(_suite_record("ours", 0, 101.0)))
    message = r"dqn_lunarlander, 200 env steps: ours seed 0: 100.0 in .*a/ours-seed0.json but 101.0 in"
    with pytest.raises(SystemExit, match=message):
        seed_noise.main([str(tmp_path / "a" / "ours-seed0.json"), str(tmp_path / "b" / "ours-seed0.json")])
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit, match="not a result file this script reads"):
        seed_noise.main([str(tmp_path / "other.json")])
