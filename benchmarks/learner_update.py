"""Update throughput of a BC Learner versus a hand-written PyTorch loop.

What it measures: the time of one *update* (``--epochs`` passes over a ``--batch-size``-row
batch in shuffled minibatches of ``--minibatch-size`` rows, one Adam step with global-norm
gradient clipping (0.5) per minibatch) and the throughput in samples/s
(= epochs x rows / seconds), for three variants doing the same work:

  (a) hand-written  a plain PyTorch loop over the same network, loss, optimizer and clipping;
  (b) learner       ``BCLearner.update_from_batch(...)``, standalone (no Trainer);
  (c) trainer       the same Learner under ``lightning.Trainer.fit``, one update per
                    dataloader item; timed from ``on_train_batch_start`` to
                    ``on_train_batch_end`` (``training_step`` with Lightning's manual
                    optimization and logging around it; data loading is excluded);
  (d) graphs        with ``--cuda-graphs`` (GPU only): (b) with ``BCLearner(cuda_graphs=True)``,
                    each minibatch step replayed from a CUDA graph (captured in the warm-up).

The model is BCModule's for the observations ``--observations`` picks, with Discrete actions:

  vector   CartPole-like Box(4,) float32 observations, 2 actions: Linear(4, h1), tanh, ...,
           Linear(h_last, 2) (the default);
  atari    four stacked 84x84 grayscale frames, uint8 ``[B, 4, 84, 84]`` (what gymnasium's
           ``AtariPreprocessing`` + ``FrameStackObservation`` give), 6 actions: the Nature CNN,
           then the ReLU ``--hiddens`` layers, as CleanRL's Atari agent;
  minatar  MinAtar's bool planes ``[B, 10, 10, 4]`` (channels last), 3 actions: one 3x3
           convolution of 16 filters, then the ReLU ``--hiddens`` layers.

The hand-written images are scaled on the device as CleanRL does (``x / 255.0`` in the
forward pass; bool planes to floats, channels moved first); ours go through the module's
observation encoder (``lightning_rl.core.encoders``), which does the same. The loss is the
negative mean log-probability of the actions under ``Categorical(logits)``.

All three run in one process, interleaved update by update inside one ``Trainer.fit`` of
``--repeats`` + 1 items (the first is a warm-up): before each of the Trainer's updates a
callback times one update of (a) and one of (b). On a shared machine the speed of the same
loop drifts by +-25% over seconds, so each round's ratio (a)/(b) and (a)/(c) is taken under
the same conditions and the verdict uses the median of these paired ratios.

Run::

    python benchmarks/learner_update.py                      # defaults: 20 rounds, 1 thread
    python benchmarks/learner_update.py --repeats 3 --threads 2
    python benchmarks/learner_update.py --device cuda         # if a GPU is available
    python benchmarks/learner_update.py --device cuda --cuda-graphs   # adds (d)
    python benchmarks/learner_update.py --observations atari --batch-size 1024 --minibatch-size 256 \
        --epochs 4 --hiddens 512 --device cuda                # CNN on uint8 frames
"""

from __future__ import annotations

import argparse
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import lightning
import numpy as np
import torch
import torch.distributions as D
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from lightning_rl import ALL_MODULES, Columns, RLModuleSpec
from lightning_rl.algorithms.bc import BCLearner, BCModule
from lightning_rl.learner.result_keys import NUM_ENV_STEPS_TRAINED

# A sibling module: this directory is on sys.path when a benchmark runs as a script.
from _paired import print_paired_table

OBS_DIM = 4
# Per --observations: (observation space, number of actions, the hand-written CNN's convolutions
# [out_channels, kernel, stride], whether its images are channels-last).
OBSERVATIONS: dict[str, tuple[gym.spaces.Box, int, list[list[int]], bool]] = {
    "vector": (gym.spaces.Box(-1.0, 1.0, (OBS_DIM,)), 2, [], False),
    "atari": (gym.spaces.Box(0, 255, (4, 84, 84), "uint8"), 6, [[32, 8, 4], [64, 4, 2], [64, 3, 1]], False),
    "minatar": (gym.spaces.Box(0, 1, (10, 10, 4), bool), 3, [[16, 3, 1]], True),
}
LR = 3e-4
GRAD_CLIP = 0.5
TARGET_RATIO = 0.95  # issue 18: the Learner, standalone and under Trainer.fit, at >= 0.95x the hand-written loop
GRAPHS_TARGET_RATIO = 2.0  # issue 31: with CUDA graphs, >= 2x the hand-written eager loop (MLP [256, 256])


