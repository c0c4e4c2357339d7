"""PettingZoo envs by import path: the Parallel API and the turn-based AEC API.

A config file names a PettingZoo env the way PettingZoo's own modules are laid out:

- a module, ``"mpe2.simple_spread_v3"`` or ``"pettingzoo.classic.connect_four_v3"``: its
  ``parallel_env(**env_kwargs)`` when it has one, else its ``env(**env_kwargs)`` (AEC);
- or ``"package.module.factory"``: a callable returning a ``ParallelEnv`` or an ``AECEnv``;
- or an id in PettingZoo's own registry (``"classic/connect_four-v3"``, built with
  ``pettingzoo.make``: the parallel version when one is registered, else the AEC one), which
  avoids the deprecation warning PettingZoo 1.27 gives for some of its old module paths.

PettingZoo is an optional dependency (``pip install 'lightning-rl[multiagent]'``); it is
imported here only when an env is built or checked.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Callable, Mapping
from typing import Any

PettingZooEnvCreator = Callable[..., Any]
"""A callable returning a PettingZoo ``ParallelEnv`` or ``AECEnv``."""

_INSTALL_HINT = "install it with pip install 'lightning-rl[multiagent]'"


def _pettingzoo() -> Any:
    try:
        import pettingzoo
    except ImportError as error:
        raise ImportError(f"multi-agent envs need PettingZoo: {_INSTALL_HINT} ({error})") from error
    return pettingzoo


def check_pettingzoo_env_name(env: str) -> PettingZooEnvCreator:
    """Resolve a PettingZoo env's import path to the callable that builds it, without building it.

    Args:
        env: A module path (``"mpe2.simple_spread_v3"``: its ``parallel_env``, else its
            ``env``), the path of a factory (``"package.module.factory"``), or a PettingZoo
            registry id (``"classic/connect_four-v3"``).

    Returns:
        The callable to build the env with ``**env_kwargs``.

    Raises:
        ImportError: If PettingZoo is not installed.
        ValueError: Naming ``env``, when it is neither a registry id nor a dotted path (with
            the closest registry ids), its module cannot be imported, the module has neither
            ``parallel_env`` nor ``env``, or the factory is missing or not callable.
    """
    pettingzoo = _pettingzoo()
    if isinstance(env, str) and env in pettingzoo.parallel_registry:
        return functools.partial(pettingzoo.make, "parallel", env)
    if isinstance(env, str) and env in pettingzoo.aec_registry:
        return functools.partial(pettingzoo.make, "aec", env)
    if not isinstance(env, str) or not env or any(not part.isidentifier() for part in env.split(".")):
        known = [*pettingzoo.parallel_registry, *pettingzoo.aec_registry]
        close = difflib.get_close_matches(str(env), known, n=3)
        raise ValueError(
            f"a PettingZoo env is named by an import path such as 'mpe2.simple_spread_v3' or "
            f"'package.module.factory', or by a PettingZoo registry id such as 'classic/connect_four-v3'; "
            f"got {env!r}" + (f" (did you mean {close}?)" if close else "")
        )
    module = _import_module_if_exists(env)
    if module is not None:
        for name in ("parallel_env", "env"):
            factory = getattr(module, name, None)
            if callable(factory):
                return factory
        raise ValueError(
            f"PettingZoo env module {env!r} has neither parallel_env() nor env(); name a module that has one, "
            "or a 'package.module.factory' callable"
        )
    module_name, _, attribute = env.rpartition(".")
    module = _import_module_if_exists(module_name) if module_name else None
    if module is None:
        raise ValueError(f"unknown PettingZoo env {env!r}: neither {env!r} nor its parent is an importable module")
    factory = getattr(module, attribute, None)
    if factory is None:
        raise ValueError(f"unknown PettingZoo env {env!r}: module {module_name!r} has no {attribute!r}")
    if not callable(factory):
        raise ValueError(f"PettingZoo env factory {env!r} is a {type(factory).__name__}, not a callable")
    return factory


def _import_module_if_exists(name: str) -> Any:
    """Import ``name``; ``None`` when no such module exists (errors inside it propagate as ValueError)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        # Only a missing `name` (or a parent of it) means "not a module"; a module that exists but
        # fails to import one of its own dependencies is an error to report.
        if error.name is not None and (name == error.name or name.startswith(error.name + ".")):
            return None
        raise ValueError(f"cannot import PettingZoo env module {name!r}: {error}") from error
    except ImportError as error:
        raise ValueError(f"cannot import PettingZoo env module {name!r}: {error}") from error


def make_pettingzoo_env(env: str | PettingZooEnvCreator, env_kwargs: Mapping[str, Any] | None = None) -> Any:
    """Build one PettingZoo env.

    Args:
        env: An import path (see :func:`check_pettingzoo_env_name`) or a callable returning a
            ``ParallelEnv`` or ``AECEnv``.
        env_kwargs: Keyword arguments for the factory (e.g. ``{"max_cycles": 25}``).

    Returns:
        The ``pettingzoo.ParallelEnv`` or ``pettingzoo.AECEnv``.

    Raises:
        ImportError: If PettingZoo is not installed.
        ValueError: As :func:`check_pettingzoo_env_name`.
        TypeError: If ``env`` is neither a string nor a callable, or what it builds is not a
            PettingZoo env (naming the type it got).
    """
    pettingzoo = _pettingzoo()
    if isinstance(env, str):
        factory = check_pettingzoo_env_name(env)
    elif callable(env):
        factory = env
    else:
        raise TypeError(f"env must be an import path or a callable returning a PettingZoo env, got {env!r}")
    built = factory(**dict(env_kwargs or {}))
    if not isinstance(built, (pettingzoo.ParallelEnv, pettingzoo.AECEnv)):
        raise TypeError(
            f"PettingZoo env {env!r} built a {type(built).__name__}; expected a pettingzoo.ParallelEnv or AECEnv"
        )
    return built


def is_parallel_env(env: Any) -> bool:
    """Whether ``env`` is a PettingZoo ``ParallelEnv`` (all agents act at once) rather than an ``AECEnv``."""
    return isinstance(env, _pettingzoo().ParallelEnv)
