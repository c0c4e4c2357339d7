"""LearnerGroup: one local learner, or two learner processes joined by Lightning's DDP.

Starting two learner processes costs seconds (each imports torch and Lightning), so the tests
share one group (``group``) where they can, and every wait on the processes is bounded.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import bc_spec, random_batch

from lightning_rl import ALL_MODULES, DEFAULT_MODULE_ID, Learner, LearnerConfig
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.learner.group._processes import _timeout_message
from lightning_rl.learner.group._protocol import Activity
from lightning_rl.learner.group._worker import main_thread_activity
from lightning_rl.learner.group.learner_group import LearnerGroup, LearnerGroupError

LR = 0.1
STEPS = "num_env_steps_sampled_lifetime"


class SGDLearner(BCLearner):
    """Behaviour cloning with SGD (momentum 0.9), which fails on demand on rank 1.

    A batch column ``"crash"`` makes rank 1's loss raise (1), exit the process (2) or hang (3).
    """

    def configure_optimizers_for_module(self, module_id: str, config: LearnerConfig) -> None:
        params = self.get_parameters(self.module[module_id])
        self.register_optimizer(
            module_id=module_id,
            optimizer=torch.optim.SGD(params, lr=config.lr, momentum=0.9),
            params=params,
            lr_or_lr_schedule=config.lr,
        )

    def compute_loss_for_module(self, *, module_id: str, config: LearnerConfig, batch: Any, fwd_out: Any) -> Any:
        if "crash" in batch and self.global_rank == 1:
            mode = int(batch["crash"][0])
            if mode == 1:
                raise RuntimeError("deliberate failure in the loss on rank 1")
            if mode == 2:
                os._exit(3)
            if mode == 3:
                time.sleep(3600)
        return super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)


def rank_weights(learner: Learner) -> dict[str, dict[str, np.ndarray]]:
    """For ``foreach_learner``: this learner's weights as numpy."""
    return {m: {k: v.detach().cpu().numpy() for k, v in s.items()} for m, s in learner.module.get_state().items()}


