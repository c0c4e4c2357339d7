"""One test per private Lightning API the Learner uses (lightning_rl/learner/_lightning_private.py).

Each fails, naming the function, if Lightning renames or changes what it relies on.
"""

from __future__ import annotations

import csv

import socket
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _helpers import bc_spec, loader_of, make_trainer, random_batch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel

from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.learner._lightning_private import (
    _STEP_HOOKS,
    attached_trainer,
    step_hooks_have_listeners,
    step_without_dispatch,
    trainer_writes_logs_now,
    wrap_model_for_strategy,
    write_hparams_summary,
    write_step_metrics,
)


class _Record(Callback):
    """Calls ``probe(trainer, module)`` before every train item and keeps the answers."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.seen: list[Any] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append(self.probe(trainer, pl_module))


def test_attached_trainer_is_the_fitting_trainer_and_none_standalone(tmp_path):
    learner = BCLearner(module_spec=bc_spec())
    assert attached_trainer(learner) is None
    with pytest.raises(RuntimeError):  # why the public property cannot answer it
        learner.trainer
    record = _Record(lambda trainer, module: attached_trainer(module) is trainer)
    make_trainer(tmp_path, callbacks=[record]).fit(learner, loader_of([random_batch()] * 2))
    assert record.seen == [True, True]


def test_trainer_writes_logs_now_follows_log_every_n_steps(tmp_path):
    record = _Record(lambda trainer, module: trainer_writes_logs_now(trainer))
    trainer = make_trainer(tmp_path, callbacks=[record], log_every_n_steps=2)
    trainer.fit(BCLearner(module_spec=bc_spec()), loader_of([random_batch()] * 4))
    # Lightning writes logs after every second item; had the private property moved, the
    # fallback would answer True every time.
    assert record.seen == [False, True, False, True]
    assert isinstance(type(trainer._logger_connector).should_update_logs, property)


def test_write_step_metrics_writes_one_row_at_the_step_and_fills_callback_and_logged_metrics(tmp_path):
    table = CSVLogger(tmp_path)
    record = _Record(lambda trainer, module: write_step_metrics(trainer, {"a": 1.5, "b": -2.0}, 2**24 + 1))
    trainer = make_trainer(tmp_path, callbacks=[record], logger=table, log_every_n_steps=100)
    trainer.fit(BCLearner(module_spec=bc_spec()), loader_of([random_batch()]))
    assert record.seen == [True]  # False would mean the connector moved: the Learner then falls back to self.log
    # The Learner writes its own item's results too (the epoch's last item): the probe's is the row with "a".
    with open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv", newline="") as table_file:
        rows = [row for row in csv.DictReader(table_file) if row.get("a")]
    assert [(row["a"], row["b"], row["step"]) for row in rows] == [("1.5", "-2.0", str(2**24 + 1))]
    for metrics in (trainer.callback_metrics, trainer.logged_metrics):
        assert metrics["a"].dtype == torch.float32 and metrics["a"].item() == 1.5 and metrics["b"].item() == -2.0
        assert metrics["step"].item() == 2**24 + 1


def test_step_hooks_have_listeners_reads_hooks_every_dispatching_class_still_defines(tmp_path):
    # Each name must exist on its class: a renamed one would make every step take the full
    # dispatch (correct, but the speed-up silently gone).
    for base, names in _STEP_HOOKS.items():
        for name in names:
            assert callable(getattr(base, name, None)), f"{base.__name__}.{name}"
    assert LightningModule()._fabric is None  # a module run by the Trainer, not by Fabric
    record = _Record(step_hooks_have_listeners)
    make_trainer(tmp_path, callbacks=[record]).fit(BCLearner(module_spec=bc_spec()), loader_of([random_batch()] * 2))
    assert record.seen == [False, False]


def test_step_without_dispatch_steps_and_counts_as_the_wrappers_step(tmp_path):
    record = _Record(lambda trainer, module: callable(trainer.strategy._lightning_optimizers[0]._on_before_step))
    learner = BCLearner(module_spec=bc_spec())
    trainer = make_trainer(tmp_path, callbacks=[record])
    trainer.fit(learner, loader_of([random_batch()] * 2))
    assert record.seen == [True, True]
    # The fit loop's brackets count each step in the progress behind global_step, as LightningOptimizer.step does.
    steps_before = trainer.global_step
    assert steps_before > 0
    loop = trainer.fit_loop.epoch_loop.manual_optimization
    wrapper = trainer.strategy._lightning_optimizers[0]
    wrapper._on_before_step, wrapper._on_after_step = loop._on_before_step, loop._on_after_step
    weights = [p.detach().clone() for p in learner.parameters()]
    for p in learner.parameters():
        p.grad = torch.ones_like(p)
    step_without_dispatch(wrapper)
    assert trainer.global_step == steps_before + 1
    assert any(not torch.equal(before, after) for before, after in zip(weights, learner.parameters()))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_wrap_model_for_strategy_builds_a_new_ddp_wrapper_with_the_strategys_settings():
    strategy = DDPStrategy(
        parallel_devices=[torch.device("cpu")],
        cluster_environment=LightningEnvironment(),
        process_group_backend="gloo",
        find_unused_parameters=True,
    )
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        model = LightningModule()
        model.layer = torch.nn.Linear(3, 2)
        wrapped = wrap_model_for_strategy(strategy, model)
        assert isinstance(wrapped, DistributedDataParallel)
        assert wrapped.module is model
        assert wrapped.find_unused_parameters is True  # the strategy's own DDP settings
    finally:
        dist.destroy_process_group()


def test_claim_version_directory_gives_concurrent_runs_distinct_versions_and_the_logger_uses_it(tmp_path):
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from lightning_rl.learner._lightning_private import claim_version_directory

    first, second = TensorBoardLogger(str(tmp_path)), CSVLogger(str(tmp_path), name="lightning_logs")
    # Neither has looked at the directory yet: without the claim both would pick version_0.
    assert claim_version_directory(first) == tmp_path / "lightning_logs" / "version_0"
    assert claim_version_directory(second) == tmp_path / "lightning_logs" / "version_1"
    assert (first.version, second.version) == (0, 1)
    assert first.log_dir == str(tmp_path / "lightning_logs" / "version_0")
    assert claim_version_directory(TensorBoardLogger(str(tmp_path), version=7)) is None  # the user's choice stands


def test_run_validation_now_runs_the_fits_validation_loop_from_on_train_start(tmp_path):
    from lightning_rl.learner._lightning_private import run_validation_now

    class Early(Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            run_validation_now(trainer)
            assert trainer.training  # back to training, as Lightning's own call leaves it

    class Counting(BCLearner):
        def validation_step(self, batch: Any, batch_idx: int = 0) -> None:
            self.validated = getattr(self, "validated", 0) + 1

    learner = Counting(module_spec=bc_spec())
    trainer = make_trainer(tmp_path, callbacks=[Early()], num_sanity_val_steps=0, limit_val_batches=1)
    trainer.fit(learner, loader_of([random_batch()]), loader_of([random_batch()]))
    assert learner.validated == 2  # once early, once after the epoch


def test_write_hparams_summary_writes_the_flattened_hyperparameters_and_no_metric_value(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    logger = TensorBoardLogger(tmp_path, default_hp_metric=False)
    write_hparams_summary(logger, {"lr": 0.1, "model_config": {"fcnet_hiddens": [8]}, "seed": None}, ["hp_metric"])
    logger.experiment.flush()
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert set(start.hparams) == {"lr", "model_config/fcnet_hiddens", "seed"}
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert [info.name.tag for info in experiment.metric_infos] == ["hp_metric"]
    assert events.Tags()["scalars"] == []
