"""TensorBoard and CSV logs by env step, hp_metric as the best evaluation return, evaluation videos.

Event files are read back with TensorBoard's own ``EventAccumulator``, CSV files as written.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import bc_spec, loader_of, make_trainer, random_batch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.algorithms.dqn import DQNLearner
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.core.rl_module_specs import RLModuleSpec
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.data import OffPolicyDataModule, OnPolicyDataModule
from lightning_rl.data.evaluation_video import VIDEO_TAG, EvaluationVideo
from lightning_rl.env.env_runner import EnvRunner
from lightning_rl.env.frame_recorder import check_records_frames

TRAIN_TAG = "default_policy/total_loss"
SAMPLED_TAG = "env_runners/num_env_steps_sampled_lifetime"
EVAL_TAG = "eval/episode_return_mean"
TRAIN_RETURN_TAG = "env_runners/episode_return_mean"


def _ppo() -> PPOLearner:
    return PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=16)


def _on_policy(**kwargs: Any) -> OnPolicyDataModule:
    options = dict(env="CartPole-v1", seed=0, rollouts_per_epoch=2, evaluation_num_episodes=1, evaluation_num_envs=1)
    options.update(kwargs)
    return OnPolicyDataModule(**options)


def _fit(root: Path, learner: Any, data: Any, loggers: Any, ckpt_path: str | None = None, **kwargs: Any) -> Any:
    options = dict(max_epochs=2, logger=loggers, log_every_n_steps=1, num_sanity_val_steps=0)
    options.update(kwargs)
    trainer = make_trainer(root, **options)
    trainer.fit(learner, datamodule=data, ckpt_path=ckpt_path)
    return trainer


def _events(logger: TensorBoardLogger) -> EventAccumulator:
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    return events


def _scalars(events: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(event.step, event.value) for event in events.Scalars(tag)]


def _csv_rows(logger: CSVLogger) -> list[dict[str, str]]:
    with open(Path(logger.log_dir) / "metrics.csv", newline="") as file:
        return list(csv.DictReader(file))


# ----------------------------------------------------------------------------------------
# Scalars by env step
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_envs, fragment", [(1, 16), (3, 16)])
def test_train_and_eval_scalars_are_written_at_the_env_step_count(tmp_path: Path, num_envs: int, fragment: int):
    """Two runs with different num_envs: every scalar's step is the env steps sampled, in TensorBoard and CSV."""
    tensorboard, table = TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv")
    _fit(tmp_path, _ppo(), _on_policy(num_envs=num_envs, rollout_fragment_length=fragment), [tensorboard, table])
    per_item = num_envs * fragment
    events = _events(tensorboard)

    train_steps = [per_item * k for k in range(1, 5)]  # 2 epochs of 2 rollouts
    assert [step for step, _ in _scalars(events, TRAIN_TAG)] == train_steps
    # The x-axis is the counter itself.
    assert _scalars(events, SAMPLED_TAG) == [(step, float(step)) for step in train_steps]
    assert [step for step, _ in _scalars(events, EVAL_TAG)] == [2 * per_item, 4 * per_item]

    rows = _csv_rows(table)
    assert [int(row["step"]) for row in rows if row[TRAIN_TAG]] == train_steps
    assert [int(row["step"]) for row in rows if row[EVAL_TAG]] == [2 * per_item, 4 * per_item]


def test_episode_statistics_are_not_logged_before_the_first_episode_ended(tmp_path: Path):
    """Items of 4 env steps: CartPole's first episode (8 steps or more) ends after the first item."""
    tensorboard, table = TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv")
    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=4)
    data = _on_policy(num_envs=1, rollout_fragment_length=4, rollouts_per_epoch=10)
    _fit(tmp_path, learner, data, [tensorboard, table], max_epochs=1)
    events = _events(tensorboard)
    returns = _scalars(events, TRAIN_RETURN_TAG)
    assert returns and returns[0][0] >= 8, "no episode return, or one before the first episode ended"
    assert all(np.isfinite(value) for _, value in returns)
    assert _scalars(events, SAMPLED_TAG)[0] == (4, 4.0)  # the counters are logged from the first item on
    assert all(row[TRAIN_RETURN_TAG] != "nan" for row in _csv_rows(table))


def test_off_policy_scalars_are_written_at_the_env_step_count(tmp_path: Path):
    """train_freq=4 with 2 envs: an item every 4 env steps, logged at 4, 8, ..."""
    tensorboard = TensorBoardLogger(tmp_path, name="tb")
    data = OffPolicyDataModule(
        env="CartPole-v1", num_envs=2, train_freq=4, learning_starts=8, seed=0, rollouts_per_epoch=6,
        evaluation_num_episodes=1, evaluation_num_envs=1,
    )  # fmt: skip
    learner = DQNLearner(model_config={"fcnet_hiddens": [8]}, minibatch_size=8)
    _fit(tmp_path, learner, data, tensorboard, max_epochs=1)
    events = _events(tensorboard)
    assert _scalars(events, SAMPLED_TAG) == [(step, float(step)) for step in range(4, 25, 4)]
    assert [step for step, _ in _scalars(events, EVAL_TAG)] == [24]


