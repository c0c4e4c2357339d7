"""NaN in training: skipped steps are counted per update, leave weights_seq_no alone, and stop a run past a limit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _helpers import bc_spec, loader_of, make_trainer, random_batch, weights
from ranks import run_on_ranks

from lightning_rl import ALL_MODULES, DEFAULT_MODULE_ID, Columns, MultiRLModuleSpec, RLModuleSpec
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.algorithms.dqn import DQNLearner, DQNModule
from lightning_rl.algorithms.off_policy import N_STEP, WEIGHTS

SKIPPED = "num_non_finite_updates_skipped"


def nan_batch(rows: int = 64) -> dict[str, np.ndarray]:
    batch = random_batch(rows)
    batch[Columns.OBS][:] = np.nan
    return batch


def built(**kwargs: Any) -> BCLearner:
    learner = BCLearner(module_spec=bc_spec(), **kwargs)
    learner.build()
    return learner


class FiniteLossNaNGradients(BCLearner):
    """BC plus ``sqrt(0 * sum of the weights)``: the loss stays finite, its gradients are 0 * inf = NaN."""

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: Any, fwd_out: Any) -> torch.Tensor:
        loss = super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        params = torch.stack([p.sum() for p in self.module[module_id].parameters()]).sum()
        return loss + torch.sqrt(params * 0.0)


def test_update_stops_with_an_error_naming_module_optimizer_and_the_nan_loss():
    learner = built(max_consecutive_non_finite_steps=3)
    for _ in range(2):
        learner.update(batch=nan_batch())
    message = r"module 'default_policy', optimizer 'default_optimizer': 3 steps in a row skipped; its loss was nan"
    with pytest.raises(FloatingPointError, match=message) as error:
        learner.update(batch=nan_batch())
    assert "max_consecutive_non_finite_steps=None turns this check off" in str(error.value)


def test_the_error_says_the_gradients_were_not_finite_when_the_loss_was():
    learner = FiniteLossNaNGradients(module_spec=bc_spec(), max_consecutive_non_finite_steps=1)
    learner.build()
    with pytest.raises(FloatingPointError, match="1 steps in a row skipped; its loss was finite, its gradients were not"):
        learner.update_from_batch(random_batch())


def test_fit_stops_with_an_error_after_max_consecutive_nonfinite_steps(tmp_path):
    learner = BCLearner(module_spec=bc_spec(), max_consecutive_non_finite_steps=4)
    trainer = make_trainer(tmp_path)
    with pytest.raises(FloatingPointError, match="4 steps in a row skipped"):
        trainer.fit(learner, train_dataloaders=loader_of([random_batch()] + [nan_batch()] * 10))
    assert learner.weights_seq_no == 1  # the clean first item, then 4 skipped steps
    assert trainer.state.status.value == "interrupted"


@pytest.mark.parametrize("limit, raises", [(100, True), (None, False)])
def test_the_default_limit_is_100_steps_and_none_turns_it_off(limit, raises):
    learner = built(max_consecutive_non_finite_steps=limit)
    before = weights(learner)
    # 2 epochs of 64 one-row minibatches: 128 skipped steps in one update.
    update = lambda: learner.update_from_batch(nan_batch(), num_epochs=2, minibatch_size=1)  # noqa: E731
    if raises:
        with pytest.raises(FloatingPointError, match="100 steps in a row skipped"):
            update()
    else:
        assert update()[DEFAULT_MODULE_ID][SKIPPED] == 128
    assert all(torch.equal(before[name], value) for name, value in weights(learner).items())
    assert BCLearner(module_spec=bc_spec()).hparams.max_consecutive_non_finite_steps == 100


def test_a_step_that_trains_starts_the_count_of_skips_in_a_row_again():
    learner = built(max_consecutive_non_finite_steps=3)
    for batch in (nan_batch(), nan_batch(), random_batch(), nan_batch(), nan_batch()):
        learner.update_from_batch(batch)
    with pytest.raises(FloatingPointError, match="3 steps in a row"):
        learner.update_from_batch(nan_batch())


def test_each_module_counts_its_own_skips_and_may_have_its_own_limit():
    spec = MultiRLModuleSpec(rl_module_specs={"a": bc_spec(), "b": bc_spec()})
    learner = BCLearner(
        module_spec=spec, max_consecutive_non_finite_steps=5, config_overrides_per_module={"b": {"max_consecutive_non_finite_steps": 2}}
    )
    learner.build()
    batch = {"a": random_batch(), "b": nan_batch()}
    results = learner.update_from_batch(batch)
    assert results["a"][SKIPPED] == 0 and results["b"][SKIPPED] == 1
    assert learner.weights_seq_no == 1  # module a's weights changed, so the step counts
    with pytest.raises(FloatingPointError, match="module 'b'") as error:
        learner.update_from_batch(batch)
    assert "module 'a'" not in str(error.value)


def test_skipped_steps_do_not_advance_weights_seq_no():
    learner = built(max_consecutive_non_finite_steps=None)
    one_bad_row = random_batch(64)
    one_bad_row[Columns.OBS][0, 0] = np.inf
    results = learner.update_from_batch(one_bad_row, minibatch_size=16)
    assert results[DEFAULT_MODULE_ID][SKIPPED] == 1
    assert learner.weights_seq_no == results[ALL_MODULES]["weights_seq_no"] == 3  # 4 steps, one skipped
    learner.update_from_batch(nan_batch(), num_epochs=3)
    assert learner.weights_seq_no == 3
    learner.update_from_batch(random_batch())
    assert learner.weights_seq_no == 4


def test_skipped_steps_of_an_iterator_do_not_advance_weights_seq_no():
    learner = built(max_consecutive_non_finite_steps=None)
    results = learner.update_from_iterator([random_batch(), nan_batch(), random_batch()])
    assert learner.weights_seq_no == 2 and results[ALL_MODULES]["dataset_num_iters_trained"] == 3
    assert results[DEFAULT_MODULE_ID][SKIPPED] == 1


def test_logged_skip_count_is_zero_on_a_clean_update(tmp_path):
    learner = built(max_consecutive_non_finite_steps=None)
    assert learner.update_from_batch(nan_batch())[DEFAULT_MODULE_ID][SKIPPED] == 1
    assert learner.update_from_batch(random_batch())[DEFAULT_MODULE_ID][SKIPPED] == 0

    fitted = BCLearner(module_spec=bc_spec(), max_consecutive_non_finite_steps=None)
    trainer = make_trainer(tmp_path, log_every_n_steps=1)
    trainer.fit(fitted, train_dataloaders=loader_of([nan_batch(), nan_batch(), random_batch()]))
    assert trainer.callback_metrics[f"{DEFAULT_MODULE_ID}/{SKIPPED}"].item() == 0


def _dqn_batch(reward: float) -> dict[str, torch.Tensor]:
    rows = 8
    return {
        Columns.OBS: torch.randn(rows, 2),
        Columns.ACTIONS: torch.randint(0, 2, (rows,)),
        Columns.REWARDS: torch.full((rows,), reward),
        Columns.NEXT_OBS: torch.randn(rows, 2),
        Columns.TERMINATEDS: torch.zeros(rows, dtype=torch.bool),
        Columns.TRUNCATEDS: torch.zeros(rows, dtype=torch.bool),
        N_STEP: torch.ones(rows, dtype=torch.long),
        WEIGHTS: torch.ones(rows),
    }


def test_a_target_network_update_does_not_fire_on_skipped_steps():
    import gymnasium as gym

    spec = RLModuleSpec(
        module_class=DQNModule,
        observation_space=gym.spaces.Box(-10.0, 10.0, (2,), np.float32),
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [8]},
    )
    learner = DQNLearner(spec, target_network_update_freq=1, max_consecutive_non_finite_steps=None)
    learner.build()
    module = learner.module[DEFAULT_MODULE_ID]
    with torch.no_grad():  # a target apart from the online net, so that a sync would show
        for param in module.target_q_net.parameters():
            param.zero_()
    learner.update_from_batch(_dqn_batch(float("nan")))
    assert learner.weights_seq_no == 0
    assert all((p == 0).all() for p in module.target_q_net.parameters())
    learner.update_from_batch(_dqn_batch(1.0))
    assert learner.weights_seq_no == 1
    synced = zip(module.target_q_net.state_dict().values(), module.q_net.state_dict().values())
    assert all(torch.equal(target, online) for target, online in synced)


@pytest.mark.parametrize("limit", [0, -1, 2.5, True, "100"])
def test_a_bad_limit_is_refused_naming_it(limit):
    with pytest.raises(ValueError, match="max_consecutive_non_finite_steps must be an int >= 1 or None"):
        BCLearner(module_spec=bc_spec(), max_consecutive_non_finite_steps=limit)
    with pytest.raises(ValueError, match="module 'b': max_consecutive_non_finite_steps"):
        BCLearner(module_spec=bc_spec(), config_overrides_per_module={"b": {"max_consecutive_non_finite_steps": limit}})


def _one_rank_with_nan_main(rank: int, world_size: int, tmp_path: str) -> dict[str, Any]:
    learner = BCLearner(module_spec=bc_spec(), max_consecutive_non_finite_steps=3)
    # Rank 0's data turns NaN after one clean item; rank 1's stays clean.
    items = [random_batch(seed=rank)] + [nan_batch() if rank == 0 else random_batch(seed=10 + i) for i in range(6)]
    trainer = make_trainer(tmp_path, strategy="ddp", devices=world_size, use_distributed_sampler=False)
    try:
        trainer.fit(learner, train_dataloaders=loader_of(items))
    except FloatingPointError as error:
        return {"error": str(error), "seq_no": learner.weights_seq_no}
    return {"error": None, "seq_no": learner.weights_seq_no}


def test_ddp_ranks_stop_together_when_one_ranks_data_is_not_finite(tmp_path):
    # DDP averages the gradients before the skip decision, so both ranks skip, count and stop alike.
    rank0, rank1 = run_on_ranks(_one_rank_with_nan_main, str(tmp_path), timeout=60)
    assert rank0["seq_no"] == rank1["seq_no"] == 1
    assert "3 steps in a row skipped; its loss was nan on this rank" in rank0["error"]
    assert "3 steps in a row skipped; its loss was finite on this rank, its gradients were not" in rank1["error"]
