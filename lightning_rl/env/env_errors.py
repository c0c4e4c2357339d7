"""The errors an ``EnvRunner`` raises when one of its envs misbehaves.

Each message names the sub-env (its index in the vector env), the env step at which it
happened (steps that sub-env took since the runner built it, counting from 0) and, where
known, the step within its episode, so that a fault can be found and replayed.

The classes take one message argument only: an async worker sends its error to the main
process, which rebuilds it as ``type(error)(error)``.
"""

from __future__ import annotations


class EnvFaultError(RuntimeError):
    """Base class: an env raised, hung, died or returned data the runner cannot use."""


class SubEnvError(EnvFaultError):
    """A sub-env raised, returned an observation of the wrong shape, or its worker process exited."""


class SampleTimeoutError(EnvFaultError):
    """A rollout (one ``EnvRunner.sample`` call or evaluation chunk) overran ``sample_timeout_s``."""


class NonFiniteEnvError(EnvFaultError):
    """A sub-env returned a NaN or infinite observation or reward (``on_nonfinite="raise"``)."""
