"""Update throughput of a BC Learner versus a hand-written PyTorch loop.

What it measures: the time of one *update* (``--epochs`` passes over a ``--batch-size``-row
batch in shuffled minibatches of ``--minibatch-size`` rows, one Adam step with global-norm
gradient clipping (0.5) per minibatch) and the throughput in samples/s
(= epochs x rows / seconds), for three variants doing the same work:

  (a) hand-written  a plain PyTorch loop over the same MLP, loss, optimizer and clipping;
  (b) learner       ``BCLearner.update_from_batch(...)``, standalone (no Trainer);
  (c) trainer       the same Learner under ``lightning.Trainer.fit``, one update per
                    dataloader item; timed by a Callback from ``on_train_batch_start`` to
                    ``on_train_batch_end`` (i.e. ``training_step`` and Lightning's manual
                    optimization around it; data loading and fit start-up are excluded).

The model is BCModule's MLP for CartPole-like spaces (Box(4,) observations, Discrete(2)
actions): Linear(4, h1), tanh, ..., Linear(h_last, 2). The loss is the negative mean
log-probability of the actions under ``Categorical(logits)``.

Each variant is warmed up with one update, then the variants are timed in interleaved order
(a, b, c, a, b, c, ...) ``--repeats`` times. The table shows the best (minimum) time of each
variant, as ``timeit`` does: on a shared machine other processes only ever add time, so the
minimum is the steadiest estimate of the work itself; the medians are printed beside it.
Each Trainer repeat is a fresh ``Trainer.fit`` over two items, of which only the second is timed.

Run::

    python benchmarks/learner_update.py                      # defaults: 9 repeats, 1 thread
    python benchmarks/learner_update.py --repeats 3 --threads 2
    python benchmarks/learner_update.py --device cuda         # if a GPU is available
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import lightning
import torch
import torch.distributions as D
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from lightning_rl import ALL_MODULES, Columns, RLModuleSpec
from lightning_rl.algorithms.bc import BCLearner, BCModule
from lightning_rl.core.learner import NUM_ENV_STEPS_TRAINED

OBS_DIM = 4
NUM_ACTIONS = 2
LR = 3e-4
GRAD_CLIP = 0.5
TARGET_RATIO = 0.90


# ----------------------------------------------------------------------------------------
# Setup shared by all variants
# ----------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=4000, help="rows per update")
    parser.add_argument("--minibatch-size", type=int, default=128, help="rows per gradient step")
    parser.add_argument("--epochs", type=int, default=10, help="passes over the batch per update")
    parser.add_argument("--hiddens", type=int, nargs="+", default=[256, 256], help="hidden layer sizes")
    parser.add_argument("--repeats", type=int, default=9, help="timed updates per variant (best reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def make_batch(batch_size: int, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    """A fixed random BC batch: float32 observations [B, 4] and int64 actions [B]."""
    generator = torch.Generator().manual_seed(seed)
    obs = torch.randn(batch_size, OBS_DIM, generator=generator)
    actions = torch.randint(0, NUM_ACTIONS, (batch_size,), generator=generator)
    return {Columns.OBS: obs.to(device), Columns.ACTIONS: actions.to(device)}


def module_spec(hiddens: list[int]) -> RLModuleSpec:
    return RLModuleSpec(
        module_class=BCModule,
        observation_space=gym.spaces.Box(-1.0, 1.0, (OBS_DIM,)),
        action_space=gym.spaces.Discrete(NUM_ACTIONS),
        model_config={"fcnet_hiddens": list(hiddens), "fcnet_activation": "tanh"},
    )


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so the clock measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def expected_minibatches(batch_size: int, minibatch_size: int) -> tuple[int, int]:
    """(minibatches per epoch, rows of the last one): e.g. 4000/128 -> (32, 32)."""
    count = math.ceil(batch_size / minibatch_size)
    return count, batch_size - (count - 1) * minibatch_size


# ----------------------------------------------------------------------------------------
# (a) Hand-written PyTorch loop
# ----------------------------------------------------------------------------------------


class HandWritten:
    """The same MLP, BC loss, Adam and global-norm clipping, as a plain loop."""

    def __init__(self, hiddens: list[int], device: torch.device, seed: int) -> None:
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        in_dim = OBS_DIM
        for size in hiddens:
            layers += [nn.Linear(in_dim, size), nn.Tanh()]
            in_dim = size
        layers.append(nn.Linear(in_dim, NUM_ACTIONS))
        self.model = nn.Sequential(*layers).to(device)
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=LR)

    def update(
        self, batch: dict[str, torch.Tensor], *, num_epochs: int, minibatch_size: int
    ) -> tuple[list[int], int]:
        """One update; returns (rows of each minibatch of the last epoch, total rows)."""
        obs, actions = batch[Columns.OBS], batch[Columns.ACTIONS]
        rows = len(obs)
        total = 0
        sizes: list[int] = []
        for _ in range(num_epochs):
            order = torch.randperm(rows, device=obs.device)
            sizes = []
            for start in range(0, rows, minibatch_size):
                index = order[start : start + minibatch_size]
                logits = self.model(obs[index])
                dist = D.Categorical(logits=logits, validate_args=False)
                loss = -dist.log_prob(actions[index]).mean()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.params, GRAD_CLIP)
                self.optimizer.step()
                sizes.append(len(index))
                total += len(index)
        return sizes, total


# ----------------------------------------------------------------------------------------
# (b) Learner standalone, (c) Learner under a Trainer
# ----------------------------------------------------------------------------------------


def make_learner(hiddens: list[int], device: torch.device, seed: int, args: argparse.Namespace) -> BCLearner:
    torch.manual_seed(seed)
    learner = BCLearner(
        module_spec=module_spec(hiddens),
        lr=LR,
        grad_clip=GRAD_CLIP,
        grad_clip_by="global_norm",
        num_epochs=args.epochs,
        minibatch_size=args.minibatch_size,
        shuffle_batch_per_epoch=True,
    )
    return learner.to(device)


class RepeatBatch(IterableDataset):
    """Yields the same batch dict ``num_items`` times."""

    def __init__(self, batch: dict[str, torch.Tensor], num_items: int) -> None:
        self.batch = batch
        self.num_items = num_items

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for _ in range(self.num_items):
            yield self.batch


class UpdateTimer(lightning.Callback):
    """Times each training batch (one Learner update) and checks the rows it trained."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: list[float] = []
        self.env_steps: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer: lightning.Trainer, *args: Any) -> None:
        synchronize(self.device)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: lightning.Trainer, *args: Any) -> None:
        synchronize(self.device)
        self.seconds.append(time.perf_counter() - self._start)
        self.env_steps.append(float(trainer.callback_metrics[f"{ALL_MODULES}/{NUM_ENV_STEPS_TRAINED}"]))


