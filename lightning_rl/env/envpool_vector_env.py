"""``vectorize_mode="envpool"``: EnvPool's C++ env pool behind a gymnasium ``VectorEnv`` in SAME_STEP autoreset.

`EnvPool <https://github.com/sail-sg/envpool>`_ (``pip install "lightning-rl[envpool]"``) steps
classic-control, Box2D, MuJoCo and Atari envs in C++ threads. Its own autoreset is
gymnasium's ``NEXT_STEP`` one: the step after an episode ended resets that env and ignores
its action. The runner (see :mod:`lightning_rl.env.rollout`) relies on ``SAME_STEP``: a step
that ends an episode returns the next episode's reset observation, and the true final
observation in ``infos["final_obs"]``. :class:`EnvPoolVectorEnv` presents that: after a step in
which some envs ended, it resets exactly those envs at once (``reset(env_id=...)``, one more
call into the pool, only on such steps) and returns their reset observations in place of the
final ones. Everything downstream (``GuardedVectorEnv``, episodes, normalization, evaluation)
then sees the vector env the gymnasium path builds.

What differs from the gymnasium path, and why:

- **Time limits.** EnvPool reports an episode whose last step is both a terminal state and
  the ``max_episode_steps``-th step as truncated only (its gymnasium API computes
  ``terminated = done & ~truncated``), so such an episode would be bootstrapped from a
  terminal state. Gymnasium's ``TimeLimit`` reports both. So the adapter keeps the time
  limit itself: the pool is made with ``max_episode_steps + 1`` (its own truncation never
  comes first) and a step is truncated when EnvPool's ``elapsed_step`` reaches
  ``max_episode_steps`` (the env's EnvPool default, or ``env_kwargs["max_episode_steps"]``),
  terminated as EnvPool says.
- **Seeds.** EnvPool seeds its envs once, when the pool is made (``reset(seed=...)`` is
  ignored there), env ``i`` with ``seed + i``. Here env ``i`` gets ``seed + i`` too; a reset
  with a seed (the runner's first reset uses the seed the pool was made with, so it costs
  nothing; its later full resets pass fresh seeds) makes a new pool with those seeds, so that
  evaluation and resumed runs do not replay the first episodes. EnvPool's seeds are int32:
  seeds are taken modulo ``2**31 - 1``. The initial states are EnvPool's own random draws,
  not gymnasium's for the same seed (C++ generators, not numpy's), so the same seed gives
  other episodes than ``"sync"``; the dynamics are EnvPool's C++ ports of gymnasium's.
- **Infos.** EnvPool's bookkeeping keys (``env_id``, ``players``, ``elapsed_step``) are left
  out, so an env without infos of its own (CartPole) returns ``{}`` as gymnasium's does; an
  env's own keys (MuJoCo's ``x_position``, Atari's ``lives``) are kept, for every env.
- **Spaces.** EnvPool's, except a ``Box`` lower bound of the float type's smallest *positive*
  value (``numpy.finfo(dtype).tiny``, which some EnvPool specs, LunarLander's among them, use
  where they mean the most negative value), which is read as ``-inf``: observations below it
  are normal there. MuJoCo action spaces are float64 in EnvPool (float32 in gymnasium).
- **Not available:** callables (env factories), wrappers, ``record_video`` and
  ``restart_failed_sub_environments`` (they work on gymnasium env objects, which EnvPool
  does not have), and ``env_kwargs`` other than the options of the env's EnvPool spec
  (``max_episode_steps``, ``frame_skip``, ...) and its pool options ``num_threads`` and
  ``thread_affinity_offset``. :func:`check_envpool_arguments` names what is wrong.
- **Hangs.** The pool steps in C++ threads while this thread waits in C++, so a stuck env is
  not interrupted by ``sample_timeout_s`` (as for a ``"sync"`` env stuck in C code).

envpool itself is imported only here, and only when an envpool env is asked for.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

try:  # gymnasium >= 1.1 (env_factory.check_autoreset_support names the version otherwise)
    from gymnasium.vector import AutoresetMode
except ImportError:  # pragma: no cover - depends on the installed gymnasium
    AutoresetMode = None  # type: ignore[assignment,misc]

ENVPOOL_EXTRA = 'pip install "lightning-rl[envpool]"'
# EnvPool's seeds are C++ int32s: env seeds are taken modulo this.
SEED_MODULUS = 2**31 - 1
# Keys of EnvPool's infos that are the pool's bookkeeping, not the env's.
_POOL_INFO_KEYS = frozenset({"env_id", "players", "elapsed_step"})
# Config keys of an EnvPool spec that the pool sets itself (from num_envs and the seed) or
# that only its own Python API may set.
_RESERVED_CONFIG_KEYS = frozenset(
    {"num_envs", "batch_size", "seed", "env_seed", "max_num_players", "base_path", "gym_reset_return_info"}
)

PoolFactory = Callable[..., Any]


def import_envpool() -> Any:
    """Import envpool, or say how to install it.

    Raises:
        ImportError: Naming the extra that installs it.
    """
    try:
        import envpool
    except ImportError as error:
        raise ImportError(f"vectorize_mode='envpool' needs the envpool package: {ENVPOOL_EXTRA}") from error
    return envpool


@functools.lru_cache(maxsize=1)
def envpool_env_ids() -> frozenset[str]:
    """The env ids the installed EnvPool registers (cached: the registry is fixed at import)."""
    return frozenset(import_envpool().list_all_envs())


def check_envpool_arguments(
    env: Any,
    env_kwargs: Mapping[str, Any] | None,
    wrappers: Sequence[Any] | None,
    *,
    record_video: bool = False,
    restart_failed_sub_environments: bool = False,
) -> str:
    """Check that EnvPool can build what the arguments ask for, before anything is built.

    Args:
        env: The env argument: must be an id EnvPool registers (``"CartPole-v1"``,
            ``"Hopper-v5"``, ``"Pong-v5"``).
        env_kwargs: Must be options of that id's EnvPool spec, or ``num_threads`` /
            ``thread_affinity_offset``.
        wrappers: Must be empty (training and evaluation wrappers alike).
        record_video: Must be false.
        restart_failed_sub_environments: Must be false.

    Returns:
        The env id.

    Raises:
        ImportError: If envpool is not installed (naming the extra).
        ValueError: Naming the argument, what is wrong and what ``"envpool"`` supports.
    """
    import_envpool()
    unsupported = "use vectorize_mode='sync' or 'async' for it"
    if not isinstance(env, str):
        raise ValueError(
            f"vectorize_mode='envpool' builds envs by EnvPool id (a string such as 'CartPole-v1'), not from a "
            f"callable ({env!r}); {unsupported}"
        )
    if wrappers:
        raise ValueError(
            f"vectorize_mode='envpool' cannot apply wrappers ({len(wrappers)} given): EnvPool's envs are C++ "
            f"objects, not gymnasium envs; {unsupported}, or set the env's own options in env_kwargs"
        )
    if record_video:
        raise ValueError(
            "vectorize_mode='envpool' cannot record videos (record_video / evaluation_video): EnvPool's envs are "
            f"not gymnasium envs a frame recorder can wrap; {unsupported}"
        )
    if restart_failed_sub_environments:
        raise ValueError(
            "vectorize_mode='envpool' cannot restart one failed env (restart_failed_sub_environments): its envs "
            f"run inside one C++ pool; {unsupported}"
        )
    ids = envpool_env_ids()
    if env not in ids:
        close = difflib.get_close_matches(env, sorted(ids), n=3)
        hint = f"; did you mean {close}?" if close else ""
        raise ValueError(
            f"EnvPool has no env {env!r}{hint} (envpool.list_all_envs() lists its {len(ids)} ids; "
            f"for other envs {unsupported})"
        )
    accepted = envpool_options(env)
    unknown = sorted(set(env_kwargs or {}) - set(accepted))
    if unknown:
        raise ValueError(
            f"vectorize_mode='envpool': env_kwargs {unknown} are not options of EnvPool's {env!r}; it takes "
            f"{sorted(accepted)}"
        )
    return env


def envpool_options(env_id: str) -> dict[str, Any]:
    """The ``env_kwargs`` EnvPool's ``env_id`` takes, with their defaults.

    Its spec's config, less what the pool sets itself.
    """
    config = import_envpool().make_spec(env_id).config._asdict()  # a namedtuple
    return {key: value for key, value in config.items() if key not in _RESERVED_CONFIG_KEYS}


def envpool_time_limit(env_id: str, env_kwargs: Mapping[str, Any] | None) -> int | None:
    """The ``max_episode_steps`` an EnvPool env runs with.

    ``env_kwargs``'s, else its spec's default; ``None`` if it has none.
    """
    if env_kwargs and "max_episode_steps" in env_kwargs:
        return int(env_kwargs["max_episode_steps"])
    default = envpool_options(env_id).get("max_episode_steps")
    return None if default is None else int(default)


def make_envpool(env_id: str, num_envs: int, env_seeds: list[int], env_kwargs: Mapping[str, Any]) -> Any:
    """Make an EnvPool of ``num_envs`` envs in sync mode (``batch_size == num_envs``).

    Env ``i`` is seeded ``env_seeds[i]``.
    """
    return import_envpool().make(
        env_id, env_type="gymnasium", num_envs=num_envs, batch_size=num_envs,
        seed=env_seeds[0], env_seed=env_seeds, **env_kwargs,
    )  # fmt: skip


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """An EnvPool pool as a gymnasium ``VectorEnv`` in ``AutoresetMode.SAME_STEP`` (see the module docstring).

    Args:
        env_id: An id EnvPool registers (checked by :func:`check_envpool_arguments`).
        num_envs: How many envs the pool steps.
        env_kwargs: Options of the env's EnvPool spec (and ``num_threads``).
        seed: Env ``i`` is seeded ``seed + i`` (modulo ``2**31 - 1``); ``None`` draws a seed
            from fresh entropy.
        make_pool: Makes the pool from ``(env_id, num_envs, env_seeds, env_kwargs)``;
            :func:`make_envpool` by default (tests pass a fake pool with EnvPool's API).
        time_limit: Truncate an episode at this many steps (the env's ``max_episode_steps``,
            see :func:`envpool_time_limit`); the pool is made with one step more, so that
            EnvPool's own truncation never hides a termination. ``None`` leaves truncation
            to the pool.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        seed: int | None = None,
        make_pool: PoolFactory = make_envpool,
        time_limit: int | None = None,
    ) -> None:
        self.env_id = env_id
        self.num_envs = int(num_envs)
        self.time_limit = time_limit
        self._env_kwargs = dict(env_kwargs or {})
        if time_limit is not None:
            self._env_kwargs["max_episode_steps"] = int(time_limit) + 1
        self._make_pool = make_pool
        self._all_ids = np.arange(self.num_envs, dtype=np.int32)
        self._pool: Any = None
        self._pool_seed = 0
        self._build_pool(seed)
        self.single_observation_space = _readable_space(self._pool.single_observation_space)
        self.single_action_space = _readable_space(self._pool.single_action_space)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}
        self.render_mode = None
        self.spec = None
        # The last observations returned, for a partial reset (options["reset_mask"]), which
        # returns every env's observation as gymnasium's vector envs do.
        self._obs: np.ndarray | None = None

    def _build_pool(self, seed: int | None) -> None:
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % SEED_MODULUS)
        env_seeds = [int((seed + index) % SEED_MODULUS) for index in range(self.num_envs)]
        # Close and drop the old pool first: its C++ threads end when it is freed, not when closed.
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._pool = self._make_pool(self.env_id, self.num_envs, env_seeds, self._env_kwargs)
        self._pool_seed = seed
        # A pool made with a seed holds the episodes that seed starts: the first full reset
        # with that same seed uses them rather than making the pool again.
        self._pool_is_fresh = True

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env, or those in ``options["reset_mask"]``.

        Args:
            seed: Env ``i`` starts from ``seed + i`` (a new pool, unless the pool was just
                made with this seed); ``None`` goes on with each env's random stream.
            options: ``{"reset_mask": bool array [num_envs]}`` resets only those envs (no
                seed then); their observations are returned in place of the last ones.

        Raises:
            ValueError: For other options, a list of seeds, or a seed with a reset mask.
        """
        mask = None
        if options:
            unknown = sorted(set(options) - {"reset_mask"})
            if unknown:
                raise ValueError(f"EnvPoolVectorEnv.reset takes options {{'reset_mask'}} only, got {unknown}")
            mask = options.get("reset_mask")
        if seed is not None and not isinstance(seed, (int, np.integer)):
            raise ValueError(f"EnvPoolVectorEnv.reset takes one int seed (env i gets seed + i), got {seed!r}")
        if mask is not None:
            if seed is not None:
                raise ValueError("EnvPoolVectorEnv.reset: a partial reset (reset_mask) takes no seed")
            return self._reset_some(np.asarray(mask, dtype=bool))
        if seed is not None and not (self._pool_is_fresh and int(seed) == self._pool_seed):
            self._build_pool(int(seed))
        self._pool_is_fresh = False
        obs, raw_infos = self._pool.reset(env_id=self._all_ids)
        obs, raw_infos = self._in_env_order(self._all_ids, obs, raw_infos)
        self._obs = obs
        return obs, _env_infos(raw_infos)

    def _reset_some(self, mask: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        if mask.shape != (self.num_envs,):
            raise ValueError(f"reset_mask must have shape ({self.num_envs},), got {mask.shape}")
        if self._obs is None:
            raise ValueError("EnvPoolVectorEnv: reset every env once before resetting some (reset_mask)")
        ids = np.flatnonzero(mask).astype(np.int32)
        obs = np.array(self._obs)
        infos: dict[str, Any] = {}
        if len(ids):
            reset_obs, raw_infos = self._in_env_order(ids, *self._pool.reset(env_id=ids))
            obs[ids] = reset_obs
            for key, value in _env_infos(raw_infos).items():
                column = np.zeros((self.num_envs, *np.shape(value)[1:]), dtype=np.asarray(value).dtype)
                column[ids] = value
                infos[key], infos[f"_{key}"] = column, mask.copy()
        self._obs = obs
        return obs, infos

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env; envs whose episode ended are reset in the same step (SAME_STEP autoreset).

        Returns:
            Observations (reset ones for the envs that ended), rewards, terminateds,
            truncateds and infos; for the envs that ended, ``infos["final_obs"]`` and
            ``infos["final_info"]`` (with their ``_`` masks) hold the last step's.
        """
        obs, rewards, terminateds, truncateds, raw_infos = self._pool.step(np.asarray(actions), env_id=self._all_ids)
        obs, raw_infos, rewards, terminateds, truncateds = self._in_env_order(
            self._all_ids, obs, raw_infos, rewards, terminateds, truncateds
        )
        if self.time_limit is not None:
            # The pool's limit is one step later: this is where gymnasium's TimeLimit truncates.
            truncateds = np.asarray(raw_infos["elapsed_step"]) >= self.time_limit
        infos = _env_infos(raw_infos)
        done = np.logical_or(terminateds, truncateds)
        if done.any():
            obs, infos = self._reset_done(done, obs, infos)
        self._obs = obs
        return obs, rewards, terminateds, truncateds, infos

    def _reset_done(
        self, done: np.ndarray, obs: np.ndarray, step_infos: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset the envs in ``done`` now (EnvPool would on their next step, ignoring its action)."""
        ids = np.flatnonzero(done).astype(np.int32)
        final_obs = np.empty(self.num_envs, dtype=object)
        # Copies: the rows of obs are overwritten with the reset observations below.
        for index in ids:
            final_obs[index] = np.array(obs[index])
        reset_obs, reset_raw = self._in_env_order(ids, *self._pool.reset(env_id=ids))
        obs = np.array(obs)  # EnvPool's arrays may be read-only
        obs[ids] = reset_obs
        reset_infos = _env_infos(reset_raw)
        # EnvPool returns every info key for every env, at resets and steps alike; the top
        # level holds the next episode's first infos for the envs that ended, as gymnasium's.
        infos: dict[str, Any] = {}
        for key, value in step_infos.items():
            column = np.array(value)
            if key in reset_infos:
                column[ids] = reset_infos[key]
            infos[key] = column
        final_info: dict[str, Any] = {}
        for key, value in step_infos.items():
            final_info[key], final_info[f"_{key}"] = np.array(value), done.copy()
        infos["final_obs"], infos["_final_obs"] = final_obs, done.copy()
        infos["final_info"], infos["_final_info"] = final_info, done.copy()
        return obs, infos

    def _in_env_order(self, ids: np.ndarray, obs: Any, raw_infos: dict[str, Any], *arrays: np.ndarray) -> tuple:
        """EnvPool's results, rows in the order of ``ids`` (a sync pool returns them so; checked, cheaply)."""
        returned = np.asarray(raw_infos["env_id"])
        if np.array_equal(returned, ids):
            return (obs, raw_infos, *arrays)
        if sorted(returned.tolist()) != sorted(ids.tolist()):
            raise RuntimeError(f"EnvPool returned envs {returned.tolist()} for a call on envs {ids.tolist()}")
        order = np.argsort(returned)[np.argsort(np.argsort(ids))]
        infos = {key: (value[order] if isinstance(value, np.ndarray) else value) for key, value in raw_infos.items()}
        return (obs[order], infos, *(array[order] for array in arrays))

    def close_extras(self, **kwargs: Any) -> None:
        """Free the pool (its C++ threads end when it is freed)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __repr__(self) -> str:
        return f"EnvPoolVectorEnv({self.env_id!r}, num_envs={self.num_envs}, seed={self._pool_seed})"


def _env_infos(raw_infos: Mapping[str, Any]) -> dict[str, Any]:
    """The env's own info keys: EnvPool's bookkeeping left out."""
    return {key: value for key, value in raw_infos.items() if key not in _POOL_INFO_KEYS}


def _readable_space(space: gym.Space) -> gym.Space:
    """EnvPool's space, with a Box lower bound of ``finfo.tiny`` (meant as the lowest value) read as ``-inf``."""
    if not isinstance(space, gym.spaces.Box) or not np.issubdtype(space.dtype, np.floating):
        return space
    tiny = np.finfo(space.dtype).tiny
    if not (space.low == tiny).any():
        return space
    low = np.where(space.low == tiny, -np.inf, space.low)
    return gym.spaces.Box(low=low.astype(space.dtype), high=space.high, shape=space.shape, dtype=space.dtype)