def assert_same_arrays(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert_same_arrays(a[key], b[key])
        else:
            np.testing.assert_array_equal(a[key], b[key], err_msg=str(key))


def assert_close_arrays(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert_close_arrays(a[key], b[key], atol)
        else:
            np.testing.assert_allclose(a[key], b[key], atol=atol, rtol=0, err_msg=str(key))


def assert_same_state(a: Any, b: Any, where: str = "state") -> None:
    """Exact equality of nested dicts/lists of tensors and plain values."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_state(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def assert_ranks_agree(group: LearnerGroup) -> dict[str, dict[str, np.ndarray]]:
    """Every learner holds exactly the same weights; returns them."""
    per_rank = group.foreach_learner(rank_weights)
    assert len(per_rank) == group.num_learners
    for other in per_rank[1:]:
        assert_same_arrays(per_rank[0], other)
    return per_rank[0]


def running(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still exist as processes (running, or exited but not reaped)."""
    assert pids
    if os.path.isdir("/proc"):
        return [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    return [p.pid for p in mp.active_children() if p.pid in pids]


def make_group(**kwargs: Any) -> LearnerGroup:
    options = dict(num_learners=2, num_threads_per_learner=1, timeout_s=60)
    options.update(kwargs)
    return LearnerGroup(SGDLearner(module_spec=bc_spec(), lr=LR), **options)


@pytest.fixture(scope="module")
def group():
    group = make_group(max_requests_in_flight=2)
    yield group
    group.shutdown()
    assert not running(group.learner_pids)


@pytest.fixture(scope="module")
def spare_group():
    """A second group: restores the first one's checkpoint, then is broken by a failing learner."""
    group = make_group()
    yield group
    group.shutdown()


def episode(steps: int, seed: int) -> SingleAgentEpisode:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(steps + 1, 4)).astype(np.float32)
    return SingleAgentEpisode(
        observations=obs, actions=(obs[:-1, 0] > 0).astype(np.int64), rewards=np.ones(steps, np.float32)
    )


# ------------------------------------------------------------------------------------------
# num_learners=0: the learner itself, in this process
# ------------------------------------------------------------------------------------------


def test_local_group_gives_the_results_of_the_plain_learner():
    torch.manual_seed(3)
    plain = SGDLearner(module_spec=bc_spec(), lr=LR)
    plain.build()
    torch.manual_seed(3)
    learner = SGDLearner(module_spec=bc_spec(), lr=LR)
    with LearnerGroup(learner) as group:
        assert group.is_local and learner.module is not None  # built, and the very same object
        settings = dict(num_epochs=2, minibatch_size=8, shuffle_batch_per_epoch=True)
        for i in range(2):
            batch = random_batch(32, seed=i)
            torch.manual_seed(i)
            expected = plain.update_from_batch(batch, timesteps={STEPS: 32 * (i + 1)}, **settings)
            torch.manual_seed(i)
            assert group.update_from_batch(batch, timesteps={STEPS: 32 * (i + 1)}, **settings) == expected
        assert_same_arrays(group.get_weights(), rank_weights(plain))

        # Async updates run on a background thread: the same results, in order, none dropped.
        batches = [random_batch(32, seed=10 + i) for i in range(5)]
        expected = [plain.update_from_batch(batch, num_epochs=2) for batch in batches]
        returned = group.update_from_batch(batches[0], async_update=True, num_epochs=2)
        assert returned == []
        for batch in batches[1:]:
            returned += group.update_from_batch(batch, async_update=True, num_epochs=2)
            assert group.num_requests_in_flight <= 2
        returned += group.collect_async_results()
        assert returned == expected
        assert_same_arrays(group.get_weights(), rank_weights(plain))
        assert group.foreach_learner(rank_weights)[0].keys() == {DEFAULT_MODULE_ID}
    with pytest.raises(LearnerGroupError, match="shut down"):
        group.get_weights()


def test_local_group_state_modules_and_checkpoints(tmp_path):
    with LearnerGroup(SGDLearner(module_spec=bc_spec(), lr=LR)) as group:
        group.update_from_batch(random_batch(16))
        saved = group.get_state()
        path = group.save_to_path(tmp_path / "ckpt")
        spec = group.add_module(module_id="other", module_spec=bc_spec((4,)))
        assert set(spec.rl_module_specs) == {DEFAULT_MODULE_ID, "other"}
        group.update_from_batch({DEFAULT_MODULE_ID: random_batch(16), "other": random_batch(8)})
        group.restore_from_path(path)  # removes "other" again, restores weights and optimizer
        assert_same_state(group.get_state(not_components="metrics_logger"), {
            k: v for k, v in saved.items() if k != "metrics_logger"
        })
        restored = SGDLearner.from_checkpoint(path)
        assert_same_arrays(rank_weights(restored), group.get_weights())
        weights = group.get_weights()
        group.update_from_batch(random_batch(16, seed=5))
        group.set_weights(weights)
        assert_same_arrays(group.get_weights(), weights)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_learners=-1), "num_learners must be an int >= 0"),
        (dict(num_learners=1.5), "num_learners must be an int >= 0"),
        (dict(max_requests_in_flight=0), "max_requests_in_flight must be an int >= 1"),
        (dict(timeout_s=0), "timeout_s must be a positive number"),
        (dict(num_threads_per_learner=0), "num_threads_per_learner must be an int >= 1"),
    ],
)
def test_invalid_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LearnerGroup(SGDLearner(module_spec=bc_spec()), **kwargs)


