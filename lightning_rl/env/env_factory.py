"""Building the EnvRunner's vector env from an env id or callable and a list of wrapper specs.

An env is given as a registered gymnasium id (``"CartPole-v1"``, or ``"module:Id"`` whose module
registers it), as the import path of a factory (``"package.module.make_env"``, see
:func:`resolve_env`) or as a callable returning a ``gym.Env``; wrappers as classes, callables
``env -> env``, import paths, or ``{"class_path": ..., "init_args": {...}}`` dicts (the form
config files use). Everything is checked here, before any env is built, so a typo fails with
a message that names it rather than deep inside a vector env's worker.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, get_args

import gymnasium as gym

from lightning_rl.core.checkpoint import import_class
from lightning_rl.core.observation_layout import ARRAY_SPACES, ObservationLayout
from lightning_rl.env.env_errors import SubEnvError
from lightning_rl.env.envpool_vector_env import EnvPoolVectorEnv, envpool_time_limit  # envpool itself: on use
from lightning_rl.env.sub_env_guard import make_guarded_env

try:  # gymnasium >= 1.1
    from gymnasium.vector import AutoresetMode
except ImportError:  # pragma: no cover - depends on the installed gymnasium
    AutoresetMode = None  # type: ignore[assignment,misc]

EnvCreator = Callable[..., gym.Env]
#: How the runner's env copies step: gymnasium's ``SyncVectorEnv`` or ``AsyncVectorEnv``, or an
#: EnvPool C++ pool (:mod:`lightning_rl.env.envpool_vector_env`, an optional extra).
VectorizeMode = Literal["sync", "async", "envpool"]
VECTORIZE_MODES: tuple[str, ...] = get_args(VectorizeMode)
WrapperSpec = str | Mapping[str, Any] | Callable[[gym.Env], gym.Env]


def check_autoreset_support() -> None:
    """Refuse a gymnasium without ``AutoresetMode.SAME_STEP`` (older than 1.1).

    Raises:
        RuntimeError: Naming the installed version.
    """
    if AutoresetMode is None:
        raise RuntimeError(f"EnvRunner needs gymnasium >= 1.1 (AutoresetMode.SAME_STEP); found {gym.__version__}")


def check_vectorize_mode(vectorize_mode: str) -> None:
    """Raise a ``ValueError`` naming ``vectorize_mode`` unless it is one of :data:`VECTORIZE_MODES`."""
    if vectorize_mode not in VECTORIZE_MODES:
        raise ValueError(f"vectorize_mode must be one of {VECTORIZE_MODES}, got {vectorize_mode!r}")


def resolve_env(env: str) -> str | EnvCreator:
    """What an env string names: a registered gymnasium env id, or an env factory by import path.

    The rule, tried in this order:

    1. ``"module:EnvId"`` (gymnasium's own form, e.g. ``"ale_py:ALE/Pong-v5"``): ``module`` is
       imported, which registers its envs, and ``EnvId`` must then be registered. A colon
       always means this form; it never names a factory.
    2. An id in gymnasium's registry (``"CartPole-v1"``, ``"ALE/Pong-v5"`` once a package
       registered it) is an env id.
    3. Otherwise a dotted path ``"package.module.function"`` names an env factory: everything
       before the last dot is imported as a module and the callable after it is returned.
       It is called with ``env_kwargs`` and must return a ``gym.Env``.

    Args:
        env: The string from Python, a config file or a flag.

    Returns:
        ``env`` itself for an env id (``gym.make`` takes both id forms), or the factory.

    Raises:
        ValueError: Naming ``env``, for a module that cannot be imported, an id that is not
            registered (with the closest registered ids), or a path whose module lacks the
            name or whose object is not callable.
    """
    if ":" in env:
        module_name, env_id = env.split(":", 1)
        module = _import_env_module(env, module_name)
        if env_id not in gym.registry and callable(getattr(module, env_id, None)):
            raise ValueError(
                f"Unknown env id {env!r}: after importing {module_name!r}, {env_id!r} is not a registered env id "
                f"(a colon always names one); for the env factory {env_id!r}, write {f'{module_name}.{env_id}'!r}"
            )
        _check_registered(env, env_id)
        return env
    if env in gym.registry:
        return env
    module_name, _, attribute = env.rpartition(".")
    if not module_name or not attribute.isidentifier():
        _check_registered(env, env)  # not a path: report the unknown id
    module = _import_env_module(env, module_name)
    factory = getattr(module, attribute, None)
    if factory is None:
        raise ValueError(
            f"Unknown env {env!r}: not in gymnasium's registry, and module {module_name!r} has no {attribute!r} "
            "to use as an env factory"
        )
    if not callable(factory):
        raise ValueError(f"env factory {env!r} is a {type(factory).__name__}, not a callable that returns a gym.Env")
    return factory


def _import_env_module(env: str, module_name: str) -> Any:
    """Import the module an env string names; a ``ValueError`` naming ``env`` if that fails."""
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"Unknown env {env!r}: cannot import module {module_name!r} ({error})") from error


def _check_registered(env: str, env_id: str) -> None:
    """Raise a ``ValueError`` naming ``env`` unless ``env_id`` is in gymnasium's registry."""
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
    hint = f"; did you mean {close}?" if close else ""
    if "/" in env_id and ":" not in env:
        # A namespaced id is registered by its package on import: gymnasium's "module:Id" form does that.
        hint += f" (if a package registers it, name the package first: 'package:{env_id}')"
    raise ValueError(f"Unknown env id {env!r}: it is not in gymnasium's registry{hint}")


