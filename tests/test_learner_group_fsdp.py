"""LearnerGroup(strategy="fsdp2"): two sharded learner processes give what two DDP learners give.

Both groups start once for the whole file (a start costs seconds of imports per process) from
the same built Learner, and every test first loads one group's state into the other, so the
tests do not depend on their order. Sharded learners read whole weights with collective calls;
a call that only rank 0 made would hang the group, which would fail here within ``timeout_s``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import bc_spec, random_batch
from test_learner_group import (
    SGDLearner,
    assert_close_arrays,
    assert_same_arrays,
    assert_same_state,
    episode,
    rank_weights,
)

from lightning_rl import ALL_MODULES, DEFAULT_MODULE_ID, Learner
from lightning_rl.core.sharding import local_part
from lightning_rl.learner.group.learner_group import LearnerGroup

LR = 0.1
STEPS = "num_env_steps_sampled_lifetime"
GROUP_OPTIONS = dict(num_learners=2, num_threads_per_learner=1, timeout_s=60)


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    """``(ddp, fsdp2)``: two learner processes each; the fsdp2 group starts from a checkpoint (from_checkpoint)."""
    torch.manual_seed(0)
    learner = SGDLearner(module_spec=bc_spec(), lr=LR)
    learner.build()
    path = learner.save_to_path(str(tmp_path_factory.mktemp("start") / "learner"))
    ddp = LearnerGroup(learner, strategy="ddp", **GROUP_OPTIONS)
    try:
        fsdp = LearnerGroup.from_checkpoint(path, learner_class=SGDLearner, strategy="fsdp2", **GROUP_OPTIONS)
    except BaseException:
        ddp.shutdown()
        raise
    yield ddp, fsdp
    ddp.shutdown()
    fsdp.shutdown()


def same_start(groups: tuple[LearnerGroup, LearnerGroup]) -> tuple[LearnerGroup, LearnerGroup]:
    """The fsdp2 group takes the ddp group's whole state (weights, optimizer, counters)."""
    ddp, fsdp = groups
    fsdp.set_state(ddp.get_state())
    return ddp, fsdp


def assert_close_results(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]]) -> None:
    assert a.keys() == b.keys()
    for module_id in a:
        assert a[module_id].keys() == b[module_id].keys(), module_id
        for key, value in a[module_id].items():
            assert b[module_id][key] == pytest.approx(value, rel=0, abs=1e-6), (module_id, key)


def assert_close_states(a: Any, b: Any, where: str = "state") -> None:
    """Nested dicts/lists of tensors equal to 1e-6, everything else exactly."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_close_states(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close_states(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6, msg=where)
    else:
        assert a == b, where


def local_and_whole_sizes(learner: Learner) -> tuple[int, int]:
    """For ``foreach_learner``: the numbers of weights this rank holds and the modules have in all."""
    params = list(learner.module.parameters())
    return sum(local_part(p).numel() for p in params), sum(p.numel() for p in params)


def seed_by_rank(learner: Learner) -> None:
    """For ``foreach_learner``: a different torch seed on each rank (as ranks' RNGs drift apart)."""
    torch.manual_seed(100 + learner.global_rank)


def save_lightning_checkpoint(learner: Learner, path: str) -> None:
    """For ``foreach_learner``: the learner's Trainer writes a Lightning checkpoint (every rank takes part)."""
    learner.trainer.save_checkpoint(path)


def test_strategy_is_checked_before_any_process_starts():
    learner = SGDLearner(module_spec=bc_spec())
    with pytest.raises(ValueError, match=r"strategy must be one of \['ddp', 'fsdp2'\], got 'fsdp'"):
        LearnerGroup(learner, num_learners=2, strategy="fsdp")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="strategy='fsdp2' shards the modules over learner processes"):
        LearnerGroup(learner, num_learners=0, strategy="fsdp2")
    with pytest.raises(ValueError, match="ddp_kwargs .* only with strategy='ddp'.*find_unused_parameters"):
        LearnerGroup(learner, num_learners=2, strategy="fsdp2", ddp_kwargs={"find_unused_parameters": True})
    with LearnerGroup(learner, strategy="ddp") as local:  # the default strategy, with one local learner
        assert local.strategy == "ddp" and local.is_local


