"""Action distributions that an RLModule's ``action_dist_inputs`` parameterize.

Each class wraps a ``torch.distributions`` object and gives it RLlib's names:
``from_logits`` builds one from a batch of network outputs, ``logp``/``entropy``/``kl``
return one number per batch row.

A class whose inputs alone do not say how to read them (how a ``MultiDiscrete`` space's logits
split per dimension, which shape a ``Box`` space's actions have) is first bound to its space
with :meth:`Distribution.for_space`, as RLlib binds its ``get_partial_dist_cls``: the result is
a subclass that carries the space's sizes, made once per space and reused, so distributions
of one space are of one class (what :meth:`Distribution.kl` checks).
:func:`distribution_class_for_space` returns the bound class for an action space.
"""

from __future__ import annotations

import abc
import functools
import math
from typing import Any, ClassVar

import gymnasium as gym
import torch
import torch.distributions as D
import torch.nn.functional as F
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

    @classmethod
    def for_space(cls, space: gym.Space) -> type[Distribution]:
        """Return the class to build distributions over ``space`` with: this one, or a subclass bound to it.

        The base checks the space (through :meth:`required_input_dim`) and returns the class itself;
        a class that needs the space's sizes to read its inputs returns a subclass carrying them.

        Args:
            space: The action space the distribution samples from.

        Raises:
            ValueError: For a space this class cannot sample from.
        """
        cls.required_input_dim(space)
        return cls

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


class MultiCategorical(Distribution):
    """Independent categoricals, one per dimension of a ``MultiDiscrete(nvec)`` space.

    Inputs are ``[B, sum(nvec)]`` unnormalized logits: ``nvec[0]`` for the first dimension,
    then ``nvec[1]`` for the second, and so on. Actions are int64 ``[B, k]``, one index per
    dimension; ``logp``, ``entropy`` and ``kl`` are the sums of the per-dimension ones, and
    ``deterministic_sample`` is the per-dimension argmax. Build it through
    ``MultiCategorical.for_space(space)`` (or :func:`distribution_class_for_space`), which
    binds ``nvec``.

    The logits are laid out as ``[B, k, max(nvec)]``, shorter dimensions padded with the
    dtype's lowest value (as action masks do): a padded entry has exactly zero probability and
    adds nothing to log-probabilities, entropies or KL terms, and one torch distribution then
    covers every dimension.
    """

    nvec: ClassVar[tuple[int, ...] | None] = None
    """The number of actions of each dimension; ``None`` until :meth:`for_space` binds it."""

    @classmethod
    def for_space(cls, space: gym.Space) -> type[MultiCategorical]:
        """Return ``MultiCategorical`` bound to ``space.nvec``.

        Args:
            space: A ``MultiDiscrete`` action space with a 1-D ``nvec`` and ``start`` 0.

        Raises:
            ValueError: As :meth:`required_input_dim`.
        """
        cls.required_input_dim(space)
        return _bound_subclass(cls, nvec=tuple(int(n) for n in space.nvec))

    @classmethod
    def from_logits(cls, logits: Tensor) -> MultiCategorical:
        """Build the distribution from the concatenated logits of every dimension, ``[B, sum(nvec)]``.

        Args:
            logits: The module's ``action_dist_inputs``.

        Raises:
            TypeError: On a class not bound to a space (``nvec`` unknown).
            ValueError: If the logits' last dim is not ``sum(nvec)``.
        """
        if cls.nvec is None:
            raise TypeError(
                "MultiCategorical does not know how its logits split per dimension; build it from the class "
                "that MultiCategorical.for_space(space) or distribution_class_for_space(space) returns"
            )
        if logits.shape[-1] != sum(cls.nvec):
            raise ValueError(
                f"{cls.__name__} takes {sum(cls.nvec)} logits per row (the sum of nvec), "
                f"got shape {tuple(logits.shape)}"
            )
        categorical = D.Categorical(logits=_per_dimension_logits(logits, cls.nvec), validate_args=False)
        # Independent treats the k dimensions as one event, so log_prob/entropy/kl sum over them.
        return cls(D.Independent(categorical, 1, validate_args=False))

    @classmethod
    def required_input_dim(cls, space: gym.Space) -> int:
        """Return ``sum(space.nvec)``: one logit per action of each dimension.

        Args:
            space: A ``MultiDiscrete`` action space.

        Raises:
            ValueError: For another space, a multi-dimensional ``nvec`` or a nonzero ``start``.
        """
        if not isinstance(space, gym.spaces.MultiDiscrete):
            raise ValueError(f"MultiCategorical needs a MultiDiscrete action space, got {space}.")
        if space.nvec.ndim != 1:
            raise ValueError(
                f"MultiDiscrete action space {space} has an nvec of shape {space.nvec.shape}; MultiCategorical "
                "takes a 1-D nvec. Flatten the actions in an action wrapper (e.g. to MultiDiscrete(nvec.ravel()))."
            )
        if space.start.any():
            raise ValueError(
                f"MultiDiscrete action space {space} has start={space.start.tolist()}; MultiCategorical samples "
                "0..nvec[i]-1 in each dimension. Shift the actions in an action wrapper so that start is 0."
            )
        return int(space.nvec.sum())


