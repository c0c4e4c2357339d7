"""``OfflineDataModule``: minibatches of a local Minari dataset for ``Trainer.fit``, evaluation in its env.

Each train item is an iterator of ``iterations_per_update`` minibatches (one by default) of
``batch_size`` rows per rank, which the Learner trains on with ``update_from_iterator``, one
gradient step per minibatch, as RLlib's offline path does:
``TrainItem(TrainingData(data_iterators=[...]), timesteps={...}, update_settings={"minibatch_size": None})``.
The rows come from one deterministic stream (``dataset_streams.RowStream``): pass after pass
over the dataset, each pass shuffled by a generator seeded with ``(seed, pass)``. Under N
data-parallel ranks, each minibatch is the stretch ``[g, g + N * batch_size)`` of the stream
(``g`` the rows drawn before it) and rank ``r`` takes its ``r``-th ``batch_size`` rows: the
ranks train on disjoint rows and draw the same number of minibatches. The position ``g`` is the
data module's state in checkpoints, so a resumed fit continues with the very rows the
interrupted one would have drawn next (on any number of ranks), and it is the
``num_env_steps_sampled_lifetime`` that drives the Learner's schedules.

A stateful (recurrent) module (``use_lstm``; the Learner's ``DataRequirements.max_seq_lens``
names it) trains on sequences instead of rows (``dataset_streams.SequenceStream``): each episode
cut into sequences of ``max_seq_len`` steps, zero-padded, shuffled per pass, and a minibatch
of ``max(1, batch_size // max_seq_len)`` sequences per rank: every column ``[S, T, ...]``,
``loss_mask [S, T]``, ``prev_actions``/``prev_rewards`` (the episode's previous step; zeros at
its first step) and ``state_in``. A dataset stores no recurrent states, so every sequence
starts from the module's initial (zero) state: R2D2's "zero start state" strategy (Kapturowski
et al., 2019), which RLlib also uses when episodes carry no ``STATE_OUT``. A sequence that
starts mid-episode thus begins without the memory of the steps before it; a ``max_seq_len``
covering the memory the task needs (or whole episodes) keeps that cost small. The stream
position is then counted in sequences (``sequences_drawn`` in the checkpoint state), and
``num_env_steps_sampled_lifetime`` in the real (unpadded) steps of the sequences drawn. A
streamed dataset is cut into sequences a window of whole episodes at a time, as rows are.

Before training, the dataset is read through once and every value checked
(``dataset_screen.screen_episodes``): an action outside a discrete action space is an error;
a NaN or infinite reward, observation or Box action, or an observation far outside its space's
bounds, is an error too, or (``on_nonfinite="drop_episode"``) its episode is left out of the
rows, with a warning naming it and ``env_runners/num_nonfinite_episodes_dropped`` logged.

Evaluation (``val_dataloader``) plays episodes (greedy unless ``evaluation_explore``) in the
dataset's environment with the Learner's module, through the same ``EnvSampling`` as the
environment data modules, so ``eval/episode_return_mean``, ``EarlyStopping`` and
``ModelCheckpoint`` work as on-line.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.core.arguments import check_int
from lightning_rl.core.columns import DEFAULT_MODULE_ID, NUM_ENV_STEPS_SAMPLED_LIFETIME, Columns
from lightning_rl.core.data_contract import DATASET_ROWS, DataOffer, DataRequirements, SpacePair
from lightning_rl.core.recurrent import repeat_state
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.data.acting_module import check_learner_has_module, learner_acting_module
from lightning_rl.data.dataset_rows import (
    DATASET_COLUMNS,
    DISCOUNTED_COLUMNS,
    check_row_space,
    episode_lengths,
    open_dataset,
    recorded_env,
)
from lightning_rl.data.dataset_screen import Screening, screen_episodes
from lightning_rl.data.dataset_streams import RowStream, SequenceStream
from lightning_rl.data.env_sampling import EnvSampling
from lightning_rl.data.ranked_datamodule import RankedDataModule, draw_base_seed
from lightning_rl.env.env_settings import EnvSettings
from lightning_rl.env.nonfinite import ON_NONFINITE_CHOICES, OnNonFinite

#: Datasets whose rows take more bytes than this are streamed a window at a time (``in_memory=None``).
IN_MEMORY_LIMIT_BYTES = 2 * 1024**3
# Evaluation envs stepped together by default (fewer when a rank plays fewer episodes).
_DEFAULT_EVALUATION_ENVS = 4
# Every minibatch drawn is one gradient step on exactly its rows (not split by the Learner's minibatch_size).
_EVERY_MINIBATCH_ONE_STEP = {"minibatch_size": None}
# Keys of ``state_dict``.
_ROWS_DRAWN, _SEED, _NUM_ROWS = NUM_ENV_STEPS_SAMPLED_LIFETIME, "seed", "num_rows_per_pass"
_SEQUENCES_DRAWN = "sequences_drawn"
#: Logged as ``env_runners/{this}`` with every train item under ``on_nonfinite="drop_episode"``.
NUM_NONFINITE_EPISODES_DROPPED = "num_nonfinite_episodes_dropped"


class OfflineDataModule(RankedDataModule):
    """Trains on a local Minari dataset; evaluates episodes in the dataset's environment.

    Args:
        dataset_id: The id of a local Minari dataset, as ``minari.load_dataset`` takes it
            (``"cartpole/ppo-expert-v0"``), under ``$MINARI_DATASETS_PATH`` (default
            ``~/.minari/datasets``). Nothing is downloaded.
        batch_size: Rows per gradient step on each rank; for a stateful module,
            ``max(1, batch_size // max_seq_len)`` sequences.
        updates_per_epoch: Train items (updates) per Lightning epoch; validation,
            checkpoints and epoch-level logging happen at epoch ends.
        iterations_per_update: Minibatches per train item (RLlib's
            ``dataset_num_iters_per_learner``): the Learner trains on an item with
            ``update_from_iterator``, one gradient step per minibatch, and its hooks (target-network
            updates, schedules) run once around the item. Keep 1 for algorithms whose target
            networks move every step (CQL, IQL); more trims per-update overhead for BC and MARWIL.
        shuffle: Visit rows in a new random order every pass (seeded); without it rows come in
            the dataset's order, episode after episode.
        sample_with_replacement: Draw every row of a minibatch uniformly at random from the whole
            dataset, independently of all other draws (with replacement), as d3rlpy and most
            offline RL code sample, instead of visiting each row once per pass. Still a
            deterministic function of ``(seed, stream position)``, so resuming and the ranks'
            disjoint stream stretches work as without it. When streaming (``in_memory=False``)
            rows are drawn from the current window of episodes; for a stateful module, whole
            sequences are drawn. Needs ``shuffle``.
        seed: Seeds the passes' orders and the evaluation envs. ``None`` draws one from numpy's
            global generator at setup (rank 0's, shared with the other ranks); it is saved in
            checkpoints, so a resumed fit continues the same stream.
        module_id: The Learner's module that trains on the rows and acts in evaluation.
        evaluation_env: The evaluation environment: a registered gymnasium id or the import path
            of an env factory. ``None`` uses the id of the dataset's env spec, with the spec's
            keyword arguments, when that id is registered with gymnasium (the spec's entry
            point is never used).
        evaluation_env_kwargs: Keyword arguments for the evaluation env (over the spec's, with
            ``evaluation_env=None``). These two are not named ``env`` and ``env_kwargs`` as in the
            env data modules: this data module trains on no env, and Lightning's CLI would carry
            the default data module's ``env`` over into a config that names this class.
        evaluation_num_episodes: Complete episodes per evaluation, over all ranks (each of N
            ranks plays ``ceil(evaluation_num_episodes / N)``).
        evaluation_num_envs: Evaluation envs stepped together; ``None`` for
            ``min(4, episodes this rank plays)``.
        evaluation_explore: Whether evaluation samples actions (``forward_exploration``)
            instead of acting greedily (``forward_inference``), as RLlib evaluates by default.
        in_memory: Hold the whole dataset in memory (``True``) or stream it a window of
            episodes at a time (``False``); ``None`` holds it when its rows take at most
            ``IN_MEMORY_LIMIT_BYTES`` (2 GiB).
        stream_window_rows: When streaming, about how many rows each window holds (whole
            episodes; at most two windows are in memory). Rows (a stateful module's sequences)
            are shuffled within a window, windows are whole episodes in a per-pass random order.
        sample_timeout_s: The most seconds one evaluation chunk may take (see ``EnvRunner``).
        on_nonfinite: A NaN or infinite reward, observation or Box action in the dataset, or
            an observation far outside its space's bounds (past them by more than their
            width, or above 1e10 in magnitude; ``dataset_screen``): ``"raise"`` an error naming
            the episode, the step and the value (the default), or ``"drop_episode"``: leave
            that episode out of the rows, warn naming every episode dropped, and log their
            count as ``env_runners/num_nonfinite_episodes_dropped``; an error if none is
            left. The dataset is read through once to check it, before the first step. An
            action outside a discrete action space is an error either way.

    Raises:
        ValueError: Naming the argument, for invalid values; for a dataset id that is not a
            local Minari dataset (listing the local ones) or a dataset that cannot be read;
            for observation or action spaces other than Box, Discrete, MultiDiscrete or
            MultiBinary; and for an unknown ``evaluation_env``.
        ImportError: If Minari is not installed, naming the extra that installs it.
    """

    def __init__(
        self,
        dataset_id: str,
        *,
        batch_size: int = 256,
        updates_per_epoch: int = 1000,
        iterations_per_update: int = 1,
        shuffle: bool = True,
        sample_with_replacement: bool = False,
        seed: int | None = None,
        module_id: str = DEFAULT_MODULE_ID,
        evaluation_env: str | None = None,
        evaluation_env_kwargs: dict[str, Any] | None = None,
        evaluation_num_episodes: int = 10,
        evaluation_num_envs: int | None = None,
        evaluation_explore: bool = False,
        in_memory: bool | None = None,
        stream_window_rows: int = 100_000,
        sample_timeout_s: float | None = 60.0,
        on_nonfinite: OnNonFinite = "raise",
    ) -> None:
        super().__init__(
            seed=seed, evaluation_num_episodes=evaluation_num_episodes, evaluation_num_envs=evaluation_num_envs
        )
        if not isinstance(dataset_id, str) or not dataset_id:
            raise ValueError(f"dataset_id must be the id of a local Minari dataset, got {dataset_id!r}")
        for name, value in (
            ("batch_size", batch_size),
            ("updates_per_epoch", updates_per_epoch),
            ("iterations_per_update", iterations_per_update),
            ("stream_window_rows", stream_window_rows),
        ):
            check_int(name, value)
        for name, value in (
            ("shuffle", shuffle),
            ("sample_with_replacement", sample_with_replacement),
            ("evaluation_explore", evaluation_explore),
        ):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be a bool, got {value!r}")
        if sample_with_replacement and not shuffle:
            raise ValueError(
                "sample_with_replacement=True draws rows at random, so it cannot keep the dataset's order "
                "(shuffle=False): leave shuffle on, or sample without replacement"
            )
        if on_nonfinite not in ON_NONFINITE_CHOICES:
            raise ValueError(f"on_nonfinite must be one of {list(ON_NONFINITE_CHOICES)}, got {on_nonfinite!r}")
        if in_memory is not None and not isinstance(in_memory, bool):
            raise ValueError(f"in_memory must be a bool or None, got {in_memory!r}")
        if not isinstance(module_id, str) or not module_id:
            raise ValueError(f"module_id must be a non-empty string, got {module_id!r}")
        if evaluation_env_kwargs is not None and not isinstance(evaluation_env_kwargs, dict):
            raise ValueError(
                f"evaluation_env_kwargs must be a dict or None, got {type(evaluation_env_kwargs).__name__}"
            )
        if evaluation_env is not None and not isinstance(evaluation_env, str):
            raise ValueError(
                "evaluation_env must be a registered gymnasium id or an env factory's import path, "
                f"got {evaluation_env!r}"
            )
        self.save_hyperparameters()
        # The evaluation runner's settings: a given env is checked here, before the dataset is
        # read; without one, the dataset's env is used if gymnasium has it (``None`` if not:
        # ``sampling`` then says so).
        self._evaluation_settings: EnvSettings | None = None
        if evaluation_env is not None:
            self._evaluation_settings = self._evaluation_env_settings(evaluation_env, evaluation_env_kwargs or {})
        self._dataset = open_dataset(dataset_id)
        self._lengths = episode_lengths(self._dataset, dataset_id)
        check_row_space(self._dataset.observation_space, "observation", dataset_id)
        check_row_space(self._dataset.action_space, "action", dataset_id)
        recorded_in = None if evaluation_env is not None else recorded_env(self._dataset, evaluation_env_kwargs)
        if recorded_in is not None:
            self._evaluation_settings = self._evaluation_env_settings(*recorded_in)
        self._rows_drawn = 0  # env steps drawn, over all ranks (the row stream's position)
        self._sequences_drawn = 0  # the sequence stream's position, over all ranks (stateful modules)
        self._max_seq_len: int | None = None  # the module's, when it is stateful
        self._initial_state: dict[str, torch.Tensor] = {}  # every sequence's state_in (a stateful module's)
        self._stream: RowStream | SequenceStream | None = None
        self._columns: list[str] | None = None  # what the Learner asks for, checked against the dataset
        self._gamma: float | None = None  # the Learner's discount, when it asks for value_targets
        self._requirements: DataRequirements | None = None  # the Learner's, handed over at its setup

    # ------------------------------------------------------------------------------------
    # What the Learner and the user read
    # ------------------------------------------------------------------------------------

    @property
    def observation_space(self) -> gym.Space:
        """The dataset's observation space."""
        return self._dataset.observation_space

    @property
    def action_space(self) -> gym.Space:
        """The dataset's action space."""
        return self._dataset.action_space

    @property
    def num_rows(self) -> int:
        """Rows (env steps) of one pass: the dataset's, less those of the episodes ``on_nonfinite`` dropped."""
        return int(self._screening.episodes.lengths.sum())

    @property
    def num_nonfinite_episodes_dropped(self) -> int:
        """Episodes left out for a non-finite or implausible value (``on_nonfinite="drop_episode"``)."""
        return len(self._screening.dropped)

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Dataset rows trained on so far, summed over all ranks, resumed runs included."""
        return self._rows_drawn

    @property
    def in_memory(self) -> bool:
        """Whether the dataset is held in memory (else streamed a window of episodes at a time)."""
        if self.hparams.in_memory is not None:
            return self.hparams.in_memory
        num_rows = int(self._lengths.sum())  # before any episode is dropped: deciding needs no read
        return num_rows * _bytes_per_row(self.observation_space, self.action_space) <= IN_MEMORY_LIMIT_BYTES

    @property
    def sequences_per_minibatch(self) -> int:
        """A stateful module's sequences per minibatch on each rank: ``max(1, batch_size // max_seq_len)``.

        Raises:
            RuntimeError: Before the Learner was checked, or for a feed-forward module.
        """
        if self._max_seq_len is None:
            raise RuntimeError(
                "only a stateful module, once the Learner was checked (train_dataloader), trains on sequences"
            )
        return max(1, self.hparams.batch_size // self._max_seq_len)

    @property
    def stream(self) -> RowStream | SequenceStream:
        """The row stream, or a stateful module's sequence stream (built on first use, after the Learner's columns were checked)."""
        if self._stream is None:
            if self._columns is None:
                raise RuntimeError("the row stream is built once the Learner is known: call train_dataloader first")
            source = (self._dataset, self.hparams.dataset_id, self._screening.episodes)
            common = dict(
                columns=self._columns,
                seed=self.base_seed,
                shuffle=self.hparams.shuffle,
                replacement=self.hparams.sample_with_replacement,
                gamma=self._gamma,
            )
            window_rows = None if self.in_memory else self.hparams.stream_window_rows
            if self._max_seq_len is not None:
                self._stream = SequenceStream(*source, max_seq_len=self._max_seq_len, window_rows=window_rows, **common)
            else:
                self._stream = RowStream(*source, window_rows=window_rows, **common)
        return self._stream

    @functools.cached_property
    def _screening(self) -> Screening:
        """The dataset's values checked and the episodes to train on chosen: read through once, at first use."""
        return screen_episodes(
            self._dataset, self.hparams.dataset_id, self._lengths, on_nonfinite=self.hparams.on_nonfinite
        )

    @functools.cached_property
    def sampling(self) -> EnvSampling:
        """This rank's evaluation runner, seeds and episode share (the same as the environment data modules')."""
        settings = self._evaluation_settings
        if settings is None:
            spec = self._dataset.env_spec
            raise ValueError(
                f"the Minari dataset {self.hparams.dataset_id!r} was recorded in env "
                f"{None if spec is None else spec.id!r}, which is not a registered gymnasium id: pass the evaluation "
                "env as OfflineDataModule(evaluation_env=...), or fit without evaluation (Trainer(limit_val_batches=0))"
            )
        return EnvSampling(
            settings,
            settings,
            evaluation_num_envs=self.hparams.evaluation_num_envs,
            evaluation_explore=self.hparams.evaluation_explore,
            ranks=self,
        )

    # ------------------------------------------------------------------------------------
    # Lightning hooks
    # ------------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        """Called by Lightning on every rank before the Learner's ``setup``: agree on the seed.

        With ``seed=None``, rank 0 draws it and every rank takes rank 0's (they must shuffle
        alike to take disjoint slices). Evaluation runners built before the Trainer said which
        rank this is are rebuilt.
        """
        if self._base_seed is None:
            drawn = draw_base_seed()
            trainer = self.trainer
            self._base_seed = int(trainer.strategy.broadcast(drawn, src=0)) if trainer is not None else drawn
        if "sampling" in self.__dict__:
            self.sampling.close_runners_built_elsewhere()

    def train_dataloader(self) -> Iterable[TrainItem]:
        """``updates_per_epoch`` train items, each drawn when Lightning asks for it (sized: no prefetch).

        Called by Lightning after the Learner's ``setup`` built its modules, so the Learner is
        checked against the dataset here, before the first gradient step; the rows the first
        item draws from are read here too (the whole dataset when it is held in memory).

        Raises:
            ValueError: If the Learner's module does not fit the dataset's spaces, the Learner
                requires a column a dataset cannot provide (see ``check_learner``), the
                dataset's episodes cannot be read, or a value in them is bad (``on_nonfinite``:
                the dataset is checked here, on first use).
        """
        self.check_learner()
        rank = self.placement()[0]
        if self._max_seq_len is not None:
            self.stream.preload(self._sequences_drawn + rank * self.sequences_per_minibatch)
        else:
            self.stream.preload(self._rows_drawn + rank * self.hparams.batch_size)
        return _Minibatches(self)

    def val_dataloader(self) -> Iterable[TrainItem]:
        """One evaluation item: this rank's share of ``evaluation_num_episodes`` episodes.

        Called by Lightning when a fit starts (before the first train item, and before the
        sanity check if any) unless evaluation is off (``limit_val_batches=0``), and by
        ``Trainer.validate``. The evaluation envs are built here, so an env that cannot be made,
        or whose spaces are not the dataset's, fails before any training.

        Raises:
            ValueError: If the dataset's env is not a registered gymnasium id and no ``evaluation_env`` was
                given, or if the evaluation env's spaces do not fit the dataset's (naming both).
        """
        runner = self.sampling.eval_runner
        self._check_fits_spaces(
            runner.observation_space,
            runner.action_space,
            f"its evaluation env {self._evaluation_settings.env!r}",
            "pass the env the dataset was recorded in (OfflineDataModule(evaluation_env=...))",
        )
        return super().val_dataloader()

    def teardown(self, stage: str) -> None:
        """Close the evaluation envs (rebuilt if the data module is used again)."""
        if "sampling" in self.__dict__:
            self.sampling.close()

    def state_dict(self) -> dict[str, Any]:
        """The stream position, saved in Lightning checkpoints.

        Returns:
            ``{"num_env_steps_sampled_lifetime": rows (env steps) drawn over all ranks, "seed": the
            stream's seed (``None`` before setup drew one), "num_rows_per_pass": the dataset's rows,
            "sequences_drawn": a stateful module's sequence stream position over all ranks (0 for rows)}``.
        """
        return {
            _ROWS_DRAWN: self._rows_drawn,
            _SEED: self._base_seed,
            _NUM_ROWS: self.num_rows,
            _SEQUENCES_DRAWN: self._sequences_drawn,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()``: the next item continues the stream where the checkpoint left it.

        The saved seed replaces this data module's, so the stream is the interrupted one. A
        dataset whose size changed since is trained on from the same position with a warning.
        """
        self._rows_drawn = int(state_dict[_ROWS_DRAWN])
        # Checkpoints written before sequences existed lack the key: they trained on rows.
        self._sequences_drawn = int(state_dict.get(_SEQUENCES_DRAWN, 0))
        if state_dict.get(_SEED) is not None:
            self._base_seed = int(state_dict[_SEED])
            if "sampling" in self.__dict__:  # evaluation seeds follow the restored seed too
                self.sampling.close()
                del self.__dict__["sampling"]
        saved_rows = state_dict.get(_NUM_ROWS)
        if saved_rows is not None and int(saved_rows) != self.num_rows:
            warnings.warn(
                f"the checkpoint was trained on {saved_rows} rows per pass of {self.hparams.dataset_id!r}, which now "
                f"holds {self.num_rows}: the resumed fit draws other rows than the interrupted one would have",
                stacklevel=2,
            )
        self._stream = None

    # ------------------------------------------------------------------------------------
    # Items
    # ------------------------------------------------------------------------------------

    def check_learner(self) -> None:
        """Check the Trainer's Learner against the dataset and settle the columns to yield.

        The columns, ``gamma``, ``n_step`` and whether the module is stateful (its
        ``max_seq_len``) are the Learner's requirements, which its ``setup`` handed over
        (``accept_requirements``); a stateful module's initial state is every sequence's
        ``state_in``.

        Raises:
            ValueError: If the Learner is not built or has no module ``module_id``; if that
                module's observation or action space does not fit the dataset's (naming both);
                if the Learner handed no requirements over; if it requires a column no dataset
                row has, or ``n_step`` returns; if it requires ``value_targets`` or
                ``bootstrap_discount`` without a ``gamma`` in [0, 1].
        """
        learner = self.trainer.lightning_module
        module_id = self.hparams.module_id
        check_learner_has_module(learner, module_id, "to train on the dataset")
        module = learner.module[module_id]
        self._check_fits_spaces(
            module.observation_space,
            module.action_space,
            f"the Learner's module {module_id!r}",
            "train a module built for the dataset's spaces (leave the spaces out of the module spec to take the dataset's)",
        )
        requirements = self._requirements
        if requirements is None:
            raise ValueError(
                f"{type(learner).__name__} handed {type(self).__name__} no data requirements: its setup must call "
                "datamodule.accept_requirements(self.data_requirements()), as Learner.setup does"
            )
        n_step = requirements.n_step
        if n_step is not None and n_step != 1:
            raise ValueError(
                f"{requirements.learner} has n_step={n_step!r}, returns summed over replayed steps, but dataset rows "
                "are one-step transitions: set n_step=1"
            )
        required = list(requirements.columns[module_id])
        missing = [column for column in required if column not in DATASET_COLUMNS]
        if missing:
            raise ValueError(
                f"{requirements.learner} requires column(s) {missing} for module {self.hparams.module_id!r}, which an "
                f"offline dataset cannot provide; its rows have {list(DATASET_COLUMNS)}"
            )
        gamma = None
        discounted = [column for column in required if column in DISCOUNTED_COLUMNS]
        if discounted:
            gamma = requirements.gamma
            if not isinstance(gamma, (int, float)) or isinstance(gamma, bool) or not 0 <= gamma <= 1:
                raise ValueError(
                    f"{requirements.learner} requires {' and '.join(discounted)}, computed with a discount, but has "
                    f"no hyperparameter gamma in [0, 1] to discount with (got {gamma!r})"
                )
        max_seq_len = requirements.max_seq_lens.get(module_id)
        if self._columns != required or self._gamma != gamma or self._max_seq_len != max_seq_len:
            self._stream = None
        self._columns, self._gamma, self._max_seq_len = required, gamma, max_seq_len
        # The zero start state of every sequence (a dataset stores no states), kept on the CPU as the rows are.
        self._initial_state = {name: value.detach().cpu() for name, value in module.get_initial_state().items()}

    def next_train_item(self) -> TrainItem:
        """The next train item: an iterator of this rank's next ``iterations_per_update`` minibatches.

        The Learner trains on it with ``update_from_iterator`` (one gradient step per
        minibatch drawn). The minibatches are drawn as the update iterates, each moving the
        stream position on by all ranks' rows; the item's timesteps are the env steps drawn after
        its last minibatch (for sequences, their real steps). Every rank must call it the same
        number of times (they do: every rank yields ``updates_per_epoch`` items per epoch).
        """
        iterations = self.hparams.iterations_per_update
        world_size = self.placement()[1]
        if self._max_seq_len is not None:
            start = self._sequences_drawn
            steps = self.stream.steps(start, start + iterations * world_size * self.sequences_per_minibatch)
        else:
            steps = iterations * world_size * self.hparams.batch_size
        env_runners = {}
        if self.hparams.on_nonfinite == "drop_episode":
            env_runners[NUM_NONFINITE_EPISODES_DROPPED] = float(self.num_nonfinite_episodes_dropped)
        return TrainItem(
            TrainingData(data_iterators=[self._minibatches(iterations)]),
            timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: self._rows_drawn + steps},
            env_runners=env_runners,
            update_settings=dict(_EVERY_MINIBATCH_ONE_STEP),
        )

    def next_minibatch(self) -> dict[str, dict[str, Any]]:
        """Draw this rank's next ``batch_size`` rows, ``{module_id: {column: Tensor}}``; move the position on by all ranks' rows.

        For a stateful module, its next ``sequences_per_minibatch`` sequences instead (the
        layout is in this file's docstring), each with the module's initial state as ``state_in``.
        """
        rank, world_size = self.placement()
        if self._max_seq_len is not None:
            return {self.hparams.module_id: self._next_sequences(rank, world_size)}
        batch_size = self.hparams.batch_size
        start = self._rows_drawn + rank * batch_size
        batch = self.stream.rows(start, start + batch_size)
        self._rows_drawn += world_size * batch_size
        return {self.hparams.module_id: batch}

    def _next_sequences(self, rank: int, world_size: int) -> dict[str, Any]:
        """This rank's next sequences, from zero start states; moves both positions on by all ranks' share."""
        count = self.sequences_per_minibatch
        start = self._sequences_drawn + rank * count
        stream = self.stream
        batch = stream.sequences(start, start + count)
        batch[Columns.STATE_IN] = repeat_state(self._initial_state, count)
        self._rows_drawn += stream.steps(self._sequences_drawn, self._sequences_drawn + world_size * count)
        self._sequences_drawn += world_size * count
        return batch

    def _minibatches(self, count: int) -> Iterator[dict[str, dict[str, Any]]]:
        for _ in range(count):
            yield self.next_minibatch()

    def sample_eval_item(self) -> TrainItem:
        """Play this rank's share of the evaluation episodes with the current weights (greedy unless ``evaluation_explore``)."""
        with learner_acting_module(self.trainer, self.hparams.module_id) as module:
            episodes = self.sampling.evaluate(module)
        return TrainItem(TrainingData(episodes=episodes), timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: self._rows_drawn})

    # ------------------------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------------------------

    def _check_fits_spaces(
        self, observation_space: gym.Space, action_space: gym.Space, whose: str, remedy: str
    ) -> None:
        """Raise unless ``whose`` spaces take the dataset's values (``_spaces_fit``), naming both spaces and the remedy."""
        for what, ours, theirs in (
            ("observation", self.observation_space, observation_space),
            ("action", self.action_space, action_space),
        ):
            if not _spaces_fit(ours, theirs, bounds_matter=what == "action"):
                raise ValueError(
                    f"the Minari dataset {self.hparams.dataset_id!r} has {what} space {ours}, but {whose} has {what} "
                    f"space {theirs}: {remedy}"
                )

    def _evaluation_env_settings(self, env: str, env_kwargs: dict[str, Any]) -> EnvSettings:
        """The evaluation runner's settings (an unknown env id or factory path fails here)."""
        return EnvSettings(
            env=env,
            env_kwargs=dict(env_kwargs),
            num_envs=_DEFAULT_EVALUATION_ENVS,  # the evaluation default; no training envs are built
            rollout_fragment_length=1,
            episode_stats_window=self.hparams.evaluation_num_episodes,
            sample_timeout_s=self.hparams.sample_timeout_s,
        )

    # ------------------------------------------------------------------------------------
    # The data contract (``lightning_rl.core.data_contract``: this class is a ``DataSource``)
    # ------------------------------------------------------------------------------------

    def data_offer(self) -> DataOffer:
        """Iterators of ready minibatches (no train batch to cut), and the dataset's spaces; it counts dataset rows.

        Its step count (``num_env_steps_sampled_lifetime``, the x-axis and checkpoint names) is
        the dataset rows (recorded env steps) trained on over all ranks: ``batch_size x ranks``
        per gradient step on rows; a stateful module's sequences count their real (unpadded) steps.
        """
        return DataOffer(frozenset({"data_iterators"}), spaces=self._offered_spaces, step_name=DATASET_ROWS)

    def accept_requirements(self, requirements: DataRequirements) -> None:
        """Keep the Learner's requirements: ``check_learner`` settles the columns, ``gamma`` and ``n_step`` from them.

        Args:
            requirements: The Learner's ``data_requirements()``, handed over by its ``setup``
                (before ``train_dataloader`` checks them against the dataset).
        """
        self._requirements = requirements

    def _offered_spaces(self) -> SpacePair:
        return self.observation_space, self.action_space