# ----------------------------------------------------------------------------------------
# Setup shared by all variants
# ----------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=4000, help="rows per update")
    parser.add_argument("--minibatch-size", type=int, default=128, help="rows per gradient step")
    parser.add_argument("--epochs", type=int, default=10, help="passes over the batch per update")
    parser.add_argument("--hiddens", type=int, nargs="+", default=[256, 256], help="hidden layer sizes")
    parser.add_argument("--repeats", type=int, default=20, help="timed rounds (one update of each variant per round)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--observations", choices=list(OBSERVATIONS), default="vector", help="see above")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cuda-graphs", action="store_true", help="add (d): the Learner with cuda_graphs=True")
    return parser.parse_args()


def make_batch(batch_size: int, device: torch.device, seed: int, observations: str) -> dict[str, torch.Tensor]:
    """A fixed random BC batch: observations of ``observations``' space in its dtype, int64 actions [B]."""
    space, num_actions, _, _ = OBSERVATIONS[observations]
    generator = torch.Generator().manual_seed(seed)
    if observations == "vector":
        obs = torch.randn(batch_size, OBS_DIM, generator=generator)
    elif space.dtype == bool:
        obs = torch.rand(batch_size, *space.shape, generator=generator) < 0.1
    else:
        obs = torch.randint(0, 256, (batch_size, *space.shape), generator=generator, dtype=torch.uint8)
    actions = torch.randint(0, num_actions, (batch_size,), generator=generator)
    return {Columns.OBS: obs.to(device), Columns.ACTIONS: actions.to(device)}


def module_spec(hiddens: list[int], observations: str) -> RLModuleSpec:
    space, num_actions, conv_filters, _ = OBSERVATIONS[observations]
    if observations == "vector":
        model_config: dict[str, Any] = {"fcnet_hiddens": list(hiddens), "fcnet_activation": "tanh"}
    else:
        model_config = {"conv_filters": conv_filters, "fcnet_hiddens": list(hiddens), "fcnet_activation": "relu"}
    return RLModuleSpec(
        module_class=BCModule,
        observation_space=space,
        action_space=gym.spaces.Discrete(num_actions),
        model_config=model_config,
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
    """The same network, BC loss, Adam and global-norm clipping, as a plain loop."""

    def __init__(self, hiddens: list[int], device: torch.device, seed: int, observations: str) -> None:
        torch.manual_seed(seed)
        space, num_actions, conv_filters, self.channels_last = OBSERVATIONS[observations]
        self.scale = 255.0 if space.dtype == np.uint8 else 1.0
        layers: list[nn.Module] = []
        if observations == "vector":
            in_dim, activation = OBS_DIM, nn.Tanh
        else:
            channels, height, width = space.shape[-1:] + space.shape[:-1] if self.channels_last else space.shape
            for out_channels, kernel, stride in conv_filters:
                layers += [nn.Conv2d(channels, out_channels, kernel, stride), nn.ReLU()]
                channels, height, width = out_channels, (height - kernel) // stride + 1, (width - kernel) // stride + 1
            layers.append(nn.Flatten())
            in_dim, activation = channels * height * width, nn.ReLU
        for size in hiddens:
            layers += [nn.Linear(in_dim, size), activation()]
            in_dim = size
        layers.append(nn.Linear(in_dim, num_actions))
        self.model = nn.Sequential(*layers).to(device)
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=LR)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits; images scaled on the device, as CleanRL's ``self.network(x / 255.0)``."""
        if obs.dim() > 2:
            obs = obs.float() / self.scale
            if self.channels_last:
                obs = obs.permute(0, 3, 1, 2)
        return self.model(obs)

    def update(self, batch: dict[str, torch.Tensor], *, num_epochs: int, minibatch_size: int) -> tuple[list[int], int]:
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
                logits = self.forward(obs[index])
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


