"""``RecordEpisodes``: keep every complete training episode of a fit and write them as a Minari dataset.

    trainer = Trainer(callbacks=[RecordEpisodes("pendulum/sac-medium-replay-v0")])
    trainer.fit(SACLearner(...), datamodule=OffPolicyDataModule("Pendulum-v1"))

or from the command line::

    lightning-rl fit --config examples/sac_pendulum.yaml \\
        --trainer.callbacks+=lightning_rl.callbacks.RecordEpisodes \\
        --trainer.callbacks.dataset_id=pendulum/sac-medium-replay-v0

The episodes are the ones the data module sampled for training, with the exploration the run
used (an off-policy run's random actions before ``learning_starts`` included): everything a
replay buffer of unlimited capacity would have held, the D4RL "medium-replay" kind of dataset.
Evaluation episodes are not recorded.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_rl.data.env_datamodule import EnvDataModule
from lightning_rl.data.env_sampling import EnvSampling
from lightning_rl.data.minari_writer import check_dataset_id, registered_env_spec, write_minari_dataset
from lightning_rl.env.episode import SingleAgentEpisode


class RecordEpisodes(Callback):
    """Record the complete training episodes of ``fit`` and write them as a Minari dataset when it ends.

    The dataset is written when the fit ends normally, and also when SIGTERM (a scheduler's stop)
    or SIGINT (Ctrl-C) stops it: the episodes that ended until then. A ``kill -9`` writes nothing
    and leaves nothing behind for good (see ``write_minari_dataset``).

    Works with the environment data modules (``OnPolicyDataModule``, ``OffPolicyDataModule``):
    it listens to their sampling (``EnvSampling.episode_listeners``), joins the chunks of each
    episode and keeps the episodes that ended, whole. An episode still running when the fit
    ends, one begun before the fit (a resumed run's first chunks) and one dropped for an env
    fault are left out. Under DDP it records rank 0's episodes only (each rank samples its own
    envs; rank 0's are a sample of the same policy's episodes) and rank 0 writes the dataset.

    Args:
        dataset_id: The Minari dataset to write, ``(namespace/)name-v(version)``; checked
            before training starts.
        overwrite: Replace an existing dataset of that id (the old one is removed only once
            the new one is written); without it an existing id stops the fit before training.
        description: The dataset's description (Minari metadata); ``None`` for a generated one.
        algorithm_name: Minari's ``algorithm_name``; ``None`` for the Learner's class name.

    Raises:
        ValueError: At the start of ``fit``: for a data module that does not sample an env
            (``sampling``), one that normalizes observations or rewards (a dataset holds the
            env's own values, which such a run never keeps), or a malformed or existing id.
        ImportError: If Minari is not installed (naming the ``offline`` extra).
    """

    def __init__(
        self,
        dataset_id: str,
        *,
        overwrite: bool = False,
        description: str | None = None,
        algorithm_name: str | None = None,
    ) -> None:
        self.dataset_id = dataset_id
        self.overwrite = overwrite
        self.description = description
        self.algorithm_name = algorithm_name
        self._sampling: EnvSampling | None = None
        self._spaces: tuple[gym.Space, gym.Space] | None = None
        self._running: dict[str, SingleAgentEpisode] = {}
        self._episodes: list[SingleAgentEpisode] = []
        self._written = False

    @property
    def episodes(self) -> list[SingleAgentEpisode]:
        """The complete episodes recorded so far, in the order they ended (numpy episodes, without infos)."""
        return list(self._episodes)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """At the start of ``fit``: check the data module and the dataset id, then start listening (rank 0).

        Raises:
            ValueError: See the class.
        """
        if stage != "fit":
            return
        datamodule = trainer.datamodule
        # The environment data modules sample training episodes; an OfflineDataModule's sampling evaluates only.
        if not isinstance(datamodule, EnvDataModule):
            raise ValueError(
                f"RecordEpisodes records the episodes an environment data module samples (OnPolicyDataModule, "
                f"OffPolicyDataModule); the fit's data module is {type(datamodule).__name__}"
            )
        sampling = datamodule.sampling
        settings = sampling.settings
        normalized = [name for name in ("normalize_observations", "normalize_rewards") if getattr(settings, name)]
        if normalized:
            raise ValueError(
                f"RecordEpisodes writes the env's own observations and rewards, but the data module "
                f"{type(datamodule).__name__} trains on normalized ones ({', '.join(normalized)}); record such a run's "
                "checkpoint with 'lightning-rl record' instead, which plays the env's own values"
            )
        check_dataset_id(self.dataset_id, overwrite=self.overwrite)
        self._running, self._episodes, self._spaces, self._written = {}, [], None, False
        if trainer.global_rank == 0:
            self._sampling = sampling
            sampling.episode_listeners.append(self._on_rollout)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """When ``fit`` ended normally: write the recorded episodes (rank 0), and report them."""
        self._write(trainer, pl_module)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """When ``fit`` is stopped by SIGTERM (a scheduler) or SIGINT (Ctrl-C): write what was recorded so far.

        Lightning turns SIGTERM into ``SIGTERMException`` at the end of the step it arrived in;
        the episodes that ended until then are written as on a normal end. A fit that failed
        with an error writes nothing (its episodes may be what the error is about).
        """
        if isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
            self._write(trainer, pl_module, stopped_by=type(exception).__name__)

    def _write(self, trainer: Trainer, pl_module: LightningModule, stopped_by: str | None = None) -> None:
        if trainer.global_rank != 0 or self._written:
            return
        self._written = True
        if not self._episodes or self._spaces is None:
            rank_zero_warn(
                f"RecordEpisodes: no episode ended during the fit; the dataset {self.dataset_id!r} is not written"
            )
            return
        settings = self._sampling.settings
        returns = np.array([_episode_return(episode) for episode in self._episodes])
        steps = sum(len(episode) for episode in self._episodes)
        algorithm = self.algorithm_name or type(pl_module).__name__
        description = self.description or (
            f"The {len(self._episodes)} complete training episodes of a {algorithm} run with its exploration "
            f"(recorded by lightning_rl.callbacks.RecordEpisodes)"
        )
        path = write_minari_dataset(
            self.dataset_id,
            self._episodes,
            observation_space=self._spaces[0],
            action_space=self._spaces[1],
            env_spec=registered_env_spec(settings.env, settings.env_kwargs, settings.wrappers),
            algorithm_name=algorithm,
            description=description,
            overwrite=self.overwrite,
        )
        stopped = "" if stopped_by is None else f", the episodes that ended before the fit was stopped ({stopped_by})"
        rank_zero_info(
            f"RecordEpisodes: wrote {self.dataset_id} ({len(self._episodes)} episodes, {steps} steps, return "
            f"mean {returns.mean():.3f} std {returns.std():.3f}{stopped}) to {path}"
        )

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Stop listening to the data module's sampling."""
        if self._sampling is not None and self._on_rollout in self._sampling.episode_listeners:
            self._sampling.episode_listeners.remove(self._on_rollout)
        self._sampling = None

    def state_dict(self) -> dict[str, Any]:
        """Nothing is saved: a resumed fit records the episodes sampled after the resume."""
        return {}

    def _on_rollout(self, episodes: list[SingleAgentEpisode]) -> None:
        """One rollout's episodes: join each chunk to its episode; keep the episodes that ended."""
        if self._spaces is None:
            runner = self._sampling.train_runner
            self._spaces = (runner.observation_space, runner.action_space)
        for chunk in episodes:
            episode = self._running.pop(chunk.id_, None)
            if episode is None:
                if chunk.t_started != 0:  # begun before recording started
                    continue
                episode = _copy_columns(chunk)
            else:
                episode.concat_episode(_copy_columns(chunk))
            if episode.is_done:
                self._episodes.append(episode)
            else:
                self._running[chunk.id_] = episode
        # An env's running chunk always comes back in the next rollout (or its episode was dropped
        # for an env fault): keep only the episodes this rollout continued.
        live = {chunk.id_ for chunk in episodes}
        self._running = {key: value for key, value in self._running.items() if key in live}


def _copy_columns(chunk: SingleAgentEpisode) -> SingleAgentEpisode:
    """The chunk's observations, actions and rewards, copied (the data module trains on the chunk next)."""
    return SingleAgentEpisode(
        chunk.id_,
        observations=np.array(chunk.observations),
        actions=np.array(chunk.actions),
        rewards=np.array(chunk.rewards),
        terminated=chunk.is_terminated,
        truncated=chunk.is_truncated,
        t_started=chunk.t_started,
    )


def _episode_return(episode: SingleAgentEpisode) -> float:
    return float(np.sum(episode.rewards, dtype=np.float64))
