"""Sharded updates (``Trainer(strategy="fsdp2", devices=2)``) equal DDP's and one process's.

Two spawned runs on 2 CPU ranks (tests/ranks.py), each fitting several Learners one after
the other, because starting two ranks costs seconds of imports:

- ``_updates_on_rank``: train items through ``update_from_batch``, each rank on its half of a
  fixed batch, under fsdp2 and under ddp (PPO and SAC with SGD, so that the average of two
  half-batch steps is one whole-batch step, which the test then takes in this process;
  PPO with Adam; BC clipped by "norm" and by "value"; a NaN on one rank only; uneven shards
  and modules missing on one rank); Lightning's own ``ModelParallelStrategy``.
- ``_fits_on_rank``: a PPO CartPole fit with evaluation under fsdp2 and ddp, and a SAC
  Pendulum fit under fsdp2.

Each rank returns whole weights (gathered from the shards: ``core.sharding.module_state``).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import bc_spec, loader_of, random_batch
from ranks import run_on_ranks

from lightning_rl import Columns, MultiRLModuleSpec, RLModuleSpec
from lightning_rl.algorithms import sac as sac_algorithm
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.algorithms.off_policy import N_STEP, WEIGHTS
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.algorithms.sac import ALPHA_OPTIMIZER, POLICY_OPTIMIZER, QF_OPTIMIZER, SACLearner, SACModule
from lightning_rl.core.train_item import TrainingData, TrainItem

MODULE_ID = "default_policy"
SGD_LR = 0.1
PPO_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
SAC_OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
SAC_ACTIONS = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 5.0], np.float32))
ROWS = 32  # per whole batch; each rank trains on 16
NUM_ITEMS = 3
PPO_GRAD_CLIP = 0.05  # below the gradients' global norm: every step clips


# ---- FSDP2's input handling on a GPU, replayed on CPU ranks --------------------------------


def _index_root_inputs_as_on_a_gpu() -> None:
    """Make FSDP2 treat the root module's inputs on CPU ranks as it does on a GPU.

    On CUDA, FSDP2 (torch 2.11) moves the inputs of the first pass of each iteration to the
    device and reads the first of them (``_to_kwargs(...)[0]`` in ``_root_pre_forward``), so a
    pass called without inputs raises ``IndexError``; on CPU ranks it leaves them alone, and
    such a pass went unnoticed here. This replays that step on the CPU ranks of these tests.
    """
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    from torch.distributed.utils import _to_kwargs

    original = FSDPState._root_pre_forward

    def root_pre_forward(self, module, args, kwargs):
        is_first_pass = self._state_ctx.iter_forward_root is None
        args, kwargs = original(self, module, args, kwargs)
        if is_first_pass:
            args_tuple, kwargs_tuple = _to_kwargs(args, kwargs, self._device, False)
            args, kwargs = args_tuple[0], kwargs_tuple[0]
        return args, kwargs

    FSDPState._root_pre_forward = root_pre_forward


# ---- Learners with plain SGD: one step on a mean loss is linear in the rows ---------------


def _sgd(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=SGD_LR)


class SGDPPOLearner(PPOLearner):
    def configure_optimizers_for_module(self, module_id: str, config: Any) -> None:
        params = self.get_parameters(self.module[module_id])
        self.register_optimizer(module_id=module_id, optimizer=_sgd(params), params=params, lr_or_lr_schedule=SGD_LR)


class SGDSACLearner(SACLearner):
    """SAC's three optimizers ("policy", "qf", "alpha"), each plain SGD."""

    def configure_optimizers_for_module(self, module_id: str, config: Any) -> None:
        module = self.module[module_id]
        with torch.no_grad():
            module.log_alpha.fill_(math.log(config.initial_alpha))
        groups = {
            POLICY_OPTIMIZER: self.get_parameters(module.pi),
            QF_OPTIMIZER: self.get_parameters(module.qf) + self.get_parameters(module.qf_twin),
            ALPHA_OPTIMIZER: [module.log_alpha],
        }
        for name, params in groups.items():
            self.register_optimizer(
                module_id=module_id,
                optimizer_name=name,
                optimizer=_sgd(params),
                params=params,
                lr_or_lr_schedule=SGD_LR,
            )


class SGDBCLearner(BCLearner):
    def configure_optimizers_for_module(self, module_id: str, config: Any) -> None:
        params = self.get_parameters(self.module[module_id])
        self.register_optimizer(module_id=module_id, optimizer=_sgd(params), params=params, lr_or_lr_schedule=SGD_LR)


