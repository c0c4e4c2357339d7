"""Checkpoints of sharded Learners (``strategy="fsdp2"``): across strategies, after add/remove_module, from the CLI.

``FSDP2Strategy`` writes whole weights and optimizer states in the format one process
saves, so one file moves between 2 FSDP ranks, one process and 2 DDP ranks. The proofs are
exact continuations: a fit resumed from a checkpoint, written under one strategy and resumed
under another, ends where an uninterrupted fit ends, weights and Adam moments alike.

SAC is the Learner: three Adam optimizers per module, target critics, and a 0-d parameter
(``log_alpha``) that FSDP leaves whole on every rank. Its sampled actions are made
reproducible by seeding torch before every train item (``SeedEachStep``), since a resume does
not restore the random state. Starting two ranks costs seconds, so each spawned run checks
many things and returns numpy: one spawned pair of ranks runs both multi-rank scenarios.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from lightning.pytorch import Callback
from ranks import run_on_ranks
from torch.utils.data import DataLoader

from lightning_rl import Learner, Policy
from lightning_rl.algorithms.off_policy import N_STEP, WEIGHTS
from lightning_rl.algorithms.sac import SACLearner, SACModule
from lightning_rl.core.columns import Columns
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.train_item import TrainingData, TrainItem

REPO = Path(__file__).resolve().parents[1]
OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 5.0], np.float32))
ITEMS_PER_EPOCH = 3
POLICY_OBS = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
FIRST_EPOCHS, ALL_EPOCHS = 2, 4  # the checkpoint to resume is written after FIRST_EPOCHS
NEW_MODULE_SEED = 50  # rank r builds the added module after torch.manual_seed(NEW_MODULE_SEED + r)


def sac_spec(hiddens: tuple[int, ...] = (8, 8)) -> RLModuleSpec:
    return RLModuleSpec(
        module_class=SACModule, observation_space=OBS, action_space=BOX, model_config={"fcnet_hiddens": list(hiddens)}
    )


def replay_batch(rows: int, seed: int) -> dict[str, np.ndarray]:
    """Transitions as a replay buffer hands them out (env-space actions)."""
    rng = np.random.default_rng(seed)
    return {
        Columns.OBS: rng.normal(size=(rows, 3)).astype(np.float32),
        Columns.ACTIONS: rng.uniform(BOX.low, BOX.high, (rows, 2)).astype(np.float32),
        Columns.REWARDS: rng.normal(size=rows).astype(np.float32),
        Columns.NEXT_OBS: rng.normal(size=(rows, 3)).astype(np.float32),
        Columns.TERMINATEDS: rng.random(rows) < 0.25,
        Columns.TRUNCATEDS: np.zeros(rows, dtype=bool),
        N_STEP: np.ones(rows, dtype=np.int64),
        WEIGHTS: np.ones(rows, dtype=np.float32),
    }


def epoch_loader(rank: int, modules_per_item: list[tuple[str, ...]]) -> DataLoader:
    """This rank's train items of every epoch (the same each epoch, other on each rank): item k has rows of
    the modules ``modules_per_item[k]``."""
    items = [
        TrainItem(TrainingData(batch={m: replay_batch(16, seed=100 * rank + 10 * k + i) for i, m in enumerate(ids)}))
        for k, ids in enumerate(modules_per_item)
    ]
    return DataLoader(items, batch_size=None)


class SeedEachStep(Callback):
    """Seeds torch before every train item by its place in the fit, so that SAC samples the same actions in a
    resumed fit as in an uninterrupted one."""

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        torch.manual_seed(1000 * trainer.current_epoch + batch_idx)


def flat_numpy(value: Any, prefix: str = "") -> dict[str, Any]:
    """Every tensor and number in nested dicts and lists, by path; tensors as numpy (they do not outlive a rank)."""
    if isinstance(value, dict):
        return {path: leaf for key, item in value.items() for path, leaf in flat_numpy(item, f"{prefix}/{key}").items()}
    if isinstance(value, (list, tuple)):
        return {path: leaf for i, item in enumerate(value) for path, leaf in flat_numpy(item, f"{prefix}/{i}").items()}
    if isinstance(value, torch.Tensor):
        return {prefix: value.detach().cpu().numpy().copy()}
    return {prefix: value}


def training_state(learner: Learner) -> dict[str, Any]:
    """Whole weights and optimizer states (moments, steps, learning rates), flat; a collective call when sharded."""
    state = learner.get_state(components=["rl_module", "optimizer"])
    return flat_numpy({"rl_module": state["rl_module"], "optimizer": state["optimizer"]})


def assert_states_close(
    actual: dict[str, Any], expected: dict[str, Any], what: str, atol: float = 0.0, trained: bool = True
) -> None:
    """Equal keys, arrays within ``atol``, other values equal; ``trained``: Adam's moments are among them."""
    assert actual.keys() == expected.keys(), what
    assert not trained or any(key.endswith("/exp_avg_sq") for key in expected), what
    for key, value in expected.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_allclose(actual[key], value, rtol=0, atol=atol, err_msg=f"{what}: {key}")
        else:
            assert actual[key] == value, f"{what}: {key}"


