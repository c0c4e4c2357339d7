"""``AsyncSamplingDataModule``: samplers apart from the Learner, a bounded queue, reuse, lag, faults, Ray.

Every fit here is short (a few CartPole rollouts of 16-32 steps); the sampler processes come
from a fork server that imports the package once, so a (re)start costs a fraction of a second.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _process_tree import signal_once_hanging, still_running
from _helpers import make_trainer
from lightning.pytorch import Callback, Trainer
from ranks import run_on_ranks

from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.core.data_contract import DataRequirements, SampleReuse
from lightning_rl.core.rl_module_specs import RLModuleSpec
from lightning_rl.cli.lightning_cli import misplaced_data_argument_hint
from lightning_rl.data import AsyncSamplingDataModule, OffPolicyDataModule, OnPolicyDataModule
from lightning_rl.data.circular_buffer import CircularBuffer
from lightning_rl.data.env_datamodule import ASYNC_SAMPLING_ARGUMENTS
from lightning_rl.env.env_settings import EnvSettings
from lightning_rl.env.sampler_pool import ProcessSamplerPool, SamplerFailedError

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------


def learner(cls: type[PPOLearner] = PPOLearner, **kwargs: Any) -> PPOLearner:
    """A tiny PPO Learner that takes one gradient step per update (so weights_seq_no counts updates)."""
    options = {"model_config": {"fcnet_hiddens": [8]}, "num_epochs": 1, "minibatch_size": 16}
    return cls(**{**options, **kwargs})


def async_data(env: Any = "CartPole-v1", **kwargs: Any) -> AsyncSamplingDataModule:
    options = {
        "num_envs": 1, "rollout_fragment_length": 16, "rollouts_per_epoch": 6, "seed": 0, "num_env_runners": 2,
        "evaluation_num_episodes": 1,
    }  # fmt: skip
    return AsyncSamplingDataModule(env, **{**options, **kwargs})


class Record(Callback):
    """Each item's ``env_runners``, the pool's counters, and every sampler pid seen, at each step."""

    def __init__(self, at_step: dict[int, Any] | None = None) -> None:
        self.items: list[dict[str, float]] = []
        self.pool_counts: list[tuple[int, int, int]] = []
        self.pids: set[int] = set()
        self.rollouts: list[Any] = []  # each item's episodes list (held, so that id() tells rollouts apart)
        self.at_step = at_step or {}

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        data = trainer.datamodule
        pool = data.pool
        self.items.append(dict(batch.env_runners))
        self.rollouts.append(batch.data.episodes)
        self.pool_counts.append((pool.num_requested, pool.num_taken, pool.num_queued))
        self.pids.update(pid for pid in pool.pids if pid is not None)
        if batch_idx in self.at_step:
            self.at_step[batch_idx](data)


def fit(data: AsyncSamplingDataModule, model: PPOLearner | None = None, **record: Any) -> Record:
    recorder = Record(**record)
    trainer = make_trainer(None, limit_val_batches=0, callbacks=[recorder])
    trainer.fit(model or learner(), datamodule=data)
    return recorder


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def descendants(pid: int) -> set[int]:
    """The pids of ``pid``'s children, their children, and so on (from /proc)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue
        for thread in threads:
            try:
                with open(f"/proc/{parent}/task/{thread}/children") as children:
                    new = {int(child) for child in children.read().split()} - found
            except FileNotFoundError:
                continue
            found |= new
            todo.extend(new)
    return found


def wait_until_gone(pids: set[int], seconds: float = 10.0) -> set[int]:
    """The pids still running after up to ``seconds``."""
    end = time.monotonic() + seconds
    while any(running(pid) for pid in pids) and time.monotonic() < end:
        time.sleep(0.05)
    return {pid for pid in pids if running(pid)}


def kill_a_sampler(data: AsyncSamplingDataModule) -> None:
    """``kill -9`` the first sampler whose process id the pool knows (a Ray actor's, once it answered), and wait
    until it is dead.

    The wait matters: SIGKILL lands asynchronously, and a tiny update takes a few milliseconds, so on a
    busy machine the fit could take (or reuse) its remaining rollouts before the process has exited
    and the pool had anything to notice.
    """
    pid = next(pid for pid in data.pool.pids if pid is not None)
    os.kill(pid, signal.SIGKILL)
    assert not wait_until_gone({pid}), f"sampler {pid} still runs 10 s after SIGKILL"