class LockedRule:
    """A policies_to_train rule no pickler can send to another process: it holds a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, module_id: str, batch: Any) -> bool:
        return True


def test_invalid_learner_and_unpicklable_policies_to_train_are_named():
    with pytest.raises(ValueError, match="learner must be a lightning_rl Learner"):
        LearnerGroup(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    # A lambda travels by value (cloudpickle); a rule holding a lock cannot travel at all.
    learner = SGDLearner(module_spec=bc_spec(), policies_to_train=LockedRule())
    before = mp.active_children()
    with pytest.raises(ValueError, match="policies_to_train .* cannot be pickled"):
        LearnerGroup(learner, num_learners=2)
    assert mp.active_children() == before  # refused before any process started
    with LearnerGroup(learner) as local:  # in this process any rule is fine
        local.update_from_batch(random_batch(8))


def test_bad_update_arguments_are_refused_before_anything_runs():
    with LearnerGroup(SGDLearner(module_spec=bc_spec())) as group:
        with pytest.raises(ValueError, match="num_epochs must be >= 1"):
            group.update_from_batch(random_batch(8), num_epochs=0)
        with pytest.raises(ValueError, match="minibatch_size must be >= 1"):
            group.update_from_batch(random_batch(8), minibatch_size=0)
        with pytest.raises(ValueError, match="non-empty list of episodes"):
            group.update_from_episodes([])


# ------------------------------------------------------------------------------------------
# Two learner processes under Lightning's DDP
# ------------------------------------------------------------------------------------------


def test_two_learners_on_equal_shards_equal_one_learner_on_the_whole_batch(group):
    reference = SGDLearner(module_spec=bc_spec(), lr=LR)
    reference.build()
    group.set_state(reference.get_state())  # the same weights and a fresh optimizer on every learner
    assert_same_arrays(assert_ranks_agree(group), rank_weights(reference))
    for i in range(3):
        batch = random_batch(64, seed=i)
        timesteps = {STEPS: 64 * (i + 1)}
        got = group.update_from_batch(batch, num_epochs=2, timesteps=timesteps)
        expected = reference.update_from_batch(batch, num_epochs=2, timesteps=timesteps)
        weights = assert_ranks_agree(group)  # identical on both learners after every update
        assert_close_arrays(weights, rank_weights(reference))
        for key in ("total_loss", "gradients_default_optimizer_global_norm"):
            assert got[DEFAULT_MODULE_ID][key] == pytest.approx(expected[DEFAULT_MODULE_ID][key], rel=1e-5), key
        assert got[ALL_MODULES]["num_env_steps_trained"] == 128  # 64 rows, 2 epochs, over both learners
        assert got[ALL_MODULES][STEPS] == 64 * (i + 1)


def test_uneven_shards_and_a_module_missing_on_one_rank_do_not_hang(group):
    # 5 rows: shards of 3 and 2, so 2 and 1 minibatches of 2 per pass; 1 row: rank 1 gets nothing.
    group.update_from_batch(random_batch(5), num_epochs=2, minibatch_size=2)
    assert_ranks_agree(group)
    group.update_from_batch(random_batch(1))
    assert_ranks_agree(group)
    group.add_module(module_id="p1", module_spec=bc_spec())
    try:
        before = group.get_weights(["p1"])
        # "p1" has one row, so only rank 0 holds any of it.
        results = group.update_from_batch({DEFAULT_MODULE_ID: random_batch(8), "p1": random_batch(1, seed=1)})
        assert results["p1"]["num_module_steps_trained"] == 1
        after = assert_ranks_agree(group)
        assert not np.array_equal(after["p1"]["pi.0.weight"], before["p1"]["pi.0.weight"])
    finally:
        group.remove_module("p1")


def test_an_added_module_is_trained_in_step_on_every_learner(group):
    spec = group.add_module(module_id="new", module_spec=bc_spec((4,)))
    try:
        assert set(spec.rl_module_specs) == {DEFAULT_MODULE_ID, "new"}
        before = assert_ranks_agree(group)["new"]  # built on each rank, then the same everywhere
        # Each learner trains "new" on different rows: only averaged gradients keep them equal.
        batch = {DEFAULT_MODULE_ID: random_batch(32, seed=3), "new": random_batch(32, seed=4)}
        for _ in range(2):
            group.update_from_batch(batch, num_epochs=2)
            after = assert_ranks_agree(group)["new"]
        assert not np.array_equal(after["pi.0.weight"], before["pi.0.weight"])
    finally:
        spec = group.remove_module("new")
    assert set(spec.rl_module_specs) == {DEFAULT_MODULE_ID}
    assert set(group.get_weights()) == {DEFAULT_MODULE_ID}


def test_async_updates_keep_order_drop_nothing_and_apply_back_pressure(group):
    returned = group.update_from_batch(random_batch(16), async_update=True)
    assert returned == []  # the first call does not wait
    for i in range(1, 6):
        returned += group.update_from_batch(random_batch(16, seed=i), async_update=True)
        assert group.num_requests_in_flight <= 2  # the call waited for the oldest instead of queueing more
    # A sync update runs after the async ones; their results stay for the next async call.
    synced = group.update_from_batch(random_batch(16, seed=9))
    assert group.num_requests_in_flight == 0
    returned += group.collect_async_results()
    assert len(returned) == 6
    seq_nos = [results[ALL_MODULES]["weights_seq_no"] for results in returned]
    assert np.diff(seq_nos).tolist() == [1.0] * 5  # in order, one minibatch step each
    assert synced[ALL_MODULES]["weights_seq_no"] == seq_nos[-1] + 1
    assert group.collect_async_results() == []
    assert_ranks_agree(group)


def test_bad_input_is_rejected_everywhere_and_changes_nothing(group):
    before = assert_ranks_agree(group)
    good = random_batch(16)
    rejected_by_all = [
        ({"ghost": good}, "module ids \\['ghost'\\]"),
        ({"obs": good["obs"]}, "lacks column\\(s\\) \\['actions'\\]"),
        ({"obs": np.zeros((16, 3), np.float32), "actions": good["actions"]}, "has shape"),
    ]
    for batch, cause in rejected_by_all:
        with pytest.raises(ValueError, match=f"rejected by learner rank\\(s\\) \\[0, 1\\].*{cause}"):
            group.update_from_batch(batch)
    # A problem in rank 0's shard only: both skip the update, and the error names rank 0.
    with pytest.raises(ValueError, match="rejected by learner rank\\(s\\) \\[0\\];.*ghost"):
        group.update_from_batch({DEFAULT_MODULE_ID: good, "ghost": random_batch(1)})
    # Found before sending: unequal columns, not a batch.
    with pytest.raises(ValueError, match="same, non-zero number of rows"):
        group.update_from_batch({"obs": good["obs"], "actions": good["actions"][:15]})
    with pytest.raises(ValueError, match="non-empty dict"):
        group.update_from_batch([1, 2, 3])  # type: ignore[arg-type]
    # Episodes the connector rejects (one without steps; rank 1 gets no episode at all).
    with pytest.raises(ValueError, match="rejected by learner rank\\(s\\) \\[0\\];.*has no steps"):
        group.update_from_episodes([episode(0, seed=0)])
    # An async update's rejection is raised by the call that collects it.
    assert group.update_from_batch({"obs": good["obs"]}, async_update=True) == []
    with pytest.raises(ValueError, match="lacks column"):
        group.collect_async_results()
    # Bad state and weights are refused whole.
    with pytest.raises(ValueError, match="ghost"):
        group.set_weights({"ghost": before[DEFAULT_MODULE_ID]})
    wrong = {DEFAULT_MODULE_ID: {k: np.zeros((1, 1), np.float32) for k in before[DEFAULT_MODULE_ID]}}
    with pytest.raises(ValueError, match="shape"):
        group.set_weights(wrong)
    assert_same_arrays(assert_ranks_agree(group), before)
    group.update_from_batch(good)  # still usable
    assert_ranks_agree(group)


def test_update_from_episodes_deals_the_episodes_out(group):
    episodes = [episode(10, seed=i) for i in range(3)] + [episode(30, seed=3)]
    results = group.update_from_episodes(episodes, num_epochs=1)
    assert results[ALL_MODULES]["num_env_steps_trained"] == 60  # 30 steps on each learner
    assert_ranks_agree(group)


def _torch_threads(learner: Any) -> int:
    return torch.get_num_threads()


def test_one_learner_process_keeps_the_thread_count_it_was_given():
    # Lightning's DDP launcher would reset it to cpu_count // num_learners (2 on a 2-core machine).
    group = make_group(num_learners=1, num_threads_per_learner=1)
    try:
        assert group.foreach_learner(_torch_threads) == [1]
        results = group.update_from_batch(random_batch(16))
        assert results[ALL_MODULES]["num_env_steps_trained"] == 16
    finally:
        group.shutdown()


def _environment_mark(learner: Any) -> str | None:
    return os.environ.get("LIGHTNING_RL_TEST_MARK")


def test_learners_get_the_drivers_environment_as_it_is_when_the_group_starts(monkeypatch):
    # The fork server the learners come from started with the test session, before this variable was set.
    monkeypatch.setenv("LIGHTNING_RL_TEST_MARK", "set after the fork server started")
    group = make_group(num_learners=1)
    try:
        assert group.foreach_learner(_environment_mark) == ["set after the fork server started"]
    finally:
        group.shutdown()


def test_save_and_restore_continue_exactly_like_an_uninterrupted_group(group, spare_group, tmp_path):
    batches = [random_batch(32, seed=20 + i) for i in range(4)]
    settings = dict(num_epochs=2, minibatch_size=8)
    for i, batch in enumerate(batches[:2]):
        group.update_from_batch(batch, timesteps={STEPS: 100 * i}, **settings)
    path = group.save_to_path(tmp_path / "group")
    saved_weights = group.get_weights()
    for i, batch in enumerate(batches[2:], start=2):
        uninterrupted = group.update_from_batch(batch, timesteps={STEPS: 100 * i}, **settings)

    # The checkpoint is the Learner's own format.
    assert_same_arrays(rank_weights(SGDLearner.from_checkpoint(path)), saved_weights)

    spare_group.restore_from_path(path)
    for i, batch in enumerate(batches[2:], start=2):
        resumed = spare_group.update_from_batch(batch, timesteps={STEPS: 100 * i}, **settings)
    assert resumed == uninterrupted  # losses, norms, lifetime counters, weights_seq_no
    assert_same_arrays(assert_ranks_agree(spare_group), group.get_weights())
    assert_same_state(spare_group.get_state("optimizer"), group.get_state("optimizer"))


# ------------------------------------------------------------------------------------------
# Failing learners: reported with rank and cause, bounded, every process reaped
# ------------------------------------------------------------------------------------------


def _crash_batch(mode: int) -> dict[str, np.ndarray]:
    batch = random_batch(8)
    batch["crash"] = np.full(8, mode)
    return batch


def test_a_learner_that_raises_breaks_the_group_naming_rank_and_cause(spare_group):
    start = time.monotonic()
    with pytest.raises(LearnerGroupError, match="learner rank 1 raised") as info:
        spare_group.update_from_batch(_crash_batch(1))
    assert "RuntimeError: deliberate failure in the loss on rank 1" in str(info.value)
    assert time.monotonic() - start < 30
    with pytest.raises(LearnerGroupError, match="broken.*deliberate failure"):
        spare_group.get_weights()
    assert not running(spare_group.learner_pids)


def test_a_learner_process_that_dies_breaks_the_group_naming_rank_and_exit_code():
    group = make_group()
    try:
        start = time.monotonic()
        with pytest.raises(LearnerGroupError, match="learner rank 1 .* died with exit code 3"):
            group.update_from_batch(_crash_batch(2), async_update=True)
            group.collect_async_results()
        assert time.monotonic() - start < 30
        assert not running(group.learner_pids)
        with pytest.raises(LearnerGroupError, match="broken"):
            group.update_from_batch(random_batch(8))
    finally:
        group.shutdown()


def _all_reduce_on_rank_0_only(learner: Learner) -> int:
    """For ``foreach_learner``: rank 0 enters a collective that rank 1 never joins."""
    if learner.global_rank == 0:
        torch.distributed.all_reduce(torch.zeros(1))
    return learner.global_rank


def test_a_timeout_where_every_silent_rank_waits_in_a_collective_says_so():
    group = make_group(timeout_s=3)
    try:
        with pytest.raises(LearnerGroupError) as error:
            group.foreach_learner(_all_reduce_on_rank_0_only)
        message = str(error.value)
        assert re.search(
            r"learner rank\(s\) \[0\] did not answer foreach_learner \(request \d+\) within 3 s, every one of "
            r"them waiting in a collective for the others .*: rank 0 in .*distributed.*"
            r"called from _all_reduce_on_rank_0_only",
            message,
        ), message
    finally:
        group.shutdown()


def test_a_learners_status_names_the_function_its_main_thread_is_in():
    started = threading.Event()

    def sleeping_in_the_loss() -> None:
        started.set()
        time.sleep(0.5)

    thread = threading.Thread(target=sleeping_in_the_loss)
    thread.start()
    started.wait()
    activity = main_thread_activity(thread.ident)
    thread.join()
    assert not activity.waiting_for_ranks
    assert activity.where.startswith("sleeping_in_the_loss (") and "test_learner_group.py" in activity.where


def test_a_rank_that_does_not_answer_the_status_probe_is_named_as_hung():
    activities = {0: Activity(True, "all_reduce (x.py:1)"), 1: None}
    message = _timeout_message("update_from_batch (request 4)", 2.0, activities)
    assert message.startswith(
        "learner rank(s) [1] did not answer update_from_batch (request 4) within 2 s: "
        "rank 1 does not answer a status probe either. Rank(s) [0] wait for them in a collective: rank 0 in all_reduce"
    )


def test_a_timeout_names_the_rank_that_hangs_apart_from_the_rank_that_waits_for_it():
    group = make_group(timeout_s=3)
    try:
        with pytest.raises(LearnerGroupError) as error:
            group.update_from_batch(_crash_batch(3))  # rank 1 sleeps in its loss
        message = str(error.value)
        # Rank 1 is named with the request, the timeout and the line it hangs at...
        assert re.search(
            r"learner rank\(s\) \[1\] did not answer update_from_batch \(request \d+\) within 3 s: "
            r"rank 1 is in compute_loss_for_module \(.*test_learner_group\.py:\d+\)",
            message,
        ), message
        # ...and rank 0, blocked in the gradient all-reduce of its backward pass, as waiting for it.
        assert re.search(r"Rank\(s\) \[0\] wait for them in a collective: rank 0 in ", message), message
        assert "[0, 1]" not in message
        assert not running(group.learner_pids)  # the hung process was killed and reaped
    finally:
        group.shutdown()