def test_fsdp2_learners_shard_and_update_as_ddp_learners_do(groups):
    ddp, fsdp = same_start(groups)
    assert fsdp.strategy == "fsdp2"
    sizes = fsdp.foreach_learner(local_and_whole_sizes)
    whole = sizes[0][1]
    assert [local for local, _ in sizes] == [whole // 2, whole // 2]  # each holds half of every weight

    def run(group: LearnerGroup) -> list[Any]:
        returned = [
            group.update_from_batch(
                random_batch(64, seed=1), num_epochs=2, minibatch_size=8, timesteps={STEPS: 64}, return_state=True
            ),
            # Uneven shards (3 and 2 rows, minibatches of 2), then one row: rank 1 trains on none.
            group.update_from_batch(random_batch(5, seed=2), num_epochs=2, minibatch_size=2),
            group.update_from_batch(random_batch(1, seed=3)),
            # One episode: rank 1 is dealt none, yet takes part in gathering the modules.
            group.update_from_episodes([episode(10, seed=4)]),
        ]
        returned += group.update_from_batch(random_batch(16, seed=5), async_update=True)
        returned += group.update_from_batch(random_batch(16, seed=6), async_update=True, return_state=True)
        returned += group.collect_async_results()
        return returned

    expected, got = run(ddp), run(fsdp)
    assert len(got) == len(expected) == 6
    for e, g in zip(expected, got):
        if isinstance(e, tuple):  # return_state=True: (results, whole weights right after the update)
            assert_close_results(e[0], g[0])
            assert_close_arrays(e[1], g[1])
        else:
            assert_close_results(e, g)
    assert got[0][0][ALL_MODULES]["num_env_steps_trained"] == 128
    assert_same_arrays(got[-1][1], fsdp.get_weights())  # the last update's weights are the current ones
    assert_close_arrays(ddp.get_weights(), fsdp.get_weights())
    per_rank = fsdp.foreach_learner(rank_weights)
    assert_same_arrays(per_rank[0], per_rank[1])


def test_fsdp2_state_and_weights_round_trip_and_match_ddp(groups):
    ddp, fsdp = same_start(groups)
    batch = random_batch(32, seed=7)
    ddp.update_from_batch(batch, num_epochs=2)
    fsdp.update_from_batch(batch, num_epochs=2)
    compared = ["rl_module", "optimizer"]
    assert_close_states(ddp.get_state(compared), fsdp.get_state(compared))  # whole weights and SGD momenta

    saved = fsdp.get_state(not_components="metrics_logger")
    weights = fsdp.get_weights()
    fsdp.update_from_batch(random_batch(32, seed=8))
    assert not np.array_equal(
        fsdp.get_weights()[DEFAULT_MODULE_ID]["pi.0.weight"], weights[DEFAULT_MODULE_ID]["pi.0.weight"]
    )
    fsdp.set_state(saved)
    assert_same_state(fsdp.get_state(not_components="metrics_logger"), saved)
    fsdp.update_from_batch(random_batch(32, seed=8))
    fsdp.set_weights(weights)
    assert_same_arrays(fsdp.get_weights(), weights)
    assert_same_arrays(fsdp.get_weights([DEFAULT_MODULE_ID]), weights)
    with pytest.raises(ValueError, match="shape"):  # refused whole, on every rank
        fsdp.set_weights({DEFAULT_MODULE_ID: {k: np.zeros((1, 1), np.float32) for k in weights[DEFAULT_MODULE_ID]}})
    assert_same_arrays(fsdp.get_weights(), weights)


def test_a_module_added_to_an_fsdp2_group_starts_from_rank_0s_weights_and_trains_as_under_ddp(groups):
    ddp, fsdp = same_start(groups)
    for group in groups:
        group.foreach_learner(seed_by_rank)  # each rank would build the new module differently
    torch.manual_seed(100)
    rank_0s = bc_spec((4,)).build().get_state()
    try:
        for group in groups:
            spec = group.add_module(module_id="new", module_spec=bc_spec((4,)))
            assert set(spec.rl_module_specs) == {DEFAULT_MODULE_ID, "new"}
            assert_same_arrays(group.get_weights(["new"])["new"], {k: v.numpy() for k, v in rank_0s.items()})
        # Each learner trains "new" on other rows; "new" has 3 rows, so rank 1's last minibatch lacks it.
        batch = {DEFAULT_MODULE_ID: random_batch(16, seed=9), "new": random_batch(3, seed=10)}
        expected = ddp.update_from_batch(batch, num_epochs=2, minibatch_size=1)
        got = fsdp.update_from_batch(batch, num_epochs=2, minibatch_size=1)
        assert_close_results(expected, got)
        assert_close_arrays(ddp.get_weights(), fsdp.get_weights())
        assert not np.array_equal(fsdp.get_weights(["new"])["new"]["pi.0.weight"], rank_0s["pi.0.weight"].numpy())
    finally:
        for group in groups:
            spec = group.remove_module("new")
    assert set(spec.rl_module_specs) == {DEFAULT_MODULE_ID}
    assert set(fsdp.get_weights()) == {DEFAULT_MODULE_ID}
    assert fsdp.update_from_batch(random_batch(8))[ALL_MODULES]["num_env_steps_trained"] == 8


def test_fsdp2_checkpoints_load_into_a_ddp_group_and_a_local_learner(groups, tmp_path):
    ddp, fsdp = same_start(groups)
    fsdp.update_from_batch(random_batch(32, seed=11), num_epochs=2, timesteps={STEPS: 32})
    fsdp.add_module(module_id="extra", module_spec=bc_spec((4,)))  # restore must add it to the ddp group
    path = fsdp.save_to_path(tmp_path / "fsdp2")
    saved = fsdp.get_state(["rl_module", "optimizer"])
    fsdp.remove_module("extra")

    local = SGDLearner.from_checkpoint(path)  # whole tensors, in a single process
    assert_same_arrays(
        rank_weights(local), {m: {k: v.numpy() for k, v in w.items()} for m, w in saved["rl_module"].items()}
    )
    assert_same_state(local.get_state("optimizer")["optimizer"], saved["optimizer"])

    ddp.restore_from_path(path)
    fsdp.restore_from_path(path)  # and back into the sharded group, "extra" included
    batch = {DEFAULT_MODULE_ID: random_batch(16, seed=12), "extra": random_batch(16, seed=13)}
    timesteps = {STEPS: 64}
    expected = local.update_from_batch(batch, timesteps=timesteps)  # the whole batch in one process
    got = fsdp.update_from_batch(batch, timesteps=timesteps)
    assert_close_results(ddp.update_from_batch(batch, timesteps=timesteps), got)
    for module_id in batch:  # shards of equal size: the mean loss and the averaged gradient of the whole batch
        for key in ("total_loss", "gradients_default_optimizer_global_norm"):
            assert got[module_id][key] == pytest.approx(expected[module_id][key], rel=1e-5), (module_id, key)
    assert_close_arrays(rank_weights(local), fsdp.get_weights())
    assert_close_arrays(rank_weights(local), ddp.get_weights())

    # A Lightning checkpoint written by the sharded learners' Trainer restores too (whole weights).
    ckpt = str(tmp_path / "fsdp2.ckpt")
    fsdp.foreach_learner(save_lightning_checkpoint, path=ckpt)
    weights = fsdp.get_weights()
    fsdp.update_from_batch(batch)
    fsdp.restore_from_path(ckpt)
    assert_same_arrays(fsdp.get_weights(), weights)
    assert_same_arrays(rank_weights(SGDLearner.from_checkpoint(ckpt)), weights)
    for group in groups:
        group.remove_module("extra")
    assert os.path.isdir(path)