# Env factories the samplers build (module-level: sent by reference, imported in the samplers).


class _HangOnce(gym.Wrapper):
    """CartPole whose step hangs, with SIGALRM blocked (so only the driver can end it), once per marker file."""

    def __init__(self, marker: str, after: int) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.marker, self.after, self.steps = marker, after, 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps > self.after and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))  # the hung process
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        return self.env.step(action)


def hang_once(marker: str, after: int = 20) -> gym.Env:
    return _HangOnce(marker, after)


class _FailingReset(gym.Wrapper):
    def reset(self, **kwargs: Any) -> Any:
        raise RuntimeError("this env cannot reset")


def failing_reset() -> gym.Env:
    return _FailingReset(gym.make("CartPole-v1"))


class _SlowStep(gym.Wrapper):
    def step(self, action: Any) -> Any:
        time.sleep(0.01)
        return self.env.step(action)


def slow_cartpole() -> gym.Env:
    return _SlowStep(gym.make("CartPole-v1"))


def offset_cartpole() -> Callable[[], gym.Env]:
    """A factory of CartPole with 100 added to every observation: normalized, they are near 0; raw (or by stale
    statistics), 10 (clipped).

    Made inside a function, so that cloudpickle sends it by value: a Ray worker cannot import this test file.
    """

    def make() -> gym.Env:
        env = gym.make("CartPole-v1")
        low, high = env.observation_space.low + 100, env.observation_space.high + 100
        space = gym.spaces.Box(low, high, dtype=np.float32)
        return gym.wrappers.TransformObservation(env, lambda obs: (obs + 100).astype(np.float32), space)

    return make


class SlowPPO(PPOLearner):
    """Sleeps before every update: a Learner slower than its samplers."""

    def training_step(self, train_item: Any, batch_idx: int = 0) -> Any:
        time.sleep(0.15)
        return super().training_step(train_item, batch_idx)


class ReusingPPO(PPOLearner):
    """Asks for RLlib's circular buffer: 2 rollouts kept, each trained on up to 3 times."""

    def data_requirements(self) -> DataRequirements:
        return dataclasses.replace(super().data_requirements(), sample_reuse=SampleReuse(2, 3, 1))


# ----------------------------------------------------------------------------------------
# Training, lag, back-pressure, reuse
# ----------------------------------------------------------------------------------------


def test_a_ppo_fit_trains_on_async_rollouts_and_logs_the_weights_lag():
    data = async_data(num_env_runners=2, max_queued_rollouts=1, rollouts_per_epoch=8)
    model = learner()
    record = fit(data, model)
    assert len(record.items) == 8 and model.weights_seq_no == 8
    steps = [item["num_env_steps_sampled_lifetime"] for item in record.items]
    assert steps == [16.0 * (k + 1) for k in range(8)] and data.num_env_steps_sampled_lifetime == 128
    lags = [item["weights_seq_no_lag"] for item in record.items]
    assert min(lags) >= 0 and np.mean(lags) <= 1 + 1  # broadcast_interval + 1
    assert all(item["rollout_uses"] == 1 and item["num_env_runner_restarts"] == 0 for item in record.items)
    assert data.pool is None and not wait_until_gone(record.pids)  # teardown stopped every sampler