class _RecordResults(Callback):
    """Each train item's results (``training_step``'s outputs) and the Learner's ``self.log`` calls in it."""

    def __init__(self) -> None:
        self.results: list[dict[str, float]] = []
        self.log_calls: list[int] = []

    def on_train_batch_start(self, trainer: Any, learner: Any, batch: Any, batch_idx: int) -> None:
        self._calls = 0
        if not hasattr(learner, "_counted_log"):
            log = learner.log

            def counted_log(*args: Any, **kwargs: Any) -> None:
                self._calls += 1
                log(*args, **kwargs)

            learner.log = learner._counted_log = counted_log

    def on_train_batch_end(self, trainer: Any, learner: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        flat = {f"{mid}/{key}": value for mid, values in outputs["results"].items() for key, value in values.items()}
        self.results.append({**flat, **{f"env_runners/{k}": v for k, v in batch.env_runners.items()}})
        self.log_calls.append(self._calls)


def test_train_metrics_go_to_the_loggers_in_one_write_every_log_every_n_steps_items(tmp_path: Path):
    """log_every_n_steps=3 over 7 items: rows at items 3, 6 and the epoch's last, each the item's results.

    The values skip Lightning's per-key ``self.log`` (~0.2 ms each, ~35 keys per item): at most
    the progress bar's two values go through it, and no item writes a row twice.
    """
    table = CSVLogger(tmp_path, name="csv")
    data = OffPolicyDataModule(
        env="CartPole-v1", num_envs=1, train_freq=4, learning_starts=8, seed=0, rollouts_per_epoch=7,
        evaluation_num_episodes=1, evaluation_num_envs=1,
    )  # fmt: skip
    learner = DQNLearner(model_config={"fcnet_hiddens": [8]}, minibatch_size=8)
    record = _RecordResults()
    trainer = _fit(tmp_path, learner, data, table, max_epochs=1, log_every_n_steps=3, callbacks=[record])
    assert len(record.results) == 7
    assert max(record.log_calls) <= 2, record.log_calls  # "return" and "loss" for the progress bar only
    rows = [row for row in _csv_rows(table) if row[SAMPLED_TAG]]
    assert [int(row["step"]) for row in rows] == [12, 24, 28]  # items 3, 6 and 7 (the last), at 4 env steps each
    assert [int(row["step"]) for row in _csv_rows(table)].count(12) == 1  # one row per written item
    for row, results in zip(rows, [record.results[2], record.results[5], record.results[6]]):
        for key, value in results.items():
            if not np.isnan(value):
                assert float(row[key]) == pytest.approx(value, rel=1e-6), key
    # The last item's values are the callbacks' (EarlyStopping, ModelCheckpoint) and the step is exact.
    metrics = trainer.callback_metrics
    for key, value in record.results[-1].items():
        if not np.isnan(value):
            assert isinstance(metrics[key], torch.Tensor) and metrics[key].item() == pytest.approx(value, rel=1e-6)
    assert metrics["step"].item() == 28 and trainer.logged_metrics[TRAIN_TAG].item() == metrics[TRAIN_TAG].item()


def test_the_step_stays_exact_past_float32_precision(tmp_path: Path):
    """2**24 + 1 env steps: Lightning keeps logged numbers as float32, which would write 2**24."""
    table = CSVLogger(tmp_path)
    env_steps = 2**24 + 1
    item = TrainItem(TrainingData(batch=random_batch(16)), timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: env_steps})
    make_trainer(tmp_path, logger=table, log_every_n_steps=1).fit(BCLearner(module_spec=bc_spec()), loader_of([item]))
    assert [int(row["step"]) for row in _csv_rows(table)] == [env_steps]


# ----------------------------------------------------------------------------------------
# hp_metric
# ----------------------------------------------------------------------------------------