def resolve_wrappers(wrappers: Sequence[WrapperSpec]) -> list[Callable[[gym.Env], gym.Env]]:
    """Turn wrapper specs into callables ``env -> env``, in the same order.

    Args:
        wrappers: Wrapper classes or callables (kept as they are), import paths of
            ``gym.Wrapper`` subclasses, or ``{"class_path": ..., "init_args": {...}}`` dicts.

    Raises:
        ValueError: Naming the index, for a path that is not a ``gym.Wrapper`` or a dict
            without ``class_path`` or with other keys.
        TypeError: Naming the index, for a spec that is none of the above.
    """
    resolved = []
    for index, wrapper in enumerate(wrappers):
        if isinstance(wrapper, Mapping):
            unknown = sorted(set(wrapper) - {"class_path", "init_args"})
            if "class_path" not in wrapper or unknown:
                raise ValueError(
                    f"wrappers[{index}]: a wrapper given as a dict needs 'class_path' and optional 'init_args', "
                    f"got keys {sorted(wrapper)}"
                )
            try:
                wrapper_class = import_class(wrapper["class_path"], gym.Wrapper)
            except ValueError as error:
                raise ValueError(f"wrappers[{index}]: {error}") from error
            wrapper = functools.partial(wrapper_class, **dict(wrapper.get("init_args") or {}))
        elif isinstance(wrapper, str):
            try:
                wrapper = import_class(wrapper, gym.Wrapper)
            except ValueError as error:
                raise ValueError(f"wrappers[{index}]: {error}") from error
        elif not callable(wrapper):
            raise TypeError(
                f"wrappers[{index}] must be an import path, a {{class_path, init_args}} dict or a callable "
                f"env -> env, got {wrapper!r}"
            )
        resolved.append(wrapper)
    return resolved


def sendable_wrappers(wrappers: Sequence[WrapperSpec]) -> list[WrapperSpec]:
    """``wrappers`` with the ones ``lightning-rl fit`` built from a config made picklable, in order.

    LightningCLI (jsonargparse) turns a config's ``{class_path, init_args}`` wrapper into
    ``partial(call_without_instantiate_context, <its instantiator>, WrapperClass, **init_args)``.
    That instantiator cannot be pickled, so envs built in other processes (``vectorize_mode="async"``,
    the samplers of ``AsyncSamplingDataModule``) could not take the wrapper. What it calls is
    ``WrapperClass(env, **init_args)``: that partial pickles. Other specs are kept as they are.
    """
    return [_without_instantiator(wrapper) for wrapper in wrappers]


def _without_instantiator(wrapper: WrapperSpec) -> WrapperSpec:
    if (
        isinstance(wrapper, functools.partial)
        and getattr(wrapper.func, "__module__", "").startswith("jsonargparse")
        and len(wrapper.args) == 2
        and isinstance(wrapper.args[1], type)
    ):
        return functools.partial(wrapper.args[1], **wrapper.keywords)
    return wrapper


def make_env(
    env: str | EnvCreator, env_kwargs: dict[str, Any], wrappers: Sequence[Callable[[gym.Env], gym.Env]]
) -> gym.Env:
    """Build one env copy: ``gym.make`` or the creator, then each wrapper in order.

    Module level (not a closure), so that async workers can unpickle it.

    Args:
        env: A checked env id or a callable returning a ``gym.Env``.
        env_kwargs: Passed to ``gym.make`` or the creator (a creator is called without
            arguments when empty).
        wrappers: What :func:`resolve_wrappers` returned.

    Raises:
        TypeError: If the result is not a ``gym.Env``.
    """
    instance = gym.make(env, **env_kwargs) if isinstance(env, str) else (env(**env_kwargs) if env_kwargs else env())
    for wrapper in wrappers:
        instance = wrapper(instance)
    if not isinstance(instance, gym.Env):
        raise TypeError(f"the env creator returned a {type(instance).__name__}, not a gym.Env")
    return instance