def module_weights(state: dict[str, Any], module_id: str) -> dict[str, np.ndarray]:
    prefix = f"/rl_module/{module_id}/"
    return {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}


def assert_plain_tensors_only(path: Path) -> int:
    """Load ``path`` with ``weights_only=True`` and check that every tensor in it is a plain ``torch.Tensor``
    (no ``DTensor``: the file loads in any process, with or without a process group). Returns how many."""
    tensors = [value for value in _leaves(torch.load(path, weights_only=True)) if isinstance(value, torch.Tensor)]
    assert tensors and all(type(tensor) is torch.Tensor for tensor in tensors), {type(t) for t in tensors}
    return len(tensors)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


# Both multi-rank scenarios run in one spawned pair of ranks (starting them costs more than the fits).


def _fsdp_runs_main(rank: int, world_size: int, root: str) -> dict[str, Any]:
    return {
        "strategies": _strategies_main(rank, world_size, f"{root}/strategies"),
        "modules": _modules_main(rank, world_size, f"{root}/modules"),
    }


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """The directory the runs wrote to, and what each rank returned."""
    root = tmp_path_factory.mktemp("fsdp_runs")
    return root, run_on_ranks(_fsdp_runs_main, str(root), timeout=240)


# ---- 1. One checkpoint, three places: FSDP ranks, one process, DDP ranks -------------------------------------------