class DiagGaussian(Distribution):
    """A Gaussian with diagonal covariance over a ``Box`` space of ``d = prod(shape)`` numbers.

    Inputs are ``[B, 2 * d]``: the means, then the log standard deviations, in the order of
    the flattened space. Log-probs and entropies are summed over the ``d`` action dims.
    Samples are not clipped to the box. The class itself reads the inputs as a 1-D Box's,
    with actions ``[B, d]``; ``DiagGaussian.for_space(space)`` of a Box of another shape binds
    that shape, so that samples and modes are ``[B, *shape]`` and ``logp`` takes actions of
    that shape.
    """

    action_shape: ClassVar[tuple[int, ...] | None] = None
    """The shape of one action; ``None`` for flat actions ``[B, d]`` (a 1-D Box's)."""

    @classmethod
    def for_space(cls, space: gym.Space) -> type[DiagGaussian]:
        """Return ``DiagGaussian`` for a 1-D Box; for a Box of another shape, a subclass bound to it.

        Args:
            space: A ``Box`` action space.

        Raises:
            ValueError: As :meth:`required_input_dim`.
        """
        cls.required_input_dim(space)
        if len(space.shape) == 1:
            return cls
        return _bound_subclass(cls, action_shape=tuple(int(size) for size in space.shape))

    @classmethod
    def from_logits(cls, logits: Tensor) -> DiagGaussian:
        """Build the distribution from concatenated means and log standard deviations.

        Args:
            logits: The module's ``action_dist_inputs``, shape ``[B, 2 * d]``.
        """
        mean, log_std = logits.chunk(2, dim=-1)
        if cls.action_shape is not None:
            shape = (*logits.shape[:-1], *cls.action_shape)
            mean, log_std = mean.reshape(shape), log_std.reshape(shape)
        normal = D.Normal(mean, log_std.exp(), validate_args=False)
        # Independent treats the action dims as one event, so log_prob/entropy/kl sum over them.
        event_dims = 1 if cls.action_shape is None else len(cls.action_shape)
        return cls(D.Independent(normal, event_dims, validate_args=False))

    @classmethod
    def required_input_dim(cls, space: gym.Space) -> int:
        """Return ``2 * prod(space.shape)``: a mean and a log standard deviation per action number.

        Args:
            space: A ``Box`` action space.

        Raises:
            ValueError: For another space.
        """
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(f"DiagGaussian needs a Box action space, got {space}.")
        return 2 * math.prod(space.shape)


def distribution_class_for_space(space: gym.Space) -> type[Distribution]:
    """Return the default distribution class for an action space, bound to it (:meth:`Distribution.for_space`).

    ``Discrete``: :class:`Categorical`; ``MultiDiscrete``: :class:`MultiCategorical`; ``Box``
    (any shape): :class:`DiagGaussian`.

    Args:
        space: The action space.

    Raises:
        ValueError: For spaces without a default distribution, and for ``Discrete`` or
            ``MultiDiscrete`` spaces with ``start != 0`` (a categorical samples indices
            ``0..n-1``, which such an environment would not accept) or a multi-dimensional
            ``nvec``.
    """
    if isinstance(space, gym.spaces.Discrete):
        if space.start != 0:
            raise ValueError(
                f"Discrete action space {space} has start={space.start}; Categorical samples "
                "0..n-1. Shift the actions in an action wrapper so that start is 0."
            )
        return Categorical
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MultiCategorical.for_space(space)
    if isinstance(space, gym.spaces.Box):
        return DiagGaussian.for_space(space)
    raise ValueError(
        f"No action distribution for space {space}; supported: Discrete, MultiDiscrete and Box."
    )


def _bound_subclass(base: type[Distribution], **space_sizes: Any) -> type[Distribution]:
    """A subclass of ``base`` whose class attributes are ``space_sizes``; one per ``(base, sizes)``.

    Every call for one space returns the same class (:meth:`Distribution.kl` compares classes),
    also when ``base`` is itself a bound class (its unbound class is bound instead). Named after
    its sizes, e.g. ``MultiCategorical(nvec=(3, 4))``, for error messages.
    """
    return _cached_subclass(getattr(base, "_unbound_class", base), **space_sizes)


@functools.cache
def _cached_subclass(base: type[Distribution], **space_sizes: Any) -> type[Distribution]:
    sizes = ", ".join(f"{key}={value}" for key, value in space_sizes.items())
    attributes = {"__module__": base.__module__, "__doc__": base.__doc__, "_unbound_class": base, **space_sizes}
    return type(f"{base.__name__}({sizes})", (base,), attributes)


def _per_dimension_logits(logits: Tensor, nvec: tuple[int, ...]) -> Tensor:
    """``[..., sum(nvec)]`` logits as ``[..., k, max(nvec)]``, the shorter dimensions padded with the lowest value."""
    widest = max(nvec)
    if all(n == widest for n in nvec):  # no padding: a view
        return logits.reshape(*logits.shape[:-1], len(nvec), widest)
    lowest = torch.finfo(logits.dtype).min
    padded = [F.pad(part, (0, widest - part.shape[-1]), value=lowest) for part in logits.split(nvec, dim=-1)]
    return torch.stack(padded, dim=-2)