def make_learner(
    hiddens: list[int], device: torch.device, seed: int, args: argparse.Namespace, cuda_graphs: bool = False
) -> BCLearner:
    torch.manual_seed(seed)
    learner = BCLearner(
        module_spec=module_spec(hiddens, args.observations),
        lr=LR,
        grad_clip=GRAD_CLIP,
        grad_clip_by="global_norm",
        num_epochs=args.epochs,
        minibatch_size=args.minibatch_size,
        shuffle_batch_per_epoch=True,
        cuda_graphs=cuda_graphs,
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


class InterleavedTimer(lightning.Callback):
    """Times (a), (b), (c) (and (d)) in turn, one update each per training batch of one ``Trainer.fit``.

    Around each of the Trainer's updates (timed from ``on_train_batch_start`` to
    ``on_train_batch_end``) it runs one update of the hand-written loop and one of each
    standalone Learner. Interleaving update by update keeps them under the same machine
    conditions; the first round is a warm-up and not recorded.
    """

    def __init__(self, runs: dict[str, Callable[[], Any]], device: torch.device, samples: int) -> None:
        self.runs = runs
        self.device = device
        self.samples = samples
        self.seconds: dict[str, list[float]] = {name: [] for name in [*runs, "trainer"]}
        self._start = 0.0

    def on_train_batch_start(self, trainer: lightning.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx % 2 == 0:
            self._run_standalone_pair(batch_idx)
        synchronize(self.device)
        self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: lightning.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        synchronize(self.device)
        seconds = time.perf_counter() - self._start
        trained = float(trainer.callback_metrics[f"{ALL_MODULES}/{NUM_ENV_STEPS_TRAINED}"])
        assert trained == self.samples, trained  # the Trainer's update did the same work
        if batch_idx > 0:
            self.seconds["trainer"].append(seconds)
        if batch_idx % 2 == 1:
            self._run_standalone_pair(batch_idx)

    def _run_standalone_pair(self, batch_idx: int) -> None:
        # Rounds alternate the order (a, b) / (b, a) and whether the pair runs before or after
        # (c), so no variant always inherits the caches of another.
        names = list(self.runs) if batch_idx % 4 < 2 else list(reversed(self.runs))
        for name in names:
            seconds = time_call(self.runs[name], self.device)
            if batch_idx > 0:
                self.seconds[name].append(seconds)


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
        f"repeats={args.repeats}; observations={args.observations} {OBSERVATIONS[args.observations][0]}"
    )

    batch = make_batch(args.batch_size, device, args.seed, args.observations)
    update_kwargs = dict(num_epochs=args.epochs, minibatch_size=args.minibatch_size)

    # Build each variant and check that each does the same work.
    hand = HandWritten(args.hiddens, device, args.seed, args.observations)
    sizes, total = hand.update(batch, **update_kwargs)
    assert len(sizes) == per_epoch and sizes[-1] == last_rows and total == samples, (sizes, total)
    learner = make_learner(args.hiddens, device, args.seed, args)
    learner.build()
    results = learner.update_from_batch(batch, **update_kwargs, shuffle_batch_per_epoch=True)
    assert results[ALL_MODULES][NUM_ENV_STEPS_TRAINED] == samples, results[ALL_MODULES]
    assert results[ALL_MODULES]["weights_seq_no"] == args.epochs * per_epoch  # one optimizer step per minibatch

    runs = {
        "hand-written": lambda: hand.update(batch, **update_kwargs),
        "learner": lambda: learner.update_from_batch(batch, **update_kwargs, shuffle_batch_per_epoch=True),
    }
    if args.cuda_graphs:
        if device.type != "cuda":
            raise SystemExit("--cuda-graphs needs --device cuda (and a GPU)")
        graphed = make_learner(args.hiddens, device, args.seed, args, cuda_graphs=True)
        graphed.build()
        for _ in range(2):  # warm-up eager steps and the captures of both minibatch shapes
            results = graphed.update_from_batch(batch, **update_kwargs, shuffle_batch_per_epoch=True)
        assert results[ALL_MODULES][NUM_ENV_STEPS_TRAINED] == samples, results[ALL_MODULES]
        runs["graphs"] = lambda: graphed.update_from_batch(batch, **update_kwargs, shuffle_batch_per_epoch=True)
    timer = InterleavedTimer(runs, device=device, samples=samples)
    trainer = lightning.Trainer(
        max_epochs=1,  # bounded by the dataloader: in manual optimization global_step counts optimizer steps
        logger=False,
        log_every_n_steps=1,  # (c) pays for logging every result, and the check below reads one each update
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        callbacks=[timer],
    )
    loader = DataLoader(RepeatBatch(batch, args.repeats + 1), batch_size=None)
    trainer.fit(make_learner(args.hiddens, device, args.seed, args), train_dataloaders=loader)

    labels = {
        "hand-written": "(a) hand-written loop",
        "learner": "(b) Learner.update_from_batch",
        "trainer": "(c) Learner under Trainer.fit",
        "graphs": "(d) Learner, cuda_graphs=True",
    }
    labels = {name: label for name, label in labels.items() if name in timer.seconds}
    print("each round times one update of (a), (b) and (c) in a rotating order, inside one Trainer.fit")
    print("paired = median over rounds of (a)'s time / the variant's time in the same round [10th-90th percentile]")
    paired = print_paired_table(timer.seconds, labels, baseline="hand-written", work=samples, unit="samples/s")
    verdict = "PASS" if all(paired[name] >= TARGET_RATIO for name in ("learner", "trainer")) else "FAIL"
    print(
        f"verdict: {verdict} (target: paired >= {TARGET_RATIO:.2f}x of hand-written): "
        + ", ".join(f"{name} {paired[name]:.2f}x" for name in ("learner", "trainer"))
    )
    if "graphs" in paired:
        verdict = "PASS" if paired["graphs"] >= GRAPHS_TARGET_RATIO else "FAIL"
        print(
            f"graphs verdict: {verdict} (target: >= {GRAPHS_TARGET_RATIO:.1f}x of hand-written): {paired['graphs']:.2f}x"
        )


if __name__ == "__main__":
    main()