def _strategies_main(rank: int, world_size: int, root: str) -> dict[str, Any]:
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_rl.core.sharding import is_sharded

    def fit(strategy: str, epochs: int, name: str, ckpt_path: str | None = None) -> tuple[SACLearner, Trainer]:
        # Each rank builds other initial weights: the strategy makes them rank 0's, and a resume replaces them.
        torch.manual_seed(rank + 7)
        learner = SACLearner(sac_spec(), minibatch_size=8, lr=3e-3, tau=0.5)
        trainer = Trainer(
            accelerator="cpu", strategy=strategy, devices=world_size, max_epochs=epochs, logger=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
            use_distributed_sampler=False,
            callbacks=[SeedEachStep(), ModelCheckpoint(dirpath=f"{root}/{name}", filename="{epoch}", save_top_k=-1)],
        )  # fmt: skip
        loader = epoch_loader(rank, [("default_policy",)] * ITEMS_PER_EPOCH)
        trainer.fit(learner, train_dataloaders=loader, ckpt_path=ckpt_path)
        return learner, trainer

    out: dict[str, Any] = {}
    # The reference, an uninterrupted DDP fit; its checkpoint after FIRST_EPOCHS is the DDP one resumed below.
    learner, _ = fit("ddp", ALL_EPOCHS, "ddp")
    out["continuous"] = training_state(learner)
    ddp_checkpoint = f"{root}/ddp/epoch={FIRST_EPOCHS - 1}.ckpt"

    learner, trainer = fit("fsdp2", FIRST_EPOCHS, "fsdp")
    fsdp_checkpoint = f"{root}/fsdp/epoch={FIRST_EPOCHS - 1}.ckpt"
    out["fsdp_first"] = training_state(learner)
    out["global_step_first"] = trainer.global_step
    params = dict(learner.module.named_parameters())
    out["sharded"] = sorted(name for name, param in params.items() if is_sharded(param))
    out["not_sharded"] = sorted(name for name, param in params.items() if not is_sharded(param))
    # The state API on sharded ranks: whole tensors out, whole tensors in (each a collective call).
    whole = learner.get_module_state()["default_policy"]
    out["module_state_shapes"] = {name: tuple(tensor.shape) for name, tensor in whole.items()}
    learner.save_to_path(f"{root}/saved_rank{rank}")  # every rank saves; each into its own directory
    learner.set_module_state({"default_policy": {name: tensor + 1.0 for name, tensor in whole.items()}})
    out["after_set_module_state"] = flat_numpy(learner.get_module_state())
    learner.restore_from_path(f"{root}/saved_rank0")
    out["after_restore_from_dir"] = training_state(learner)
    learner.set_module_state({"default_policy": {name: tensor + 1.0 for name, tensor in whole.items()}})
    learner.restore_from_path(fsdp_checkpoint)
    out["after_restore_from_checkpoint"] = training_state(learner)
    # Policy.from_learner of sharded modules acts with a whole copy (gathering it: every rank calls it).
    out["policy_from_learner"] = Policy.from_learner(learner).act(POLICY_OBS)

    learner, trainer = fit("ddp", ALL_EPOCHS, "fsdp_to_ddp", ckpt_path=fsdp_checkpoint)
    out["fsdp_to_ddp"] = training_state(learner)
    out["global_step_resumed"] = trainer.global_step
    out["ddp_to_fsdp"] = training_state(fit("fsdp2", ALL_EPOCHS, "ddp_to_fsdp", ckpt_path=ddp_checkpoint)[0])
    out["fsdp_to_fsdp"] = training_state(fit("fsdp2", ALL_EPOCHS, "fsdp_to_fsdp", ckpt_path=fsdp_checkpoint)[0])
    return out


