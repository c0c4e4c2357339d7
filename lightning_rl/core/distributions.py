"""Action distributions that an RLModule's ``action_dist_inputs`` parameterize.

Each class wraps a ``torch.distributions`` object and gives it RLlib's names:
``from_logits`` builds one from a batch of network outputs, ``logp``/``entropy``/``kl``
return one number per batch row.
"""

from __future__ import annotations

import abc
import math

import gymnasium as gym
import torch.distributions as D
from torch import Tensor


class Distribution(abc.ABC):
    """A batch of action distributions, one per row of the inputs it was built from.

    Build one with :meth:`from_logits`; the constructor takes the wrapped torch
    distribution, whose batch shape must be ``[B]`` (event dims already reinterpreted).

    Args:
        dist: The torch distribution to wrap.
    """

    def __init__(self, dist: D.Distribution) -> None:
        self._dist = dist

    @classmethod
    @abc.abstractmethod
    def from_logits(cls, logits: Tensor) -> Distribution:
        """Build the distribution from a ``[B, required_input_dim]`` batch of network outputs.

        Args:
            logits: The module's ``action_dist_inputs``.
        """

    @classmethod
    @abc.abstractmethod
    def required_input_dim(cls, space: gym.Space) -> int:
        """Return how many network outputs per row :meth:`from_logits` expects for ``space``.

        Args:
            space: The action space the distribution samples from.
        """

    def sample(self) -> Tensor:
        """Draw one action per row, without gradients."""
        return self._dist.sample()

    def rsample(self) -> Tensor:
        """Draw one action per row with the reparameterization trick, so gradients flow."""
        if not self._dist.has_rsample:
            raise NotImplementedError(
                f"{type(self).__name__} has no reparameterized sample; use sample() and a "
                "score-function (log-prob) gradient instead."
            )
        return self._dist.rsample()

    def deterministic_sample(self) -> Tensor:
        """Return the most likely action per row (the mode)."""
        return self._dist.mode

    def logp(self, actions: Tensor) -> Tensor:
        """Return the log-probability of ``actions`` per row, shape ``[B]``.

        Args:
            actions: One action per row, shaped like :meth:`sample`'s output.
        """
        return self._dist.log_prob(actions)

    def entropy(self) -> Tensor:
        """Return the entropy per row, shape ``[B]``."""
        return self._dist.entropy()

    def kl(self, other: Distribution) -> Tensor:
        """Return ``KL(self || other)`` per row, shape ``[B]``.

        Args:
            other: A distribution of the same class over the same batch.
        """
        if type(other) is not type(self):
            raise TypeError(f"Cannot compute KL from {type(self).__name__} to {type(other).__name__}.")
        return D.kl_divergence(self._dist, other._dist)


class Categorical(Distribution):
    """A categorical distribution over the ``n`` actions of a ``Discrete`` space.

    Inputs are unnormalized logits ``[B, n]``; actions are int64 indices ``[B]``.
    """

    @classmethod
    def from_logits(cls, logits: Tensor) -> Categorical:
        """Build the distribution from unnormalized logits ``[B, n]``.

        Args:
            logits: The module's ``action_dist_inputs``.
        """
        return cls(D.Categorical(logits=logits, validate_args=False))

    @classmethod
    def required_input_dim(cls, space: gym.Space) -> int:
        """Return ``space.n``.

        Args:
            space: A ``Discrete`` action space.
        """
        if not isinstance(space, gym.spaces.Discrete):
            raise ValueError(f"Categorical needs a Discrete action space, got {space}.")
        return int(space.n)


class DiagGaussian(Distribution):
    """A Gaussian with diagonal covariance over a 1-D ``Box`` space of size ``d``.

    Inputs are ``[B, 2 * d]``: the means, then the log standard deviations. Log-probs and
    entropies are summed over the ``d`` action dims. Samples are not clipped to the box.
    """

    @classmethod
    def from_logits(cls, logits: Tensor) -> DiagGaussian:
        """Build the distribution from concatenated means and log standard deviations.

        Args:
            logits: The module's ``action_dist_inputs``, shape ``[B, 2 * d]``.
        """
        mean, log_std = logits.chunk(2, dim=-1)
        normal = D.Normal(mean, log_std.exp(), validate_args=False)
        # Independent treats the action dims as one event, so log_prob/entropy/kl sum over them.
        return cls(D.Independent(normal, 1, validate_args=False))

    @classmethod
    def required_input_dim(cls, space: gym.Space) -> int:
        """Return ``2 * d``: a mean and a log standard deviation per action dim.

        Args:
            space: A 1-D ``Box`` action space.
        """
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"DiagGaussian needs a 1-D Box action space, got {space}.")
        return 2 * math.prod(space.shape)


def distribution_class_for_space(space: gym.Space) -> type[Distribution]:
    """Return the default distribution class for an action space.

    Args:
        space: The action space.

    Raises:
        ValueError: For spaces without a default distribution, and for ``Discrete`` spaces
            with ``start != 0`` (a categorical samples indices ``0..n-1``, which such an
            environment would not accept).
    """
    if isinstance(space, gym.spaces.Discrete):
        if space.start != 0:
            raise ValueError(
                f"Discrete action space {space} has start={space.start}; Categorical samples "
                "0..n-1. Shift the actions in an action wrapper so that start is 0."
            )
        return Categorical
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return DiagGaussian
    raise ValueError(
        f"No action distribution for space {space}; supported: Discrete and 1-D Box."
    )
