"""``RankedDataModule``: what every data module here shares across data-parallel ranks.

Under a data-parallel strategy each rank runs its own copy of the data module. Every family
(the environment data modules, the multi-agent one, the offline one) needs the same few
things for that, and this base holds them once:

- **Placement**: which rank this is and how many there are (``(0, 1)`` without a Trainer).
- **Seeds**: one base seed, and each rank's seeds set apart from the other ranks' by
  ``RANK_SEED_STRIDE`` (``rank_seed``), the evaluation envs' by ``EVALUATION_SEED_OFFSET``.
- **Rank statistics**: one small vector per rank, gathered on every rank (``_gather``).
- **The env-step budget**: ``max_env_steps`` over all ranks and the whole run ends every
  rank's fit after the same rollout (``_rollouts_left``, ``Rollouts``).
- **Evaluation**: each rank plays an equal share of ``evaluation_num_episodes``.
- **Stopping on SIGTERM while sampling waits** (``stop_if_sigterm_received``): Lightning's
  SIGTERM handler only notes the signal, and the fit stops after the current step; a data
  module that waits for envs elsewhere (worker processes, samplers) calls this while it waits,
  so a scheduler's stop ends the fit at once, not when the wait times out.
- **The data contract** (``lightning_rl.core.data_contract``): every data module here is a
  ``DataSource``; a subclass says what it offers (``data_offer``) and, if it needs them, takes
  the Learner's requirements (``accept_requirements``).

A subclass says how many env steps it sampled over all ranks
(``num_env_steps_sampled_lifetime``, the counter its checkpoint state carries) and, if it
samples rollouts, how many env steps one rollout takes on a rank (``env_steps_per_rollout``).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_rl.core.arguments import check_int, check_num_envs
from lightning_rl.core.data_contract import DataOffer, DataRequirements
from lightning_rl.core.train_item import TrainItem
from lightning_rl.data.rank_stats import all_gather_rows, trainer_placement

# Evaluation envs are seeded apart from the training envs, so evaluation never replays the
# exact episodes the policy trained on.
EVALUATION_SEED_OFFSET = 1_000_003
# Rank r adds r * this to each of its seeds. A runner's later resets move on by num_envs seeds
# each, so ranks would meet only after ~10M / num_envs resets.
RANK_SEED_STRIDE = 10_000_000


def draw_base_seed() -> int:
    """A base seed from numpy's global generator (``seed_everything`` seeds it alike on every rank).

    Below ``2**31 - 1 - EVALUATION_SEED_OFFSET``, so that rank 0's seeds stay 32-bit ints.
    """
    return int(np.random.randint(0, 2**31 - 1 - EVALUATION_SEED_OFFSET))


class RankedDataModule(LightningDataModule, abc.ABC):
    """The base of the data modules: placement, seeds, rank statistics, the env-step budget.

    Args:
        seed: The base seed, an int >= 0; ``None`` draws one (``draw_base_seed``) on first use.
        evaluation_num_episodes: Complete episodes per evaluation, over all ranks.
        evaluation_num_envs: Evaluation envs stepped together on a rank; ``None`` for the
            subclass's default.

    Raises:
        ValueError: Naming the argument, for a value out of its range.
    """

    def __init__(self, *, seed: int | None, evaluation_num_episodes: int, evaluation_num_envs: int | None) -> None:
        super().__init__()
        check_int("seed", seed, minimum=0, optional=True)
        check_int("evaluation_num_episodes", evaluation_num_episodes)
        check_num_envs("evaluation_num_envs", evaluation_num_envs, optional=True)
        self._base_seed = seed

    # ------------------------------------------------------------------------------------
    # What a subclass defines
    # ------------------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps (or dataset rows) trained on so far, summed over all ranks, resumed runs included."""

    @property
    def env_steps_per_rollout(self) -> int:
        """Env steps one train item samples on one rank (for the budget of data modules that sample rollouts)."""
        raise NotImplementedError(f"{type(self).__name__} samples no rollouts")

    # ------------------------------------------------------------------------------------
    # Placement, seeds and rank statistics
    # ------------------------------------------------------------------------------------

    def placement(self) -> tuple[int, int]:
        """(global rank, world size) of the attached Trainer; (0, 1) without one."""
        return trainer_placement(self.trainer)

    @property
    def base_seed(self) -> int:
        """The seed every rank's seeds derive from (drawn on first use when ``seed=None``)."""
        if self._base_seed is None:
            self._base_seed = draw_base_seed()
        return self._base_seed

    def rank_seed(self, offset: int) -> int:
        """``base seed + offset + rank * RANK_SEED_STRIDE``: a seed of this rank's own for one purpose.

        Args:
            offset: Keeps purposes apart (0 for the training envs, ``EVALUATION_SEED_OFFSET``
                for the evaluation envs; data modules pick their own for what else they seed).
        """
        return self.base_seed + offset + self.placement()[0] * RANK_SEED_STRIDE

    def stop_if_sigterm_received(self) -> None:
        """Raise Lightning's stop once the attached Trainer received SIGTERM; call it while waiting for envs.

        Lightning's handler only notes the signal and stops the fit at the end of the step: a
        rollout waiting on a hung env (until ``sample_timeout_s``) would keep the fit that long.

        Raises:
            SIGTERMException: If the Trainer received SIGTERM (Lightning ends the fit on it).
        """
        trainer = self.trainer
        if trainer is not None and trainer.received_sigterm:
            raise SIGTERMException

    def _gather(self, local: np.ndarray) -> np.ndarray:
        """Every rank's ``local`` vector, ``[world_size, len(local)]``, in rank order (a collective call)."""
        world_size = self.placement()[1]
        device = self.trainer.strategy.root_device if world_size > 1 else "cpu"
        return all_gather_rows(local, world_size, device)

    @property
    def evaluation_episodes_per_rank(self) -> int:
        """Evaluation episodes this rank plays: ``ceil(evaluation_num_episodes / world_size)``."""
        return -(-self.hparams.evaluation_num_episodes // self.placement()[1])

    # ------------------------------------------------------------------------------------
    # The env-step budget and the loaders
    # ------------------------------------------------------------------------------------

    def _rollouts_left(self) -> int:
        """Rollouts in the next epoch: ``rollouts_per_epoch``, fewer when ``max_env_steps`` nears.

        The same on every rank: the budget and the counter are global, and each rollout
        samples ``world_size * env_steps_per_rollout`` env steps over all ranks.
        """
        if self.hparams.max_env_steps is None:
            return self.hparams.rollouts_per_epoch
        remaining = self.hparams.max_env_steps - self.num_env_steps_sampled_lifetime
        per_rollout = self.env_steps_per_rollout * self.placement()[1]
        return max(0, min(self.hparams.rollouts_per_epoch, math.ceil(remaining / per_rollout)))

    @abc.abstractmethod
    def data_offer(self) -> DataOffer:
        """What this data module offers the Learner: the source its items hold, its train batch, the spaces."""

    def accept_requirements(self, requirements: DataRequirements) -> None:
        """Take the Learner's requirements, after it was built; by default nothing to settle (the rollouts meet them).

        Args:
            requirements: The Learner's ``data_requirements()``.
        """

    def train_dataloader(self) -> Iterable[TrainItem]:
        """One epoch of train items, each sampled when Lightning asks for it (a sized iterable: no prefetch)."""
        return Rollouts(self)

    def val_dataloader(self) -> Iterable[TrainItem]:
        """One evaluation item: this rank's share of the evaluation episodes."""
        return EvaluationIterable(self)


class Rollouts:
    """A sized iterable of train items (sized, so Lightning does not prefetch one).

    ``datamodule`` is a ``RankedDataModule`` with ``sample_train_item()``, ``rollouts_per_epoch``
    and ``max_env_steps`` hyperparameters.
    """

    def __init__(self, datamodule: RankedDataModule) -> None:
        self.datamodule = datamodule
        self.length = datamodule._rollouts_left()

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[TrainItem]:
        datamodule = self.datamodule
        for _ in range(self.length):
            item = datamodule.sample_train_item()
            budget = datamodule.hparams.max_env_steps
            # The counter is the global one, equal on every rank: all ranks stop together.
            if budget is not None and datamodule.num_env_steps_sampled_lifetime >= budget:
                # The update on this last item still runs; then the fit ends.
                datamodule.trainer.should_stop = True
            yield item


class EvaluationIterable:
    """A one-item iterable: the data module's ``sample_eval_item()``, played when it is iterated (``val_dataloader``)."""

    def __init__(self, datamodule: Any) -> None:
        self.datamodule = datamodule

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[TrainItem]:
        yield self.datamodule.sample_eval_item()