def test_a_checkpoint_of_two_fsdp_ranks_loads_in_one_process_and_resumes_exactly_under_ddp_and_fsdp(fsdp_runs):
    root, ranks = fsdp_runs
    tmp_path = root / "strategies"
    rank0, rank1 = (rank["strategies"] for rank in ranks)
    fsdp_checkpoint = tmp_path / "fsdp" / f"epoch={FIRST_EPOCHS - 1}.ckpt"

    # Sharded for real: every parameter but the 0-d log_alpha is a DTensor slice.
    assert rank0["not_sharded"] == ["_rl_modules.default_policy.log_alpha"]
    assert len(rank0["sharded"]) == 30  # pi, qf, qf_twin and both targets: 3 layers x (weight, bias) each
    # The ranks hold one model, and trained it: 2 epochs x 3 items x 2 minibatches x 3 optimizers.
    assert_states_close(rank1["fsdp_first"], rank0["fsdp_first"], "rank 1")
    assert rank0["global_step_first"] == 36
    first = rank0["fsdp_first"]

    # get_module_state gives whole tensors, shaped as in one process; set_module_state takes them.
    single = SACLearner(sac_spec())
    single.build()
    assert rank0["module_state_shapes"] == {
        name: tuple(tensor.shape) for name, tensor in single.get_module_state()["default_policy"].items()
    }
    for rank in (rank0, rank1):
        for name, value in module_weights(first, "default_policy").items():
            np.testing.assert_array_equal(rank["after_set_module_state"][f"/default_policy/{name}"], value + 1.0)
        # restore_from_path takes back a save_to_path directory and a Lightning checkpoint, on sharded ranks.
        assert_states_close(rank["after_restore_from_dir"], first, "restore_from_path(save_to_path dir)")
        assert_states_close(rank["after_restore_from_checkpoint"], first, "restore_from_path(fsdp2 checkpoint)")

    # One process: the fsdp2 checkpoint and both ranks' save_to_path directories load with the ranks' whole state,
    # and the checkpoint's policy acts as the loaded Learner's module does.
    for path in (tmp_path / "saved_rank0", tmp_path / "saved_rank1", fsdp_checkpoint):
        loaded = Learner.from_checkpoint(str(path))
        assert type(loaded) is SACLearner
        assert_states_close(training_state(loaded), first, str(path))
    actions = Policy.from_checkpoint(str(fsdp_checkpoint)).act(POLICY_OBS)
    assert actions.shape == (5, 2) and all(BOX.contains(action) for action in actions)
    np.testing.assert_array_equal(actions, Policy.from_learner(loaded).act(POLICY_OBS))
    # On the sharded ranks (restored from that checkpoint), Policy.from_learner acts alike.
    for rank in (rank0, rank1):
        np.testing.assert_allclose(rank["policy_from_learner"], actions, rtol=0, atol=1e-6)

    # Resumed from the checkpoint written after 2 of 4 epochs, each fit ends where the uninterrupted DDP fit
    # ends: from fsdp2 to DDP, from DDP to fsdp2, from fsdp2 to fsdp2. (Within 1e-6, not bit for bit: FSDP
    # reduce-scatters what DDP all-reduces.)
    assert rank0["global_step_resumed"] == 72  # 4 epochs x 3 items x 2 minibatches x 3 optimizers
    for run in ("fsdp_to_ddp", "ddp_to_fsdp", "fsdp_to_fsdp"):
        for rank in (rank0, rank1):
            assert_states_close(rank[run], rank0["continuous"], run, atol=1e-6)

    # 4. The files hold plain tensors only, and load with weights_only=True: at least the 31 weights and the
    # Adam states (step, exp_avg, exp_avg_sq) of 6 + 12 + 1 parameters.
    assert assert_plain_tensors_only(fsdp_checkpoint) >= 31 + 3 * 19
    assert assert_plain_tensors_only(tmp_path / "saved_rank0" / "learner_state.pt") >= 31 + 3 * 19


# ---- 2. add_module and remove_module on sharded ranks, and a checkpoint written after the add ---------------------

ADD_AT, REMOVE_AT = (0, 0), (1, 1)  # (epoch, batch index) after which every rank adds "new" / removes "frozen"
MODULE_EPOCHS = 3