def test_appo_with_a_recurrent_module_trains_on_the_samplers_sequences():
    # The samplers keep each env's recurrent state and store it with every step, so the
    # Learner's sequences start from the state the acting module had.
    from lightning_rl.algorithms.appo import APPOLearner

    model = APPOLearner(model_config={"use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 8, "fcnet_hiddens": [8]})
    data = async_data(num_envs=2, rollouts_per_epoch=4)
    record = fit(data, model)
    assert len(record.items) == 4 and model.weights_seq_no > 0
    assert all(np.isfinite(p.detach()).all() for p in model.parameters())


def test_a_slow_learner_gets_at_most_max_queued_rollouts_ahead_and_the_samplers_wait():
    data = async_data(num_env_runners=2, max_queued_rollouts=3, rollouts_per_epoch=8)
    record = fit(data, learner(SlowPPO))
    for requested, taken, queued in record.pool_counts:
        assert requested - taken <= 3 and queued <= 3
    # The samplers ran ahead up to the bound (the queue filled) but never past it.
    assert max(requested - taken for requested, taken, _ in record.pool_counts) == 3
    assert max(queued for *_, queued in record.pool_counts) == 3 - 1  # as seen after the Learner took one
    assert max(item["weights_seq_no_lag"] for item in record.items) <= 3 + 1


def test_the_circular_buffer_hands_each_rollout_out_at_most_iterations_per_batch_times_and_drops_the_oldest():
    buffer = CircularBuffer(num_batches=2, iterations_per_batch=2)
    assert buffer.next() is None
    buffer.add("a")
    assert [buffer.next(), buffer.next(), buffer.next()] == [("a", 1), ("a", 2), None]
    buffer.add("b")
    buffer.add("c")  # drops "a"
    assert len(buffer) == 2 and buffer.num_dropped == 1
    assert [buffer.next() for _ in range(5)] == [("c", 1), ("b", 1), ("c", 2), ("b", 2), None]


def test_a_learner_asking_for_reuse_trains_on_a_slow_envs_rollouts_up_to_three_times_each():
    data = async_data(env=slow_cartpole, num_env_runners=1, rollouts_per_epoch=10, rollout_fragment_length=16)
    record = fit(data, learner(ReusingPPO))
    uses = [int(item["rollout_uses"]) for item in record.items]
    assert max(uses) == 3 and min(uses) == 1  # the Learner was faster than the env: it reused
    # Each rollout was handed out at most 3 times, its uses counted 1, 2, 3.
    by_rollout: dict[int, list[int]] = {}
    for episodes, use in zip(record.rollouts, uses):
        by_rollout.setdefault(id(episodes), []).append(use)
    assert all(seen == list(range(1, len(seen) + 1)) and len(seen) <= 3 for seen in by_rollout.values())
    # The lifetime counter counts each rollout once.
    new = sum(1 for use in uses if use == 1)
    assert data.num_env_steps_sampled_lifetime == 16 * new


def _fit_on_rank(rank: int, world_size: int) -> dict[str, Any]:
    import multiprocessing

    # run_on_ranks starts its ranks as daemonic processes, which multiprocessing forbids to
    # start processes of their own; ranks that torchrun or Lightning start are not daemonic.
    multiprocessing.current_process()._config["daemon"] = False
    data = async_data(num_env_runners=1, rollouts_per_epoch=3, normalize_observations=True, normalize_rewards=True)
    recorder = Record()
    trainer = Trainer(
        accelerator="cpu", strategy="ddp", devices=world_size, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        callbacks=[recorder],
    )  # fmt: skip
    trainer.fit(learner(), datamodule=data)
    return {
        "lifetime": data.num_env_steps_sampled_lifetime,
        "steps": [item["num_env_steps_sampled_lifetime"] for item in recorder.items],
        # Normalized: its first observation is 0 on every rank (the statistics of that one row).
        "first_chunk": np.asarray(recorder.rollouts[0][0].observations),
        "pids": sorted(recorder.pids),
        "statistics": {key: data.state_dict()[key] for key in ("observation_normalization", "reward_normalization")},
    }


def test_two_ddp_ranks_each_sample_their_own_seeds_and_count_env_steps_together():
    rank0, rank1 = run_on_ranks(_fit_on_rank, world_size=2, timeout=120)
    assert rank0["steps"] == rank1["steps"] == [32.0, 64.0, 96.0]
    assert rank0["lifetime"] == rank1["lifetime"] == 96
    # Both ranks merged both ranks' samplers' statistics, in the same order: equal to the bit.
    for key in ("observation_normalization", "reward_normalization"):
        a, b = rank0["statistics"][key], rank1["statistics"][key]
        assert a["count"] == b["count"] and torch.equal(a["mean"], b["mean"]) and torch.equal(a["var"], b["var"])
    assert rank0["statistics"]["reward_normalization"]["count"] == 96
    assert not np.array_equal(rank0["first_chunk"], rank1["first_chunk"])
    assert not wait_until_gone(set(rank0["pids"] + rank1["pids"]))


# ----------------------------------------------------------------------------------------
# Normalization
# ----------------------------------------------------------------------------------------

NORMALIZE = {"normalize_observations": True, "normalize_rewards": True}


def _observations(episodes: list[Any]) -> np.ndarray:
    return np.concatenate([np.asarray(episode.observations) for episode in episodes])


def test_the_samplers_statistics_are_merged_evaluated_with_and_checkpointed(tmp_path: Path):
    class EvaluatedWith(Callback):
        def on_validation_end(self, trainer: Trainer, pl_module: Any) -> None:
            self.statistics = trainer.datamodule.eval_runner.normalization.state_dict()["observation_normalization"]

    data = async_data(env=offset_cartpole(), rollouts_per_epoch=6, **NORMALIZE)
    recorder, evaluated = Record(), EvaluatedWith()
    trainer = make_trainer(tmp_path, limit_val_batches=1, callbacks=[recorder, evaluated])
    trainer.fit(learner(), datamodule=data)
    state = data.state_dict()
    observations, returns = state["observation_normalization"], state["reward_normalization"]
    # Every new rollout's report merged once: one running return per env step, and the observations
    # acted on (one per step, plus each sampler's first reset when its first rollout was taken).
    assert data.num_env_steps_sampled_lifetime == 96 and returns["count"] == 96
    assert 96 < observations["count"] <= 96 + 2
    assert np.allclose(np.asarray(observations["mean"]), 100, atol=3)
    # The samplers acted on normalized observations (raw ones, 100 and up, would read 10 clipped).
    assert np.abs(_observations(recorder.rollouts[-1])).mean() < 3
    # The evaluation after the last item normalized with the merged statistics; no training envs were built here.
    assert evaluated.statistics["count"] == observations["count"]
    assert data.sampling._train_runner is None
    # A checkpoint holds them where Policy.from_checkpoint looks.
    from lightning_rl.core.normalization import find_observation_normalization

    trainer.save_checkpoint(tmp_path / "normalized.ckpt")
    checkpoint = torch.load(tmp_path / "normalized.ckpt", weights_only=True)
    saved = find_observation_normalization(checkpoint)
    torch.testing.assert_close(saved.mean, torch.as_tensor(observations["mean"], dtype=torch.float32))


def _stale_statistics(data: AsyncSamplingDataModule) -> dict[str, Any]:
    """Statistics of mean 0 and variance 1 over 10^9 rows: by them the offset observations read 10 (clipped)."""
    entry = {"count": 1e9, "mean": torch.zeros(4, dtype=torch.float64), "var": torch.ones(4, dtype=torch.float64)}
    return {**data.state_dict(), "observation_normalization": entry}


@pytest.mark.parametrize("backend", ["process", "ray"])
def test_the_samplers_start_from_restored_statistics_and_take_each_broadcast(backend: str, request: Any):
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    # Restored statistics reach the samplers as they start.
    resumed = async_data(env=offset_cartpole(), sampler_backend=backend, rollouts_per_epoch=2, **NORMALIZE)
    resumed.load_state_dict(_stale_statistics(resumed))
    record = fit(resumed)
    assert all((_observations(rollout) == 10).all() for rollout in record.rollouts)

    # Statistics changed mid-fit reach the samplers with the next weights.
    def replace_statistics(data: AsyncSamplingDataModule) -> None:
        data._statistics().load_state_dict(_stale_statistics(data))

    # One sampler, one rollout queued: rollout k is asked for as item k - 1 is handed out, after that
    # item's weights went out, and sampled after them. Replaced after item 1, the statistics go out with
    # item 2's weights: rollout 3 is normalized by them but for its first observation (its running
    # episode's, normalized in rollout 2); every observation from rollout 4 on.
    data = async_data(env=offset_cartpole(), sampler_backend=backend, num_env_runners=1, max_queued_rollouts=1,
                      rollouts_per_epoch=8, **NORMALIZE)  # fmt: skip
    record = fit(data, at_step={1: replace_statistics})
    assert np.abs(_observations(record.rollouts[0])).mean() < 3  # the sampler's own statistics
    assert all((_observations(rollout) == 10).all() for rollout in record.rollouts[4:])


# ----------------------------------------------------------------------------------------
# Faults
# ----------------------------------------------------------------------------------------


def test_a_sampler_killed_mid_fit_is_restarted_counted_and_no_process_outlives_the_fit():
    data = async_data(num_env_runners=2, rollouts_per_epoch=8)
    record = fit(data, at_step={2: kill_a_sampler})
    assert len(record.items) == 8
    assert record.items[-1]["num_env_runner_restarts"] >= 1
    assert len(record.pids) >= 3  # the two first samplers and the restarted one
    assert not wait_until_gone(record.pids)


def _interrupt(data: AsyncSamplingDataModule) -> None:
    raise KeyboardInterrupt  # what Ctrl-C raises in the driver


def _fail(data: AsyncSamplingDataModule) -> None:
    raise RuntimeError("the fit fails")


@pytest.mark.parametrize("stop", [_fail, _interrupt])
def test_a_fit_that_raises_or_is_interrupted_stops_every_sampler(stop: Any):
    data = async_data()
    recorder = Record(at_step={1: stop})
    trainer = make_trainer(None, limit_val_batches=0, callbacks=[recorder])
    with pytest.raises((RuntimeError, SystemExit)):  # Lightning turns Ctrl-C into sys.exit(1)
        trainer.fit(learner(), datamodule=data)
    assert recorder.pids and data.pool is None and not wait_until_gone(recorder.pids)


def test_a_hung_sampler_is_killed_after_sample_timeout_s_and_restarted(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    marker = str(tmp_path / "hung")
    data = async_data(
        env="test_async_sampling.hang_once", env_kwargs={"marker": marker}, num_env_runners=1,
        rollouts_per_epoch=5, sample_timeout_s=1.0,
    )  # fmt: skip
    start = time.monotonic()
    record = fit(data)
    assert os.path.exists(marker) and time.monotonic() - start < 30
    assert record.items[-1]["num_env_runner_restarts"] == 1
    # The driver ended it (the env blocks the runner's own SIGALRM timeout).
    assert "env runner 0 restarted (1 restarts so far): it returned no rollout within sample_timeout_s=1 s" in caplog.text
    assert not wait_until_gone(record.pids)


def test_a_sampler_that_fails_every_time_stops_the_fit_naming_the_cause():
    data = async_data(env=failing_reset, num_env_runners=1)
    with pytest.raises(SamplerFailedError, match="env runner 0 failed 3 times in a row without a rollout.*cannot reset"):
        fit(data)


def test_killing_the_driver_with_sigkill_leaves_no_sampler_running(tmp_path: Path):
    script = ROOT / "tests" / "_async_sampling_driver.py"
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    stderr = (tmp_path / "stderr").open("w")
    driver = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=stderr, text=True, env=environment
    )
    try:
        samplers = {int(pid) for pid in driver.stdout.readline().split()}
        assert len(samplers) == 2 and all(running(pid) for pid in samplers), (tmp_path / "stderr").read_text()[-3000:]
        # The samplers, the fork server they come from, multiprocessing's resource tracker.
        everything = descendants(driver.pid)
        assert samplers < everything
    finally:
        driver.kill()
        driver.wait(timeout=30)
    assert not wait_until_gone(everything)


def test_sigterm_stops_a_fit_waiting_for_a_hung_sampler_at_once_and_leaves_no_process(tmp_path: Path):
    # The pool waited out sample_timeout_s (here 600 s) before Lightning saw the SIGTERM it had noted.
    marker = tmp_path / "hung"
    config = tmp_path / "fit.yaml"
    config.write_text(textwrap.dedent(f"""
        seed_everything: 0
        trainer:
          max_epochs: 1
          logger: false
          enable_checkpointing: false
          enable_progress_bar: false
          enable_model_summary: false
          num_sanity_val_steps: 0
          limit_val_batches: 0
          default_root_dir: {str(tmp_path)!r}
        model:
          class_path: lightning_rl.algorithms.ppo.PPOLearner
          init_args: {{model_config: {{fcnet_hiddens: [8]}}, minibatch_size: 16, num_epochs: 1}}
        data:
          class_path: lightning_rl.data.AsyncSamplingDataModule
          init_args:
            env: test_async_sampling.hang_once
            env_kwargs: {{marker: {str(marker)!r}}}
            num_envs: 1
            num_env_runners: 1
            rollout_fragment_length: 16
            rollouts_per_epoch: 4
            sample_timeout_s: 600
    """))
    command = [sys.executable, "-m", "lightning_rl", "fit", "--config", str(config)]
    returncode, output, below = signal_once_hanging(command, marker, signal.SIGTERM)
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "stopped by SIGTERM" in output
    assert still_running(below) == []  # the hung sampler, the fork server


# ----------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------


def _unpicklable_env() -> Any:
    import threading

    lock = threading.Lock()
    return lambda: lock and gym.make("CartPole-v1")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_env_runners": 0}, "^num_env_runners must be an int >= 1"),
        ({"num_env_runners": 100}, "^num_env_runners must be at most 99"),
        ({"max_queued_rollouts": 0}, "^max_queued_rollouts must be an int >= 1"),
        ({"sampler_backend": "threads"}, "^sampler_backend must be 'process' or 'ray', got 'threads'$"),
        ({"vectorize_mode": "async"}, '^AsyncSamplingDataModule does not support vectorize_mode="async".*num_env_runners'),
        ({"replay_buffer_capacity": 10}, "^replay_buffer_capacity is an OffPolicyDataModule argument"),
        ({"env": _unpicklable_env()}, "^AsyncSamplingDataModule sends the env .* cannot be pickled .*module-level env factory"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(kwargs: dict[str, Any], message: str):
    kwargs = {"env": "CartPole-v1", **kwargs}
    with pytest.raises(ValueError, match=message) as error:
        AsyncSamplingDataModule(kwargs.pop("env"), **kwargs)
    assert "\n" not in str(error.value)


def test_its_own_arguments_given_to_the_other_environment_data_modules_name_it():
    keyword_only = inspect.Parameter.KEYWORD_ONLY
    own = [p.name for p in inspect.signature(AsyncSamplingDataModule).parameters.values() if p.kind is keyword_only]
    assert tuple(own) == ("rollout_fragment_length", *ASYNC_SAMPLING_ARGUMENTS)
    message = "^num_env_runners is an AsyncSamplingDataModule argument: use lightning_rl.data.AsyncSamplingDataModule$"
    for cls in (OnPolicyDataModule, OffPolicyDataModule):
        with pytest.raises(ValueError, match=message):
            cls("CartPole-v1", num_env_runners=2)
    parser_error = 'Parser key "data":\n  Problem with given class_path: Option \'sampler_backend\' is not accepted'
    hint = misplaced_data_argument_hint(parser_error)
    assert hint == "sampler_backend is an AsyncSamplingDataModule argument: use lightning_rl.data.AsyncSamplingDataModule"


def test_the_ray_backend_without_ray_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ImportError, match=r'^sampler_backend="ray" needs Ray: pip install "lightning-rl\[ray\]"$'):
        AsyncSamplingDataModule("CartPole-v1", sampler_backend="ray")


def test_the_checkpoint_state_carries_the_counters_and_moves_the_samplers_seeds_on():
    data = async_data(rollouts_per_epoch=3)
    fit(data)
    state = data.state_dict()
    assert state["num_env_steps_sampled_lifetime"] == 48 and state["sampler_starts"] == [1, 1]
    resumed = async_data()
    resumed.load_state_dict(state)
    assert resumed.num_env_steps_sampled_lifetime == 48 and resumed._sampler_starts == [2, 2]


def test_a_fit_resumed_from_a_checkpoint_continues_the_counters_with_new_samplers(tmp_path: Path):
    first = async_data(rollouts_per_epoch=3)
    trainer = make_trainer(tmp_path, limit_val_batches=0)
    trainer.fit(learner(), datamodule=first)
    trainer.save_checkpoint(tmp_path / "async.ckpt")
    resumed = async_data(rollouts_per_epoch=3)
    recorder = Record()
    trainer = make_trainer(tmp_path, limit_val_batches=0, max_epochs=2, callbacks=[recorder])
    trainer.fit(learner(), datamodule=resumed, ckpt_path=tmp_path / "async.ckpt")
    assert [item["num_env_steps_sampled_lifetime"] for item in recorder.items] == [64.0, 80.0, 96.0]
    # Saved after the first fit stopped its samplers (next start: 1); the resumed fit started them as start 2
    # (seeds moved on past both) and counts 3 after stopping them.
    assert first.state_dict()["sampler_starts"] == [1, 1] and resumed.state_dict()["sampler_starts"] == [3, 3]


# ----------------------------------------------------------------------------------------
# Ray
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from lightning_rl.env.ray_sampler_pool import keeping_signal_handlers

    # Ray's SIGTERM handler (sys.exit) would outlive the fixture and end later tests' fits.
    with keeping_signal_handlers():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _first_rollouts(pool: Any) -> dict[int, Any]:
    pool.start()
    first: dict[int, Any] = {}
    try:
        while len(first) < pool.num_samplers:
            rollout = pool.take()
            first.setdefault(rollout.sampler_index, rollout)
    finally:
        pool.close()
    return first


def test_the_process_and_ray_backends_sample_the_same_first_rollouts_from_the_same_seeds(ray_cluster: Any):
    from lightning_rl.env.ray_sampler_pool import RaySamplerPool

    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    spec = RLModuleSpec(
        module_class=PPOModule, observation_space=env.observation_space, action_space=env.action_space,
        model_config={"fcnet_hiddens": [8]},
    )  # fmt: skip
    module = spec.build()
    settings = [EnvSettings(env="CartPole-v1", rollout_fragment_length=16, seed=seed) for seed in (7, 100_010)]
    options = {"weights_seq_no": 0, "max_queued": 2, "sample_timeout_s": 60.0, "max_restarts": 0}
    by_process = _first_rollouts(ProcessSamplerPool(settings, module, **options))
    by_ray = _first_rollouts(RaySamplerPool(settings, module, **options))
    for index in (0, 1):
        a, b = by_process[index].episodes, by_ray[index].episodes
        assert [len(e) for e in a] == [len(e) for e in b]
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x.observations), np.asarray(y.observations))
            np.testing.assert_array_equal(np.asarray(x.actions), np.asarray(y.actions))
    # Different samplers sample different episodes.
    assert not np.array_equal(by_process[0].episodes[0].observations[0], by_process[1].episodes[0].observations[0])


