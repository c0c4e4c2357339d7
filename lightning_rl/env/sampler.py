"""``Sampler``: one env runner with its own copy of the acting module, as a sampler process or Ray actor runs it.

``AsyncSamplingDataModule`` runs several of these apart from the Learner (``sampler_pool``): each
acts with the weights last sent to it and returns one ``Rollout`` per request. The class is the
same in both backends: ``sampler_process_main`` drives it in a process of its own, Ray makes it
an actor (``ray.remote(Sampler)``).

Seeds: a sampler is built from ``EnvSettings`` whose ``seed`` is its own (the data module gives
sampler ``i`` of rank ``r`` the rank's training seed plus ``i * SAMPLER_SEED_STRIDE``). Its
``start`` counts how often it was started before (restarts after a fault, resumed runs): the
``start``-th build resets its envs with ``seed + start * num_envs`` (``EnvRunner``'s full-reset
rule), so a restarted sampler moves on to new seeds instead of replaying its first episodes,
and seeds torch's action sampling alike.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import sys
import traceback
from typing import Any

import numpy as np
import torch

from lightning_rl.core.processes import die_with_parent, release_fork_server
from lightning_rl.core.rl_modules import RLModule
from lightning_rl.env.env_runner import EnvRunner
from lightning_rl.env.env_settings import EnvSettings
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.shared_weights import SharedWeights

# Sampler i's envs are seeded this far from sampler i-1's (a prime, so that no sampler's seeds
# fall on the evaluation envs' offset of 1_000_003). A rank's seeds span 10_000_000
# (``RANK_SEED_STRIDE``): at most ``MAX_SAMPLERS`` samplers per rank fit.
SAMPLER_SEED_STRIDE = 100_003
MAX_SAMPLERS = 99

# What a sampler process sends its driver: (kind, payload).
READY = "ready"  # built, waiting for requests (payload None)
ROLLOUT = "rollout"  # payload: a Rollout
ERROR = "error"  # payload: the traceback, as text; the process exits after it


@dataclasses.dataclass
class Rollout:
    """One rollout of a sampler, as it reaches the driver.

    Args:
        episodes: What ``EnvRunner.sample`` returned (ended episodes, then each env's running chunk).
        metrics: ``EnvRunner.get_metrics()`` after the rollout (its per-period keys cover this rollout).
        new_returns: The returns of the episodes that ended in this rollout (float64).
        new_lens: Their lengths (int64).
        weights_seq_no: The Learner's ``weights_seq_no`` of the weights the sampler acted with.
        env_steps: Env steps in the rollout.
        sampler_index: Which sampler of the rank sampled it.
        new_statistics: With normalization, the sampler's normalization statistics since its
            last rollout (``EnvNormalization.report_new_statistics``); ``None`` without.
    """

    episodes: list[SingleAgentEpisode]
    metrics: dict[str, float]
    new_returns: np.ndarray
    new_lens: np.ndarray
    weights_seq_no: int
    env_steps: int
    sampler_index: int
    new_statistics: np.ndarray | None = None


class Sampler:
    """Samples rollouts with a module of its own, with the weights it was last given.

    Args:
        settings: The runner's settings, with this sampler's ``seed``.
        module: The acting module (a CPU copy; this sampler owns it).
        index: The sampler's index on its rank.
        start: How many times this sampler was started before (its seeds move on by that many full resets).
        weights_seq_no: The ``weights_seq_no`` of the weights ``module`` holds.
        statistics: With normalization, the data module's statistics to start from
            (``EnvNormalization.statistics_vector``); ``None``: the runner's own, fresh.
    """

    def __init__(
        self,
        settings: EnvSettings,
        module: RLModule,
        *,
        index: int,
        start: int = 0,
        weights_seq_no: int = 0,
        statistics: np.ndarray | None = None,
    ) -> None:
        # One intra-op thread: several samplers share the cores with the Learner.
        torch.set_num_threads(1)
        if settings.seed is not None:
            torch.manual_seed(settings.seed + start * settings.num_envs)
        self.index = index
        self.module = module
        self.weights_seq_no = int(weights_seq_no)
        self.runner = EnvRunner.from_settings(settings)
        if start:
            state = self.runner.get_state()
            state["num_resets"] = start
            self.runner.set_state(state)
        self.load_statistics(statistics)

    def ready(self) -> int:
        """This process's id (a Ray actor's first answer, which also says it started)."""
        return os.getpid()

    def set_weights(
        self, state: dict[str, torch.Tensor], weights_seq_no: int, statistics: np.ndarray | None = None
    ) -> None:
        """Act with ``state`` (and normalize with ``statistics``, if given) from now on (Ray: the weights ``ray.put``
        once per broadcast)."""
        self.module.load_state_dict(state)
        self.weights_seq_no = int(weights_seq_no)
        self.load_statistics(statistics)

    def load_statistics(self, statistics: np.ndarray | None) -> None:
        """Normalize with the data module's ``statistics`` plus what this sampler saw since its last rollout.

        ``None`` changes nothing. See ``EnvNormalization.load_statistics_vector``.
        """
        if statistics is not None and self.runner.normalization is not None:
            self.runner.normalization.load_statistics_vector(statistics)

    def sample(self) -> Rollout:
        """Sample one rollout (``rollout_fragment_length`` steps of every env) with the current weights.

        Raises:
            EnvFaultError: What ``EnvRunner.sample`` raises (a hung env after ``sample_timeout_s``, an env that fails).
        """
        episodes = self.runner.sample(self.module, explore=True)
        metrics = self.runner.get_metrics()
        returns, lens = self.runner.episode_stats_window_values
        ended = min(int(metrics["num_episodes"]), len(returns))
        normalization = self.runner.normalization
        return Rollout(
            episodes=episodes,
            metrics=metrics,
            new_returns=returns[len(returns) - ended :],
            new_lens=lens[len(lens) - ended :],
            weights_seq_no=self.weights_seq_no,
            env_steps=int(metrics["num_env_steps_sampled"]),
            sampler_index=self.index,
            new_statistics=None if normalization is None else normalization.report_new_statistics(),
        )

    def close(self) -> None:
        """Close the envs."""
        self.runner.close()


def sampler_process_main(index: int, start: int, payload: bytes, weights: SharedWeights, connection: Any) -> None:
    """The target of a sampler process: one rollout per request on ``connection``, until the driver goes.

    The process dies with the driver (``die_with_parent``, ``release_fork_server``; also when ``connection`` closes) and
    leaves Ctrl-C to it (the driver kills its samplers as it stops). Before each rollout it takes
    the weights (and normalization statistics) the driver last wrote to ``weights``. An error is
    sent back as text, then the process exits (the driver restarts it).

    Args:
        index: The sampler's index on its rank.
        start: How many times this sampler was started before.
        payload: ``cloudpickle.dumps((settings, module))``.
        weights: The driver's shared weights.
        connection: This sampler's end of its pipe to the driver: requests in, ``(kind, payload)`` out.
    """
    die_with_parent()
    release_fork_server()  # so a kill -9 of the driver ends the fork server, and with it this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        settings, module = pickle.loads(payload)  # cloudpickle's output loads with pickle
        sampler = Sampler(settings, module, index=index, start=start)
        connection.send((READY, None))
        version = -1
        while True:
            connection.recv()  # a request: sample one rollout
            update = weights.read_into(sampler.module, version)
            if update is not None:
                version, sampler.weights_seq_no, statistics = update
                sampler.load_statistics(statistics)
            connection.send((ROLLOUT, sampler.sample()))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the driver closed the pipe or is gone
    except BaseException:
        try:
            connection.send((ERROR, traceback.format_exc()))
        except OSError:
            pass
        sys.exit(1)