class ChangeModules(Callback):
    """Adds module "new" and later removes "frozen" at the same batch boundary on every rank (collective calls),
    and records the Learner's whole state around the changes."""

    def __init__(self) -> None:
        self.record: dict[str, Any] = {}

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.record["start"] = training_state(pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        from lightning_rl.core.sharding import is_sharded

        at = (trainer.current_epoch, batch_idx)
        if at == ADD_AT:
            torch.manual_seed(NEW_MODULE_SEED + trainer.global_rank)  # each rank builds other weights
            pl_module.add_module(
                module_id="new", module_spec=sac_spec((16,)), new_should_module_be_updated=["a", "new"]
            )
            self.record["at_add"] = training_state(pl_module)
            self.record["new_not_sharded"] = [
                name for name, param in pl_module.module["new"].named_parameters() if not is_sharded(param)
            ]
            self.record["optimizers_after_add"] = sorted(pl_module._named_optimizers)
        elif at == REMOVE_AT:
            self.record["before_remove"] = training_state(pl_module)
            pl_module.remove_module("frozen")
            self.record["after_remove"] = training_state(pl_module)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.current_epoch == 0:
            self.record["end_of_epoch_0"] = training_state(pl_module)


def _modules_main(rank: int, world_size: int, root: str) -> dict[str, Any]:
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    def fit(name: str, ckpt_path: str | None = None) -> tuple[SACLearner, dict[str, Any]]:
        torch.manual_seed(rank)
        spec = MultiRLModuleSpec(rl_module_specs={"a": sac_spec(), "frozen": sac_spec()})
        learner = SACLearner(module_spec=spec, minibatch_size=8, lr=3e-3, tau=0.5, policies_to_train=["a"])
        changes = ChangeModules()
        trainer = Trainer(
            accelerator="cpu", strategy="fsdp2", devices=world_size, max_epochs=MODULE_EPOCHS, logger=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
            use_distributed_sampler=False,
            callbacks=[SeedEachStep(), changes, ModelCheckpoint(dirpath=f"{root}/{name}", filename="{epoch}", save_top_k=-1)],
        )  # fmt: skip
        # "frozen" is never trained, so no item has rows of it; "new" has rows from the second item on.
        loader = epoch_loader(rank, [("a",), ("a", "new"), ("a", "new")])
        trainer.fit(learner, train_dataloaders=loader, ckpt_path=ckpt_path)
        return learner, changes.record

    learner, record = fit("continuous")
    record["end"] = training_state(learner)
    record["modules"] = sorted(learner.module.keys())
    record["optimizers"] = sorted(learner._named_optimizers)
    # A fresh Learner with the modules the fit started with, resumed from the checkpoint written after the add.
    learner, resumed = fit("resumed", ckpt_path=f"{root}/continuous/epoch=0.ckpt")
    resumed["end"] = training_state(learner)
    resumed["modules"] = sorted(learner.module.keys())
    return {"continuous": record, "resumed": resumed}


def test_modules_added_and_removed_mid_fit_on_fsdp_ranks_are_sharded_trained_and_restored_on_resume(fsdp_runs):
    root, ranks = fsdp_runs
    tmp_path = root / "modules"
    rank0, rank1 = (rank["modules"] for rank in ranks)
    run = rank0["continuous"]
    for key in ("start", "at_add", "before_remove", "after_remove", "end_of_epoch_0", "end"):
        # The ranks hold one model (the 0-d log_alphas, whole on each rank, included).
        assert_states_close(rank1["continuous"][key], run[key], f"rank 1, {key}", trained=key != "start")

    # The added module is sharded like the others (but its 0-d log_alpha), and has its own three optimizers.
    assert run["new_not_sharded"] == ["log_alpha"]
    assert run["optimizers_after_add"] == [
        f"{m}_{o}" for m in ("a", "frozen", "new") for o in ("alpha", "policy", "qf")
    ]
    # Each rank built it from its own seed; every rank holds rank 0's, as DDP would have broadcast it.
    torch.manual_seed(NEW_MODULE_SEED)
    built_on_rank_0 = SACModule(OBS, BOX, {"fcnet_hiddens": [16]}).state_dict()
    added = module_weights(run["at_add"], "new")
    assert added.keys() == built_on_rank_0.keys()
    for name, value in built_on_rank_0.items():
        if name != "log_alpha":  # set from initial_alpha by its optimizers' setup
            np.testing.assert_array_equal(added[name], value.numpy(), err_msg=name)
    # It is trained from the next item on, with its own optimizers; "frozen" stays bit for bit as it started.
    trained = module_weights(run["end_of_epoch_0"], "new")
    assert all(not np.array_equal(trained[name], value) for name, value in added.items())
    assert run["end_of_epoch_0"]["/optimizer/optimizers/new_qf/state/0/step"] == 2 * 2  # 2 items x 2 minibatches
    frozen = module_weights(run["start"], "frozen")
    assert frozen
    for name, value in frozen.items():
        np.testing.assert_array_equal(module_weights(run["before_remove"], "frozen")[name], value, err_msg=name)

    # remove_module: the other modules keep their weights and optimizer states, and train on.
    kept = {key: value for key, value in run["before_remove"].items() if "frozen" not in key}
    assert_states_close(run["after_remove"], kept, "after remove_module")
    assert run["modules"] == ["a", "new"]
    assert run["optimizers"] == [f"{m}_{o}" for m in ("a", "new") for o in ("alpha", "policy", "qf")]
    for module_id in ("a", "new"):
        after, end = module_weights(run["after_remove"], module_id), module_weights(run["end"], module_id)
        assert any(not np.array_equal(end[name], value) for name, value in after.items()), module_id

    # The checkpoint written after the add restores "new" into a fresh Learner on fsdp2 ranks (its weights and
    # optimizer states), which then ends exactly where the uninterrupted fit ends.
    for rank in (rank0, rank1):
        resumed = rank["resumed"]
        assert "at_add" not in resumed  # the resumed fit starts after the add, with "new" from the checkpoint
        assert_states_close(resumed["start"], run["end_of_epoch_0"], "restored")
        assert resumed["modules"] == ["a", "new"]
        assert_states_close(resumed["end"], run["end"], "resumed", atol=1e-6)
    # In one process too, with the added module.
    loaded = Learner.from_checkpoint(str(tmp_path / "continuous" / "epoch=0.ckpt"))
    assert sorted(loaded.module.keys()) == ["a", "frozen", "new"]
    assert_states_close(training_state(loaded), run["end_of_epoch_0"], "one process")
    # The file holds plain tensors only: "a" (31 weights, Adam states of 19 parameters), "frozen" (31 weights,
    # never stepped) and "new" (21 weights, Adam states of 13 parameters).
    assert assert_plain_tensors_only(tmp_path / "continuous" / "epoch=0.ckpt") >= (31 + 3 * 19) + 31 + (21 + 3 * 13)


# ---- 3. The command line: --trainer.strategy fsdp2 ------------------------------------------------------------------

CARTPOLE = str(REPO / "examples" / "ppo_cartpole.yaml")
# Flags that shrink the example to one rollout of 8 envs x 32 steps per rank, in seconds.
QUICK = {
    "trainer.enable_progress_bar": "false", "data.init_args.max_env_steps": "512",
    "data.init_args.rollouts_per_epoch": "1", "data.init_args.evaluation_num_episodes": "2",
    "model.init_args.num_epochs": "1",
}  # fmt: skip


def test_the_command_line_takes_fsdp2_as_a_strategy_name_for_two_cpu_ranks(tmp_path):
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

    from lightning_rl import FSDP2Strategy
    from lightning_rl.cli import LightningRLCLI

    flags = ["--trainer.strategy", "fsdp2", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
    cli = LightningRLCLI(args=["--config", CARTPOLE, *flags, "--trainer.default_root_dir", str(tmp_path)], run=False)
    # The name resolves through Lightning's StrategyRegistry; fit would start rank 1 by running the command again.
    assert type(cli.trainer.strategy) is FSDP2Strategy
    assert cli.trainer.strategy.num_processes == 2
    assert isinstance(cli.trainer.strategy.launcher, _SubprocessScriptLauncher)


@pytest.mark.slow
def test_the_command_line_fits_on_two_fsdp_cpu_ranks_and_writes_a_checkpoint_that_loads_anywhere(tmp_path):
    """``lightning-rl fit ... --trainer.strategy fsdp2 --trainer.devices 2``: Lightning starts rank 1 by running the
    same command again; the modules are sharded, and the checkpoint holds whole, plain tensors."""
    flags = {**QUICK, "trainer.strategy": "fsdp2", "trainer.devices": "2", "trainer.accelerator": "cpu"}
    args = [
        sys.executable,
        "-m",
        "lightning_rl",
        "fit",
        "--config",
        CARTPOLE,
        "--trainer.default_root_dir",
        str(tmp_path),
    ]
    args += [f"--{key}={value}" for key, value in flags.items()]
    # This checkout's package, in both ranks (Lightning's relaunch inherits the environment).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "All distributed processes registered. Starting with 2 processes" in output
    assert "FSDPMultiRLModule" in output  # the model summary names the sharded unit fully_shard made

    checkpoint = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert assert_plain_tensors_only(checkpoint) > 0
    content = torch.load(checkpoint, weights_only=True)
    assert content["OnPolicyDataModule"]["num_env_steps_sampled_lifetime"] == 512  # both ranks sampled
    learner = Learner.from_checkpoint(str(checkpoint))
    for name, value in learner.state_dict().items():
        torch.testing.assert_close(value, content["state_dict"][name], rtol=0, atol=0)
    actions = Policy.from_checkpoint(str(checkpoint)).act(np.zeros((3, 4), np.float32))
    assert actions.shape == (3,) and set(actions.tolist()) <= {0, 1}