def _row_noise(mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """SAC's Gaussian sample with noise fixed by each row's mean instead of drawn: two half
    batches on two ranks then sample what the whole batch samples in one process."""
    return mean + log_std.exp() * torch.sin(37.0 * mean.detach())


# ---- Batches and learners ------------------------------------------------------------------


def ppo_spec() -> RLModuleSpec:
    return RLModuleSpec(
        module_class=PPOModule,
        observation_space=PPO_OBS,
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [8]},
    )


def sac_spec() -> RLModuleSpec:
    return RLModuleSpec(
        module_class=SACModule,
        observation_space=SAC_OBS,
        action_space=SAC_ACTIONS,
        model_config={"fcnet_hiddens": [8]},
    )


def ppo_batch(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        Columns.OBS: rng.normal(size=(ROWS, 4)).astype(np.float32),
        Columns.ACTIONS: rng.integers(0, 2, ROWS),
        Columns.ACTION_LOGP: rng.normal(-0.7, 0.3, ROWS).astype(np.float32),
        Columns.ADVANTAGES: rng.normal(size=ROWS).astype(np.float32),
        Columns.VALUE_TARGETS: rng.normal(size=ROWS).astype(np.float32),
    }


def sac_batch(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    low, high = SAC_ACTIONS.low, SAC_ACTIONS.high
    return {
        Columns.OBS: rng.normal(size=(ROWS, 3)).astype(np.float32),
        Columns.ACTIONS: rng.uniform(low, high, (ROWS, 2)).astype(np.float32),
        Columns.REWARDS: rng.normal(size=ROWS).astype(np.float32),
        Columns.NEXT_OBS: rng.normal(size=(ROWS, 3)).astype(np.float32),
        Columns.TERMINATEDS: rng.random(ROWS) < 0.25,
        N_STEP: rng.integers(1, 4, ROWS),
        WEIGHTS: rng.uniform(0.2, 1.0, ROWS).astype(np.float32),
    }


def _half(batch: dict[str, np.ndarray], rank: int) -> dict[str, np.ndarray]:
    rows = slice(0, ROWS // 2) if rank == 0 else slice(ROWS // 2, ROWS)
    return {column: values[rows] for column, values in batch.items()}


def _one_step_items(batches: list[dict[str, np.ndarray]], rank: int) -> list[TrainItem]:
    """One train item per whole batch: this rank's half, trained in one step."""
    return [
        TrainItem(
            TrainingData(batch={MODULE_ID: _half(batch, rank)}),
            update_settings={"num_epochs": 1, "minibatch_size": None},
        )
        for batch in batches
    ]


def ppo_learner(cls: type = SGDPPOLearner, **kwargs: Any) -> PPOLearner:
    # Advantages are not standardized per minibatch: a half batch's mean and std are not the whole's.
    return cls(ppo_spec(), normalize_advantages=False, grad_clip=PPO_GRAD_CLIP, **kwargs)


def sac_learner() -> SACLearner:
    return SGDSACLearner(sac_spec(), initial_alpha=0.5, tau=0.3)


# ---- What ranks run ------------------------------------------------------------------------


def _numpy(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {name: value.detach().cpu().numpy().copy() for name, value in state.items()}


def _fit_items(learner: Any, items: list[TrainItem], strategy: Any, root: str) -> dict[str, Any]:
    """Fit ``learner`` on ``items`` (one per step) on 2 ranks; whole weights before and after, and each step's results."""
    from lightning.pytorch import Callback, Trainer, seed_everything

    from lightning_rl.core.sharding import module_state, optimizer_state

    class Record(Callback):
        def __init__(self) -> None:
            self.results: list[dict[str, dict[str, float]]] = []
            self.weights: list[dict[str, np.ndarray]] = []

        def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
            self.weights.append(_numpy(module_state(pl_module.module)))

        def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
            results = outputs["results"]
            self.results.append({mid: {k: float(v) for k, v in values.items()} for mid, values in results.items()})
            self.weights.append(_numpy(module_state(pl_module.module)))

    seed_everything(0)
    record = Record()
    trainer = Trainer(
        accelerator="cpu", strategy=strategy, devices=2, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=root, use_distributed_sampler=False,
        callbacks=[record],
    )  # fmt: skip
    trainer.fit(learner, train_dataloaders=loader_of(items))
    return {
        "weights": record.weights,  # at the start, then after each item
        "results": record.results,
        "optimizers": {
            name: _numpy(
                {
                    f"{i}.{key}": value
                    for i, entry in optimizer_state(opt)["state"].items()
                    for key, value in entry.items()
                    if isinstance(value, torch.Tensor)
                }
            )
            for name, opt in learner._named_optimizers.items()
        },  # fmt: skip
        "sharded": learner._sharding_mesh is not None,
    }


def _uneven_items(rank: int) -> list[TrainItem]:
    """Rank 0 holds rows of "a" and "b", rank 1 of "a" only; rank 0 then gets an item without rows."""

    def item(seed: int, **rows: int) -> TrainItem:
        return TrainItem(
            TrainingData(batch={mid: random_batch(count, seed=seed + i) for i, (mid, count) in enumerate(rows.items())})
        )

    if rank == 0:
        return [item(1, a=40, b=24), TrainItem(TrainingData(batch={})), item(3, b=5)]
    return [item(2, a=20), item(4, a=12), item(5, a=8)]


def _uneven_learner() -> BCLearner:
    spec = MultiRLModuleSpec(rl_module_specs={"a": bc_spec(), "b": bc_spec(), "frozen": bc_spec()})
    return SGDBCLearner(
        spec, num_epochs=2, minibatch_size=16, shuffle_batch_per_epoch=False, policies_to_train=["a", "b"]
    )


def _nan_items(rank: int) -> list[TrainItem]:
    """Three BC items; in the second, rank 1's first observation is NaN."""
    items = []
    for seed in range(3):
        batch = random_batch(16, seed=10 * seed + rank)
        if seed == 1 and rank == 1:
            batch[Columns.OBS][0, 0] = np.nan
        items.append(TrainItem(TrainingData(batch={MODULE_ID: batch})))
    return items


def _updates_on_rank(rank: int, world_size: int, root: str) -> dict[str, Any]:
    from lightning.pytorch.strategies import ModelParallelStrategy

    sac_algorithm._gaussian_sample = _row_noise
    _index_root_inputs_as_on_a_gpu()
    ppo_items = _one_step_items([ppo_batch(seed) for seed in range(NUM_ITEMS)], rank)
    sac_items = _one_step_items([sac_batch(seed) for seed in range(NUM_ITEMS)], rank)
    # Rank 1's rewards of the second SAC item hold a NaN: the critics' step is skipped on both ranks.
    if rank == 1:
        sac_items[1].data.batch[MODULE_ID][Columns.REWARDS][0] = np.nan
    out: dict[str, Any] = {}
    for strategy in ("fsdp2", "ddp"):
        out[f"ppo_sgd/{strategy}"] = _fit_items(ppo_learner(), ppo_items, strategy, root)
        out[f"ppo_adam/{strategy}"] = _fit_items(ppo_learner(PPOLearner, lr=1e-2), ppo_items, strategy, root)
        out[f"sac_sgd/{strategy}"] = _fit_items(sac_learner(), sac_items, strategy, root)
        out[f"uneven/{strategy}"] = _fit_items(_uneven_learner(), _uneven_items(rank), strategy, root)
        for clip_by in ("norm", "value"):
            learner = SGDBCLearner(bc_spec(), grad_clip=0.01, grad_clip_by=clip_by)
            out[f"bc_{clip_by}/{strategy}"] = _fit_items(learner, _nan_items(rank), strategy, root)
    lightning_fsdp = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    out["ppo_sgd/model_parallel"] = _fit_items(ppo_learner(), ppo_items, lightning_fsdp, root)
    try:
        tensor_parallel = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2)
        _fit_items(ppo_learner(), ppo_items, tensor_parallel, root)
        out["tensor_parallel_error"] = ""
    except ValueError as error:
        out["tensor_parallel_error"] = str(error)
    return out


# ---- Tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def updates(tmp_path_factory) -> list[dict[str, Any]]:
    return run_on_ranks(_updates_on_rank, str(tmp_path_factory.mktemp("updates")), timeout=120)


def _assert_close(a: dict[str, np.ndarray], b: dict[str, np.ndarray], atol: float, what: str) -> None:
    assert a.keys() == b.keys(), what
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=0, atol=atol, err_msg=f"{what}: {name}")


def _assert_ranks_identical(rank0: dict[str, Any], rank1: dict[str, Any], what: str) -> None:
    for step, (a, b) in enumerate(zip(rank0["weights"], rank1["weights"])):
        _assert_close(a, b, atol=0, what=f"{what}, ranks after item {step}")


def _single_process(learner: Any, start: dict[str, np.ndarray], batches: list[dict[str, np.ndarray]]) -> Any:
    """``learner`` built in this process from ``start``'s weights, after one whole-batch update per batch."""
    learner.build()
    learner.module.load_state_dict({name: torch.from_numpy(value) for name, value in start.items()})
    results = [learner.update_from_batch({MODULE_ID: batch}, num_epochs=1, minibatch_size=None) for batch in batches]
    return {name: value.detach().numpy() for name, value in learner.module.state_dict().items()}, results


@pytest.mark.parametrize("algorithm", ["ppo_sgd", "sac_sgd"])
def test_fsdp2_steps_equal_ddp_and_one_process_on_the_whole_batch(updates, algorithm, monkeypatch):
    rank0, rank1 = updates
    fsdp, ddp = rank0[f"{algorithm}/fsdp2"], rank0[f"{algorithm}/ddp"]
    assert fsdp["sharded"] and not ddp["sharded"]
    _assert_ranks_identical(fsdp, rank1[f"{algorithm}/fsdp2"], f"{algorithm} fsdp2")
    for step, (sharded, replicated) in enumerate(zip(fsdp["weights"], ddp["weights"])):
        _assert_close(sharded, replicated, atol=1e-6, what=f"{algorithm}: fsdp2 vs ddp after item {step}")
    # Every weight moved (SAC's target critics too, by their Polyak updates of sharded weights).
    trained = [name for name in fsdp["weights"][0] if name.endswith((".weight", ".bias", "log_alpha"))]
    assert any("target" in name for name in trained) == (algorithm == "sac_sgd")
    for name in trained:
        assert not np.array_equal(fsdp["weights"][0][name], fsdp["weights"][-1][name]), name

    # One process, one step per whole batch: what the averaged half-batch steps add up to.
    if algorithm == "ppo_sgd":
        learner, batches = ppo_learner(), [ppo_batch(seed) for seed in range(NUM_ITEMS)]
    else:
        monkeypatch.setattr(sac_algorithm, "_gaussian_sample", _row_noise)
        learner, batches = sac_learner(), [sac_batch(seed) for seed in range(NUM_ITEMS)]
        batches[1][Columns.REWARDS][ROWS // 2] = np.nan  # rank 1's first row
    single, results = _single_process(learner, fsdp["weights"][0], batches)
    _assert_close(fsdp["weights"][-1], single, atol=1e-5, what=f"{algorithm}: fsdp2 vs one process")

    # The logged global norms (before clipping) are the whole gradients' norms, on every rank.
    for step, single_results in enumerate(results):
        for key, value in single_results[MODULE_ID].items():
            if key.startswith("gradients_") and key.endswith("_global_norm"):
                for run in (fsdp, ddp, rank1[f"{algorithm}/fsdp2"]):
                    logged = run["results"][step][MODULE_ID][key]
                    assert logged == pytest.approx(value, rel=1e-5, nan_ok=True), (step, key)
    if algorithm == "ppo_sgd":
        assert all(r[MODULE_ID]["gradients_default_optimizer_global_norm"] > PPO_GRAD_CLIP for r in fsdp["results"])


def test_sac_skips_the_critics_step_on_both_ranks_when_one_rank_has_a_nan_reward(updates):
    rank0, rank1 = updates
    for run in (rank0["sac_sgd/fsdp2"], rank1["sac_sgd/fsdp2"]):
        before, after = run["weights"][1], run["weights"][2]
        qf = [name for name in before if ".qf." in f".{name}" or ".qf_twin." in f".{name}"]
        pi = [name for name in before if ".pi." in f".{name}"]
        assert qf and pi
        for name in qf:
            np.testing.assert_array_equal(before[name], after[name], err_msg=name)
        assert any(not np.array_equal(before[name], after[name]) for name in pi)
        # Summed over the ranks: one skip on each (only the critics' optimizer skips).
        assert run["results"][1][MODULE_ID]["num_non_finite_updates_skipped"] == 2
        assert run["results"][0][MODULE_ID].get("num_non_finite_updates_skipped", 0) == 0
    assert rank0["sac_sgd/ddp"]["results"][1][MODULE_ID]["num_non_finite_updates_skipped"] == 2


def test_fsdp2_adam_steps_equal_ddp_weights_and_moments(updates):
    rank0, rank1 = updates
    fsdp, ddp = rank0["ppo_adam/fsdp2"], rank0["ppo_adam/ddp"]
    _assert_ranks_identical(fsdp, rank1["ppo_adam/fsdp2"], "adam fsdp2")
    _assert_close(fsdp["weights"][-1], ddp["weights"][-1], atol=1e-6, what="adam: fsdp2 vs ddp")
    assert fsdp["optimizers"].keys() == ddp["optimizers"].keys()
    for name in fsdp["optimizers"]:
        assert any(key.endswith("exp_avg_sq") for key in fsdp["optimizers"][name])
        _assert_close(fsdp["optimizers"][name], ddp["optimizers"][name], atol=1e-6, what=f"adam moments {name}")


@pytest.mark.parametrize("clip_by", ["norm", "value"])
def test_clipping_by_norm_and_value_and_a_nan_on_one_rank_decide_alike_under_fsdp2_and_ddp(updates, clip_by):
    rank0, rank1 = updates
    fsdp, ddp = rank0[f"bc_{clip_by}/fsdp2"], rank0[f"bc_{clip_by}/ddp"]
    _assert_ranks_identical(fsdp, rank1[f"bc_{clip_by}/fsdp2"], f"bc {clip_by} fsdp2")
    for step, (sharded, replicated) in enumerate(zip(fsdp["weights"], ddp["weights"])):
        _assert_close(sharded, replicated, atol=1e-6, what=f"clip by {clip_by}: fsdp2 vs ddp after item {step}")
    # The second item (a NaN observation on rank 1 only) is skipped on both ranks: no weight moves.
    for run in (fsdp, rank1[f"bc_{clip_by}/fsdp2"]):
        _assert_close(run["weights"][1], run["weights"][2], atol=0, what="the skipped step")
        assert run["results"][1][MODULE_ID]["num_non_finite_updates_skipped"] == 2  # summed: one on each rank
        assert not all(np.array_equal(run["weights"][0][n], run["weights"][1][n]) for n in run["weights"][0])
    key = "gradients_default_optimizer_global_norm"
    for step in (0, 2):
        assert fsdp["results"][step][MODULE_ID][key] == pytest.approx(ddp["results"][step][MODULE_ID][key], rel=1e-6)


def test_uneven_shards_missing_modules_and_an_empty_rank_train_as_under_ddp(updates):
    rank0, rank1 = updates
    fsdp, ddp = rank0["uneven/fsdp2"], rank0["uneven/ddp"]
    _assert_ranks_identical(fsdp, rank1["uneven/fsdp2"], "uneven fsdp2")
    for step, (sharded, replicated) in enumerate(zip(fsdp["weights"], ddp["weights"])):
        _assert_close(sharded, replicated, atol=1e-6, what=f"uneven: fsdp2 vs ddp after item {step}")
    start, end = fsdp["weights"][0], fsdp["weights"][-1]
    # Weights are named "_rl_modules.{module_id}.{name}": "a" and "b" trained, "frozen" did not move.
    moved = {name: not np.array_equal(start[name], end[name]) for name in start}
    assert {name.split(".")[1] for name in moved} == {"a", "b", "frozen"}
    assert all(moved[name] != (name.split(".")[1] == "frozen") for name in start), moved


def test_lightnings_model_parallel_strategy_with_data_parallel_ranks_trains_as_fsdp2(updates):
    rank0, rank1 = updates
    lightning_fsdp = rank0["ppo_sgd/model_parallel"]
    assert lightning_fsdp["sharded"]
    _assert_ranks_identical(lightning_fsdp, rank1["ppo_sgd/model_parallel"], "model parallel")
    _assert_close(lightning_fsdp["weights"][-1], rank0["ppo_sgd/fsdp2"]["weights"][-1], atol=0, what="vs fsdp2")
    for rank in (rank0, rank1):
        assert "tensor_parallel_size=2" in rank["tensor_parallel_error"]
        assert "fsdp2" in rank["tensor_parallel_error"]


def test_fsdp1_is_refused_by_lightning_itself_on_cpu_before_any_learner_hook():
    """On GPUs the Learner's setup refuses FSDP1 naming "fsdp2" (test_learner_trainer); on CPU Lightning refuses first."""
    from lightning.pytorch import Trainer

    with pytest.raises(ValueError, match="`fsdp` requires a GPU accelerator"):
        Trainer(strategy="fsdp", accelerator="cpu", devices=2)


# ---- Fits with env sampling ----------------------------------------------------------------


def _fits_on_rank(rank: int, world_size: int, root: str) -> dict[str, Any]:
    from lightning.pytorch import Callback, Trainer, seed_everything

    from lightning_rl.core.sharding import module_state
    from lightning_rl.data import OffPolicyDataModule, OnPolicyDataModule

    _index_root_inputs_as_on_a_gpu()

    class AtStart(Callback):
        weights: dict[str, np.ndarray] = {}

        def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
            self.weights = _numpy(module_state(pl_module.module))

    def trainer(strategy: str, *callbacks: Callback) -> Trainer:
        return Trainer(
            accelerator="cpu", strategy=strategy, devices=world_size, max_epochs=1, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, default_root_dir=root, callbacks=list(callbacks),
        )  # fmt: skip

    out: dict[str, Any] = {}
    for strategy in ("fsdp2", "ddp"):
        seed_everything(0)
        learner = PPOLearner(model_config={"fcnet_hiddens": [16]}, num_epochs=2, minibatch_size=16, grad_clip=0.5)
        data = OnPolicyDataModule(
            "CartPole-v1", num_envs=1, rollout_fragment_length=32, seed=0, rollouts_per_epoch=2,
            evaluation_num_episodes=2,
        )  # fmt: skip
        fit = trainer(strategy)
        fit.fit(learner, datamodule=data)
        out[f"ppo/{strategy}"] = {
            "weights": _numpy(module_state(learner.module)),
            "metrics": {key: float(value) for key, value in fit.callback_metrics.items()},
            "sharded": learner._sharding_mesh is not None,
        }
    seed_everything(0)
    learner = SACLearner(model_config={"fcnet_hiddens": [16]}, minibatch_size=16, tau=0.5)
    data = OffPolicyDataModule(
        "Pendulum-v1", seed=0, replay_buffer_capacity=100, train_freq=4, learning_starts=16, rollouts_per_epoch=8,
        evaluation_num_episodes=2,
    )  # fmt: skip
    at_start = AtStart()
    fit = trainer("fsdp2", at_start)
    fit.fit(learner, datamodule=data)
    out["sac"] = {
        "start": at_start.weights,
        "weights": _numpy(module_state(learner.module)),
        "steps": learner.weights_seq_no,
        "eval_episodes": float(fit.callback_metrics["eval/num_episodes"]),
    }
    return out


@pytest.fixture(scope="module")
def fits(tmp_path_factory) -> list[dict[str, Any]]:
    return run_on_ranks(_fits_on_rank, str(tmp_path_factory.mktemp("fits")), timeout=120)


def test_a_ppo_fit_with_evaluation_under_fsdp2_equals_ddp_on_every_rank(fits):
    rank0, rank1 = fits
    fsdp, ddp = rank0["ppo/fsdp2"], rank0["ppo/ddp"]
    assert fsdp["sharded"] and not ddp["sharded"]
    _assert_close(fsdp["weights"], rank1["ppo/fsdp2"]["weights"], atol=0, what="ppo fsdp2 ranks")
    # The ranks sampled with the sharded module's weights gathered whole (Learner.module_for_acting):
    # the same episodes, hence the same updates, as DDP's ranks acting through the module itself.
    _assert_close(fsdp["weights"], ddp["weights"], atol=1e-6, what="ppo fit: fsdp2 vs ddp")
    assert fsdp["metrics"]["eval/num_episodes"] == 2
    for key in ("eval/episode_return_mean", "env_runners/episode_return_mean"):
        for run in (fsdp, rank1["ppo/fsdp2"]):
            assert run["metrics"][key] == pytest.approx(ddp["metrics"][key], rel=1e-6, nan_ok=True), key


def test_an_off_policy_sac_fit_under_fsdp2_keeps_online_and_target_critics_identical_on_every_rank(fits):
    rank0, rank1 = fits
    assert rank0["sac"]["steps"] == rank1["sac"]["steps"] > 0
    assert rank0["sac"]["eval_episodes"] == rank1["sac"]["eval_episodes"] == 2
    start, weights = rank0["sac"]["start"], rank0["sac"]["weights"]
    # The target critics moved (Polyak updates of sharded weights), and so did log_alpha (left whole on each rank).
    moved = [name for name in weights if not np.array_equal(start[name], weights[name])]
    assert any(".target_qf." in name for name in moved) and any(".target_qf_twin." in name for name in moved)
    assert any(name.endswith("log_alpha") for name in moved)
    # Whole weights gathered from the shards, and each rank's own log_alpha, agree bit for bit.
    _assert_close(weights, rank1["sac"]["weights"], atol=0, what="sac fsdp2 ranks")
