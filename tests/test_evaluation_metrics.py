"""Per-epoch evaluation statistics: torchmetrics aggregators logged by validation_step."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import bc_spec, make_trainer
from torchmetrics import Metric

from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.learner.evaluation import EvaluationMetrics


def episode(rewards: list[float]) -> SingleAgentEpisode:
    steps = len(rewards)
    return SingleAgentEpisode(
        observations=np.zeros((steps + 1, 4), dtype=np.float32),
        actions=np.zeros(steps, dtype=np.int64),
        rewards=np.asarray(rewards, dtype=np.float32),
        terminated=True,
    )


def eval_item(*episodes: SingleAgentEpisode) -> TrainItem:
    return TrainItem(data=TrainingData(episodes=list(episodes)))


# Two evaluation items of unequal size: returns 3, 1, 8 and lengths 2, 1, 4.
ITEMS = [eval_item(episode([1.0, 2.0]), episode([1.0])), eval_item(episode([2.0, 2.0, 2.0, 2.0]))]


class EvalItems:
    """One evaluation dataloader yielding ``items`` (a plain list would be one dataloader per item)."""

    def __init__(self, items: list[TrainItem]) -> None:
        self.items = items

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def validate(items: list[TrainItem], tmp_path) -> dict[str, float]:
    learner = BCLearner(bc_spec())
    (results,) = make_trainer(tmp_path).validate(learner, dataloaders=EvalItems(items), verbose=False)
    return results


def test_validate_reports_the_statistics_of_every_episode_of_the_epoch(tmp_path):
    results = validate(ITEMS, tmp_path)
    assert results["eval/episode_return_mean"] == pytest.approx(4.0)  # (3 + 1 + 8) / 3, not a mean of item means
    assert results["eval/episode_return_min"] == 1.0
    assert results["eval/episode_return_max"] == 8.0
    assert results["eval/episode_len_mean"] == pytest.approx(7 / 3)
    assert results["eval/num_episodes"] == 3
    assert "eval_return" not in results  # progress bar only


def test_one_evaluation_item_gives_the_numbers_it_gave_before_torchmetrics(tmp_path):
    # The former validation_step logged numpy's statistics of the item's episodes.
    item = eval_item(episode([0.5, 0.25]), episode([3.0]), episode([-1.0, 1.0, 2.0]))
    returns = [0.75, 3.0, 2.0]
    results = validate([item], tmp_path)
    assert results["eval/episode_return_mean"] == pytest.approx(float(np.mean(returns)))
    assert results["eval/episode_return_min"] == float(np.min(returns))
    assert results["eval/episode_return_max"] == float(np.max(returns))
    assert results["eval/episode_len_mean"] == pytest.approx(2.0)
    assert results["eval/num_episodes"] == 3


def test_each_validation_epoch_starts_from_fresh_statistics(tmp_path):
    learner = BCLearner(bc_spec())
    trainer = make_trainer(tmp_path)
    (first,) = trainer.validate(learner, dataloaders=EvalItems(ITEMS), verbose=False)
    (second,) = trainer.validate(learner, dataloaders=EvalItems([ITEMS[1]]), verbose=False)
    assert first["eval/num_episodes"] == 3
    assert second["eval/num_episodes"] == 1
    assert second["eval/episode_return_min"] == 8.0
    assert trainer.progress_bar_metrics["eval_return"] == pytest.approx(8.0)


def test_the_metrics_are_torchmetrics_objects_that_stay_out_of_the_state_dict():
    learner = BCLearner(bc_spec())
    learner.build()
    assert all(isinstance(metric, Metric) for _, metric in learner.eval_metrics.items())
    assert not [key for key in learner.state_dict() if key.startswith("eval_metrics")]


def test_an_evaluation_item_without_episodes_is_refused_by_name():
    with pytest.raises(ValueError, match="holds no episodes"):
        EvaluationMetrics().update([])