def make_vector_env(
    env: str | EnvCreator,
    env_kwargs: dict[str, Any],
    wrappers: Sequence[Callable[[gym.Env], gym.Env]],
    num_envs: int,
    vectorize_mode: VectorizeMode,
    *,
    restart_failed_sub_environments: bool = False,
    seed: int | None = None,
) -> gym.vector.VectorEnv:
    """Build ``num_envs`` copies as one vector env in ``AutoresetMode.SAME_STEP``.

    Each gymnasium copy is wrapped last in a ``SubEnvGuard`` that knows its index, so that its
    failures are named (or, with ``restart_failed_sub_environments``, mended). An EnvPool pool
    has no per-env objects to guard: its arguments were checked by
    :func:`~lightning_rl.env.envpool_vector_env.check_envpool_arguments`.

    Args:
        env, env_kwargs, wrappers: As for :func:`make_env` (for ``"envpool"``: an EnvPool id,
            its EnvPool options, no wrappers).
        num_envs: How many copies.
        vectorize_mode: ``"sync"`` (``SyncVectorEnv``), ``"async"`` (``AsyncVectorEnv``) or
            ``"envpool"`` (``EnvPoolVectorEnv``).
        restart_failed_sub_environments: Rebuild a copy that raises instead of raising.
        seed: ``"envpool"`` only: the seed the pool is made with, which should be the seed
            of the first reset (EnvPool seeds its envs when the pool is made; a reset with
            another seed makes a new pool). Gymnasium copies are seeded at reset.

    Raises:
        ValueError: If the action space is not an array space (Box, Discrete, MultiDiscrete,
            MultiBinary), or the observation space is neither one nor (not with ``"envpool"``)
            a Dict or Tuple of them (see :class:`~lightning_rl.core.observation_layout.ObservationLayout`);
            the vector env is closed first.
        SubEnvError: If an async worker exited while building its env.
    """
    if vectorize_mode == "envpool":
        time_limit = envpool_time_limit(str(env), env_kwargs)
        return _check_spaces(
            EnvPoolVectorEnv(str(env), num_envs, env_kwargs=env_kwargs, seed=seed, time_limit=time_limit),
            flattened_observations=False,
        )
    make_one = functools.partial(make_env, env, env_kwargs, wrappers)
    is_async = vectorize_mode == "async"
    runner_pid = os.getpid() if is_async else None
    env_fns = [
        functools.partial(make_guarded_env, make_one, index, restart=restart_failed_sub_environments, runner_pid=runner_pid)
        for index in range(num_envs)
    ]
    vector_cls = gym.vector.AsyncVectorEnv if is_async else gym.vector.SyncVectorEnv
    try:
        # copy=False: the runner copies every observation into its buffers right away.
        vector_env = vector_cls(env_fns, copy=False, autoreset_mode=AutoresetMode.SAME_STEP)
    except (EOFError, ConnectionError) as error:
        raise SubEnvError(
            f"an async env worker exited while building its env ({type(error).__name__}); its traceback is above"
        ) from error
    return _check_spaces(vector_env, flattened_observations=True)


def _check_spaces(vector_env: gym.vector.VectorEnv, *, flattened_observations: bool) -> gym.vector.VectorEnv:
    """``vector_env`` if the runner can store its spaces; else close it and raise a ``ValueError`` naming the space.

    Args:
        vector_env: The vector env just built.
        flattened_observations: Whether Dict and Tuple observations (stored flattened) are
            accepted; EnvPool's are not.
    """
    observation_space, action_space = vector_env.single_observation_space, vector_env.single_action_space
    problem = None
    if not isinstance(action_space, ARRAY_SPACES):
        problem = (
            "EnvRunner supports Box, Discrete, MultiDiscrete and MultiBinary action spaces; "
            f"the env has {action_space}"
        )
    elif not flattened_observations and not isinstance(observation_space, ARRAY_SPACES):
        problem = (
            "vectorize_mode='envpool' supports Box, Discrete, MultiDiscrete and MultiBinary observation spaces; "
            f"the env has {observation_space} (Dict and Tuple observations need vectorize_mode 'sync' or 'async')"
        )
    else:
        try:
            ObservationLayout(observation_space)
        except ValueError as error:
            problem = f"EnvRunner cannot store this env's observations: {error}"
    if problem is not None:
        vector_env.close()
        raise ValueError(problem)
    return vector_env