def test_a_ray_fit_restarts_a_killed_actor_and_kills_every_actor_at_the_end(ray_cluster: Any):
    # One actor: once the rollouts it queued are used up, the fit goes on only if the pool restarts it.
    data = async_data(sampler_backend="ray", num_env_runners=1, max_queued_rollouts=2, rollouts_per_epoch=6)
    record = fit(data, at_step={1: kill_a_sampler})
    assert len(record.items) == 6 and record.items[-1]["num_env_runner_restarts"] >= 1
    assert not wait_until_gone(record.pids, seconds=20)


def test_the_command_line_takes_it_by_its_short_name():
    from lightning_rl.cli.lightning_cli import LightningRLCLI

    args = [
        "--model", "PPOLearner", "--data", "AsyncSamplingDataModule", "--data.num_env_runners", "3",
        "--data.sampler_backend", "process", "--data.max_queued_rollouts", "5", "--trainer.logger", "false",
    ]  # fmt: skip
    cli = LightningRLCLI(args=args, run=False)
    assert isinstance(cli.datamodule, AsyncSamplingDataModule)
    assert cli.datamodule.hparams.num_env_runners == 3 and cli.datamodule.max_queued_rollouts == 5


def test_a_config_s_wrappers_reach_the_samplers(tmp_path: Path):
    # LightningCLI hands a config's {class_path, init_args} wrapper over as a partial holding its
    # instantiator, which cannot be pickled: examples/appo_minatar_breakout.yaml's TimeLimit
    # stopped the first fit with "cannot pickle 'generator' object".
    from lightning_rl.cli.lightning_cli import LightningRLCLI

    config = tmp_path / "wrapped.yaml"
    config.write_text(
        "data:\n  class_path: AsyncSamplingDataModule\n  init_args:\n    env: CartPole-v1\n    num_env_runners: 1\n"
        "    rollout_fragment_length: 16\n    max_env_steps: 32\n    rollouts_per_epoch: 2\n    wrappers:\n"
        "      - class_path: gymnasium.wrappers.TimeLimit\n        init_args:\n          max_episode_steps: 5\n"
    )
    args = ["fit", "--config", str(config), "--model", "PPOLearner", "--model.minibatch_size", "16"]
    args += ["--trainer.logger", "false", "--trainer.enable_checkpointing", "false", "--trainer.limit_val_batches", "0"]
    cli = LightningRLCLI(args=[*args, "--trainer.enable_progress_bar", "false"])
    assert cli.datamodule.num_env_steps_sampled_lifetime >= 32
    assert cli.trainer.callback_metrics["env_runners/episode_len_mean"] <= 5  # the TimeLimit acted in the samplers