def fit_once(learner: BCLearner, batch: dict[str, torch.Tensor], num_items: int, device: torch.device) -> UpdateTimer:
    """``Trainer.fit`` over ``num_items`` copies of ``batch``; returns the timings per item."""
    timer = UpdateTimer(device)
    trainer = lightning.Trainer(
        max_epochs=1,  # bounded by the dataloader: global_step counts optimizer steps here
        max_steps=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        callbacks=[timer],
    )
    loader = DataLoader(RepeatBatch(batch, num_items), batch_size=None)
    trainer.fit(learner, train_dataloaders=loader)
    return timer


# ----------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------


def time_call(fn: Callable[[], Any], device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA requested but not available; using the CPU")
        args.device = "cpu"
    device = torch.device(args.device)
    samples = args.epochs * args.batch_size
    per_epoch, last_rows = expected_minibatches(args.batch_size, args.minibatch_size)
    print(
        f"torch {torch.__version__}, lightning {lightning.__version__}, device={device}, "
        f"threads={torch.get_num_threads()}"
    )
    print(
        f"batch={args.batch_size} minibatch={args.minibatch_size} epochs={args.epochs} hiddens={args.hiddens} "
        f"-> {per_epoch} minibatches/epoch (last of {last_rows} rows), {samples} samples/update; "
        f"repeats={args.repeats} (best and median)"
    )

    batch = make_batch(args.batch_size, device, args.seed)
    update_kwargs = dict(num_epochs=args.epochs, minibatch_size=args.minibatch_size)

    # Build and warm up each variant with one update, checking that each does the same work.
    hand = HandWritten(args.hiddens, device, args.seed)
    sizes, total = hand.update(batch, **update_kwargs)
    assert len(sizes) == per_epoch and sizes[-1] == last_rows and total == samples, (sizes, total)

    learner = make_learner(args.hiddens, device, args.seed, args)
    learner.build()
    results = learner.update_from_batch(batch, **update_kwargs, shuffle_batch_per_epoch=True)
    assert results[ALL_MODULES][NUM_ENV_STEPS_TRAINED] == samples, results[ALL_MODULES]
    assert results[ALL_MODULES]["weights_seq_no"] == args.epochs * per_epoch  # one optimizer step per minibatch

    trainer_learner = make_learner(args.hiddens, device, args.seed, args)
    warm = fit_once(trainer_learner, batch, 1, device)
    assert warm.env_steps == [samples], warm.env_steps

    # Interleaved timed repeats: a, b, c, a, b, c, ...
    timings: dict[str, list[float]] = {"hand-written": [], "learner": [], "trainer": []}
    for _ in range(args.repeats):
        timings["hand-written"].append(time_call(lambda: hand.update(batch, **update_kwargs), device))
        timings["learner"].append(
            time_call(lambda: learner.update_from_batch(batch, **update_kwargs, shuffle_batch_per_epoch=True), device)
        )
        timer = fit_once(trainer_learner, batch, 2, device)
        assert timer.env_steps == [samples, samples], timer.env_steps
        timings["trainer"].append(timer.seconds[1])  # the first item of each fit is its warm-up

    labels = {
        "hand-written": "(a) hand-written loop",
        "learner": "(b) Learner.update_from_batch",
        "trainer": "(c) Learner under Trainer.fit",
    }
    best = {name: min(seconds) for name, seconds in timings.items()}
    median = {name: statistics.median(seconds) for name, seconds in timings.items()}
    print("(c) is timed by a Callback, on_train_batch_start -> on_train_batch_end, 2nd item of each fit")
    print(f"{'variant':<32}{'best s/update':>14}{'samples/s':>12}{'vs (a)':>8}{'median s':>10}{'vs (a)':>8}")
    for name in timings:
        print(
            f"{labels[name]:<32}{best[name]:>14.4f}{samples / best[name]:>12,.0f}"
            f"{best['hand-written'] / best[name]:>7.2f}x{median[name]:>10.4f}"
            f"{median['hand-written'] / median[name]:>7.2f}x"
        )
    ratios = {name: best["hand-written"] / best[name] for name in ("learner", "trainer")}
    verdict = "PASS" if all(r >= TARGET_RATIO for r in ratios.values()) else "FAIL"
    print(
        f"verdict (best times): {verdict} (target >= {TARGET_RATIO:.2f}x of hand-written): "
        + ", ".join(f"{name} {ratio:.2f}x {'ok' if ratio >= TARGET_RATIO else 'below'}" for name, ratio in ratios.items())
    )


if __name__ == "__main__":
    main()