def test_hp_metric_is_the_best_evaluation_return_and_survives_a_resume(tmp_path: Path):
    first = TensorBoardLogger(tmp_path, name="first")
    saves = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    _fit(
        tmp_path,
        _ppo(),
        _on_policy(num_envs=2, rollout_fragment_length=16),
        first,
        max_epochs=3,
        callbacks=[saves],
        enable_checkpointing=True,
    )
    events = _events(first)
    returns = [value for _, value in _scalars(events, EVAL_TAG)]
    best = [max(returns[: k + 1]) for k in range(len(returns))]
    eval_steps = [step for step, _ in _scalars(events, EVAL_TAG)]
    # -1 is TensorBoardLogger's placeholder, written when the fit starts.
    assert _scalars(events, "hp_metric") == [(0, -1.0)] + list(zip(eval_steps, best))
    assert (
        torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["lightning_rl"]["best_evaluation_return"]
        == (best[-1])
    )

    # Resumed with episodes cut at 5 steps, its evaluation returns 5, below any CartPole episode
    # so far (at least 8 steps): only the restored best can be the hp_metric.
    resumed = TensorBoardLogger(tmp_path, name="resumed")
    data = _on_policy(num_envs=2, rollout_fragment_length=16, env_kwargs={"max_episode_steps": 5})
    _fit(tmp_path, _ppo(), data, resumed, max_epochs=4, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    events = _events(resumed)
    assert [value for _, value in _scalars(events, EVAL_TAG)] == [5.0]
    assert [value for _, value in _scalars(events, "hp_metric")] == [-1.0, best[-1]]


# ----------------------------------------------------------------------------------------
# Evaluation videos
# ----------------------------------------------------------------------------------------


def _gif_milliseconds(encoded: bytes) -> int:
    """How long a GIF plays (identical frames in a row are merged into one that shows longer)."""
    gif = Image.open(io.BytesIO(encoded))
    total = 0
    for index in range(gif.n_frames):
        gif.seek(index)
        total += gif.info["duration"]
    return total


def test_every_kth_evaluation_writes_its_first_episode_as_a_video(tmp_path: Path):
    """evaluation_video=2 over 3 evaluations: one video, at the 2nd, of the one episode it played."""
    tensorboard = TensorBoardLogger(tmp_path, name="tb")
    data = _on_policy(num_envs=2, rollout_fragment_length=8, evaluation_video=2)
    _fit(tmp_path, _ppo(), data, tensorboard, max_epochs=3)
    events = _events(tensorboard)
    (video,) = events.Images(VIDEO_TAG)
    assert video.step == 2 * 2 * 16  # the second evaluation's env-step count
    ((_, episode_len),) = [(s, v) for s, v in _scalars(events, "eval/episode_len_mean") if s == video.step]
    assert (video.width, video.height) == (600, 400)  # CartPole's frames
    # The reset's frame, then one per step, at CartPole's 50 frames per second.
    assert _gif_milliseconds(video.encoded_image_string) == (episode_len + 1) * 20


def test_no_video_is_written_without_evaluation_video(tmp_path: Path):
    tensorboard = TensorBoardLogger(tmp_path, name="tb")
    _fit(tmp_path, _ppo(), _on_policy(num_envs=2, rollout_fragment_length=8), tensorboard, max_epochs=1)
    events = _events(tensorboard)
    assert EVAL_TAG in events.Tags()["scalars"]
    assert events.Tags()["images"] == []


_RENDERS = []


class _CountRenders(gym.Wrapper):
    def render(self) -> Any:
        _RENDERS.append(1)
        return self.env.render()


def _counting_cartpole(**kwargs: Any) -> gym.Env:
    return _CountRenders(gym.make("CartPole-v1", **kwargs))


def _module(runner: EnvRunner) -> Any:
    spec = RLModuleSpec(PPOModule, runner.observation_space, runner.action_space, model_config={"fcnet_hiddens": [8]})
    return spec.build()


@pytest.mark.parametrize("vectorize_mode", ["sync", "async"])
def test_the_runner_renders_only_the_recorded_episode_of_env_0(vectorize_mode: str):
    _RENDERS.clear()
    runner = EnvRunner(
        _counting_cartpole, env_kwargs={"render_mode": "rgb_array"}, num_envs=3, rollout_fragment_length=4, seed=0,
        record_video=True, vectorize_mode=vectorize_mode,
    )  # fmt: skip
    module = _module(runner)
    try:
        runner.sample_episodes(module, 3)
        runner.sample(module)
        assert runner.take_recorded_frames() is None
        runner.sample_episodes(module, 3, record_first_episode=True)
        frames = runner.take_recorded_frames()
        assert frames.dtype == np.uint8 and frames.shape[1:] == (400, 600, 3) and len(frames) > 8
        assert runner.take_recorded_frames() is None  # taken once
        runner.sample_episodes(module, 3)
        assert runner.take_recorded_frames() is None
    finally:
        runner.close()
    if vectorize_mode == "sync":  # async envs render in their workers
        assert len(_RENDERS) == len(frames)


def test_the_recorded_episode_is_whole():
    runner = EnvRunner("CartPole-v1", num_envs=1, rollout_fragment_length=4, seed=0, record_video=True)
    try:
        first, _ = runner.sample_episodes(_module(runner), 2, record_first_episode=True)
        assert len(runner.take_recorded_frames()) == len(first) + 1  # the reset's frame, then one per step
    finally:
        runner.close()


def test_recording_needs_a_runner_built_for_it():
    runner = EnvRunner("CartPole-v1", num_envs=1, seed=0)
    try:
        with pytest.raises(ValueError, match="record_video=True"):
            runner.sample_episodes(_module(runner), 1, record_first_episode=True)
    finally:
        runner.close()


def test_only_rank_0_records_and_sanity_checks_do_not_count():
    class _Trainer:
        sanity_checking = False
        global_rank = 0

    video, trainer = EvaluationVideo(every=2), _Trainer()
    trainer.sanity_checking = True
    assert not video.records_this_evaluation(trainer)
    trainer.sanity_checking = False
    assert [video.records_this_evaluation(trainer) for _ in range(4)] == [False, True, False, True]
    trainer.global_rank = 1
    assert [video.records_this_evaluation(trainer) for _ in range(2)] == [False, False]
    assert video.state_dict() == {"num_evaluations": 6}


def test_evaluation_video_without_a_tensorboard_logger_fails_at_setup(tmp_path: Path):
    data = _on_policy(num_envs=2, rollout_fragment_length=8, evaluation_video=1)
    with pytest.raises(ValueError, match=r"loggers are \['CSVLogger'\].*TensorBoardLogger"):
        _fit(tmp_path, _ppo(), data, CSVLogger(tmp_path))


@pytest.mark.parametrize("missing", ["PIL", "pygame"])
def test_evaluation_video_without_its_extra_fails_at_setup_naming_it(tmp_path: Path, monkeypatch, missing: str):
    monkeypatch.setitem(sys.modules, missing, None)  # import raises ImportError
    data = _on_policy(num_envs=2, rollout_fragment_length=8, evaluation_video=1)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'lightning-rl\[video\]'"):
        _fit(tmp_path, _ppo(), data, TensorBoardLogger(tmp_path))


def test_an_env_that_cannot_render_rgb_frames_is_named():
    def no_render_mode() -> gym.Env:
        return gym.make("CartPole-v1")

    with pytest.raises(ValueError, match=r"'CartPole-v1'.*render_mode is None"):
        check_records_frames(no_render_mode, None, [])
    with pytest.raises(ValueError, match="env_kwargs sets render_mode='human'"):
        check_records_frames("CartPole-v1", {"render_mode": "human"}, [])
    check_records_frames("Pendulum-v1", None, ["gymnasium.wrappers.RecordEpisodeStatistics"])


def test_an_env_factory_path_records_when_it_takes_the_render_mode():
    factory = "_registered_envs.make_short_cartpole"
    check_records_frames(factory, {"render_mode": "rgb_array"}, [])
    with pytest.raises(ValueError, match="render_mode is None"):
        check_records_frames(factory, None, [])


# ----------------------------------------------------------------------------------------
# Two DDP ranks
# ----------------------------------------------------------------------------------------


def _fit_with_videos_on_rank(rank: int, world_size: int, root: str) -> dict[str, Any]:
    from lightning.pytorch import Trainer, seed_everything

    seed_everything(0)
    data = _on_policy(num_envs=2, rollout_fragment_length=8, evaluation_num_episodes=2, evaluation_video=1)
    logger = TensorBoardLogger(root, name="tb", version=0)
    trainer = Trainer(
        accelerator="cpu", strategy="ddp", devices=world_size, max_epochs=2, logger=logger, log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(_ppo(), datamodule=data)
    result = {"records": data.eval_runner.record_video}
    if rank == 0:
        events = _events(logger)
        result.update(
            sampled=_scalars(events, SAMPLED_TAG),
            eval_steps=[step for step, _ in _scalars(events, EVAL_TAG)],
            hp_metric_steps=[step for step, _ in _scalars(events, "hp_metric")],
            video_steps=[image.step for image in events.Images(VIDEO_TAG)],
        )
    return result


def test_under_ddp_steps_count_both_ranks_and_only_rank_0_records(tmp_path: Path):
    from ranks import run_on_ranks

    rank0, rank1 = run_on_ranks(_fit_with_videos_on_rank, str(tmp_path), world_size=2, timeout=240)
    per_rollout = 2 * 2 * 8  # 2 ranks x 2 envs x 8 steps
    assert rank0["sampled"] == [(per_rollout * k, float(per_rollout * k)) for k in range(1, 5)]
    assert rank0["eval_steps"] == rank0["video_steps"] == [2 * per_rollout, 4 * per_rollout]
    assert rank0["hp_metric_steps"] == [0, 2 * per_rollout, 4 * per_rollout]
    assert (rank0["records"], rank1["records"]) == (True, False)