class _Minibatches:
    """A sized iterable of train items (sized, so Lightning does not prefetch one)."""

    def __init__(self, datamodule: OfflineDataModule) -> None:
        self.datamodule = datamodule
        self.length = datamodule.hparams.updates_per_epoch

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[TrainItem]:
        # A generator: nothing is drawn until Lightning asks for an item, so an iterator it
        # makes and drops (it makes one at setup) moves the stream position not at all.
        for _ in range(self.length):
            yield self.datamodule.next_train_item()


def _spaces_fit(dataset_space: gym.Space, module_space: gym.Space | None, *, bounds_matter: bool) -> bool:
    """Whether a module built for ``module_space`` takes values of ``dataset_space``: same kind and shape.

    Sizes of discrete spaces must match. Observation Box bounds may differ (a module spec often
    says ``(-inf, inf)``); with ``bounds_matter`` (actions) finite bounds must be equal, since
    SAC, CQL and IQL rescale the data's actions by the module's bounds.
    """
    if module_space is None or type(dataset_space) is not type(module_space):
        return False
    if isinstance(dataset_space, gym.spaces.Discrete):
        return dataset_space.n == module_space.n and dataset_space.start == module_space.start
    if isinstance(dataset_space, gym.spaces.MultiDiscrete):
        return np.array_equal(dataset_space.nvec, module_space.nvec)
    if dataset_space.shape != module_space.shape:
        return False
    if bounds_matter and isinstance(dataset_space, gym.spaces.Box) and module_space.is_bounded("both"):
        return np.array_equal(dataset_space.low, module_space.low) and np.array_equal(
            dataset_space.high, module_space.high
        )
    return True


def _bytes_per_row(observation_space: gym.Space, action_space: gym.Space) -> int:
    """About how many bytes one row takes in memory (its observation once, action, reward, flags, index)."""

    def size(space: gym.Space) -> int:
        itemsize = np.dtype(space.dtype).itemsize if isinstance(space, gym.spaces.Box) else 8
        return int(np.prod(space.shape or (1,))) * itemsize

    return size(observation_space) + size(action_space) + 4 + 2 + 8 + 4
