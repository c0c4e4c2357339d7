"""Single-agent episodes: the observations, actions and rewards of one episode, or a chunk of it.

An episode of length ``L`` holds ``L + 1`` observations (the reset observation, then the one
after each step) and ``L`` actions, rewards and extra model outputs (``action_logp``,
``action_dist_inputs``, ``vf_preds``, ...). The last observation is the true final one when
the episode terminated or was truncated, and the next observation when a chunk was cut by a
rollout length, so the Learner can bootstrap from it in both cases.

An episode is either built step by step (``add_env_reset`` / ``add_env_step`` append to
Python lists, then ``to_numpy`` stacks them once), or built from arrays, as
:class:`~lightning_rl.env.env_runner.EnvRunner` does. A long episode sampled over several
``sample()`` calls arrives as chunks that share ``id_``; ``concat_episode`` joins them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_NO_ACTIONS = np.zeros((0,), dtype=np.float32)


class SingleAgentEpisode:
    """One episode of one agent, or a chunk of it (numpy-backed).

    Fields (public attributes): ``observations`` (``len + 1``), ``actions``, ``rewards`` and
    every ``extra_model_outputs[key]`` (``len`` each), ``infos`` (``len + 1`` dicts, or
    empty when not recorded), ``is_terminated``, ``is_truncated``, ``id_``, ``t_started``.
    While :attr:`is_numpy` is False the fields are Python lists; afterwards numpy arrays
    whose first axis is time.

    Args:
        id_: The episode's id; all chunks of one episode share it. A new uuid4 hex when None.
        observations: ``len + 1`` observations, or none for an episode not reset yet. An
            ``np.ndarray`` makes a numpy episode (the other fields are converted with
            ``np.asarray``); a list makes a list-backed one.
        actions: ``len`` actions.
        rewards: ``len`` rewards.
        infos: ``len + 1`` info dicts, or none when infos are not recorded.
        terminated: Whether the episode ended in a terminal state after its last step.
        truncated: Whether the episode was cut (e.g. by a time limit) after its last step.
        extra_model_outputs: ``{key: len values}`` recorded from the module's forward pass.
        t_started: The episode timestep at which this chunk starts (0 for a whole episode).

    Raises:
        ValueError: Naming the field and the lengths, if the fields' lengths do not fit
            together, or ``t_started`` is negative, or an episode without observations is
            marked done.
    """

    __slots__ = (
        "id_",
        "t_started",
        "observations",
        "actions",
        "rewards",
        "infos",
        "extra_model_outputs",
        "is_terminated",
        "is_truncated",
        "_is_numpy",
    )

    def __init__(
        self,
        id_: str | None = None,
        *,
        observations: Sequence[Any] | np.ndarray | None = None,
        actions: Sequence[Any] | np.ndarray | None = None,
        rewards: Sequence[float] | np.ndarray | None = None,
        infos: Sequence[dict[str, Any]] | None = None,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: Mapping[str, Sequence[Any] | np.ndarray] | None = None,
        t_started: int = 0,
    ) -> None:
        self.id_ = uuid.uuid4().hex if id_ is None else str(id_)
        if int(t_started) < 0:
            raise ValueError(f"t_started must be >= 0, got {t_started}")
        self.t_started = int(t_started)
        self.is_terminated = bool(terminated)
        self.is_truncated = bool(truncated)
        self.infos: list[dict[str, Any]] = list(infos) if infos is not None else []
        extra = dict(extra_model_outputs or {})
        self._is_numpy = isinstance(observations, np.ndarray)
        if self._is_numpy:
            self.observations = observations
            self.actions = _NO_ACTIONS if actions is None else np.asarray(actions)
            self.rewards = np.asarray([] if rewards is None else rewards, dtype=np.float32)
            self.extra_model_outputs = {key: np.asarray(value) for key, value in extra.items()}
        else:
            self.observations = [] if observations is None else list(observations)
            self.actions = [] if actions is None else list(actions)
            self.rewards = [] if rewards is None else list(rewards)
            self.extra_model_outputs = {key: list(value) for key, value in extra.items()}
        self._validate()

    def _validate(self) -> None:
        num_obs, num_steps = len(self.observations), len(self.actions)
        if num_obs == 0:
            if num_steps or len(self.rewards) or self.infos or any(len(v) for v in self.extra_model_outputs.values()):
                raise ValueError(
                    "an episode without observations cannot hold steps; got "
                    f"{num_steps} actions, {len(self.rewards)} rewards and {len(self.infos)} infos"
                )
            if self.is_done:
                raise ValueError("an episode without observations cannot be terminated or truncated")
            return
        if num_obs != num_steps + 1:
            raise ValueError(
                f"observations must have len(actions) + 1 = {num_steps + 1} entries (the one after "
                f"the last step included), got {num_obs}"
            )
        if len(self.rewards) != num_steps:
            raise ValueError(f"rewards must have len(actions) = {num_steps} entries, got {len(self.rewards)}")
        for key, values in self.extra_model_outputs.items():
            if len(values) != num_steps:
                raise ValueError(
                    f"extra_model_outputs[{key!r}] must have len(actions) = {num_steps} entries, got {len(values)}"
                )
        if self.infos and len(self.infos) != num_obs:
            raise ValueError(
                f"infos must be empty or have len(observations) = {num_obs} entries, got {len(self.infos)}"
            )

    # ------------------------------------------------------------------------------------
    # Building
    # ------------------------------------------------------------------------------------

    def add_env_reset(self, observation: Any, infos: dict[str, Any] | None = None) -> None:
        """Start the episode with the observation returned by ``env.reset()``.

        Args:
            observation: The reset observation.
            infos: The reset info dict; ``None`` when infos are not recorded.

        Raises:
            ValueError: If the episode already has observations.
        """
        if len(self.observations):
            raise ValueError(f"episode {self.id_} already started (it has {len(self.observations)} observations)")
        self._as_lists()
        self.observations.append(observation)
        if infos is not None:
            self.infos.append(infos)

    def add_env_step(
        self,
        observation: Any,
        action: Any,
        reward: float,
        *,
        infos: dict[str, Any] | None = None,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: Mapping[str, Any] | None = None,
    ) -> None:
        """Append one env step: the action taken and what the env returned for it.

        A numpy episode turns back into lists first (a copy of every field, once).

        Args:
            observation: The observation after the step (the true final one if it ended the
                episode).
            action: The action taken.
            reward: The reward received.
            infos: The step's info dict; only recorded when the reset's info was too.
            terminated: Whether the step ended the episode in a terminal state.
            truncated: Whether the episode was cut after this step.
            extra_model_outputs: ``{key: value}`` for this step; the keys must be the same
                at every step.

        Raises:
            ValueError: If the episode has not been reset, is already done, or the extra
                model output keys differ from earlier steps'.
        """
        if not len(self.observations):
            raise ValueError(f"episode {self.id_} has no observation yet; call add_env_reset first")
        if self.is_done:
            raise ValueError(f"episode {self.id_} is already done; start a new episode")
        extra = extra_model_outputs or {}
        if len(self.actions) and set(extra) != set(self.extra_model_outputs):
            raise ValueError(
                f"extra_model_outputs keys {sorted(extra)} differ from the earlier steps' "
                f"{sorted(self.extra_model_outputs)}"
            )
        self._as_lists()
        self.observations.append(observation)
        self.actions.append(action)
        self.rewards.append(reward)
        for key, value in extra.items():
            self.extra_model_outputs.setdefault(key, []).append(value)
        if self.infos:
            self.infos.append({} if infos is None else infos)
        self.is_terminated = bool(terminated)
        self.is_truncated = bool(truncated)

    def to_numpy(self) -> SingleAgentEpisode:
        """Stack the list fields into numpy arrays (time first); a no-op when already numpy.

        Returns:
            ``self``.
        """
        if self._is_numpy:
            return self
        self.observations = np.stack(self.observations) if self.observations else np.zeros((0,), np.float32)
        self.actions = np.stack(self.actions) if self.actions else _NO_ACTIONS
        self.rewards = np.asarray(self.rewards, dtype=np.float32)
        self.extra_model_outputs = {
            key: np.stack(values) if values else np.zeros((0,), np.float32)
            for key, values in self.extra_model_outputs.items()
        }
        self._is_numpy = True
        return self

    def _as_lists(self) -> None:
        if not self._is_numpy:
            return
        self.observations = list(self.observations)
        self.actions = list(self.actions)
        self.rewards = list(self.rewards)
        self.extra_model_outputs = {key: list(values) for key, values in self.extra_model_outputs.items()}
        self._is_numpy = False

    # ------------------------------------------------------------------------------------
    # Reading
    # ------------------------------------------------------------------------------------

    @property
    def is_numpy(self) -> bool:
        """Whether the fields are numpy arrays (after :meth:`to_numpy`, or built from arrays)."""
        return self._is_numpy

    @property
    def is_done(self) -> bool:
        """Whether the episode terminated or was truncated after its last step."""
        return self.is_terminated or self.is_truncated

    @property
    def t(self) -> int:
        """The episode timestep after this chunk's last step: ``t_started + len(self)``."""
        return self.t_started + len(self)

    def __len__(self) -> int:
        return len(self.actions)

    def get_return(self) -> float:
        """Return the sum of this chunk's rewards."""
        return float(np.sum(self.rewards, dtype=np.float64)) if len(self.rewards) else 0.0

    # ---- RLlib's getters (read-only; no lookback buffer here) -------------------------------

    def get_observations(self, indices: int | Sequence[int] | slice | None = None, **kwargs: Any) -> Any:
        """RLlib's getter: the observations at ``indices`` (all ``len + 1`` when ``None``).

        ``indices`` is an int (a negative one counts from the end, as RLlib's default
        ``neg_index_as_lookback=False``), a list of ints or a slice. RLlib's lookback and
        fill options have no meaning here, where episodes keep no lookback buffer.

        Raises:
            ValueError: For ``neg_index_as_lookback``, ``fill`` or ``one_hot_discrete``.
        """
        return _get(self.observations, indices, "get_observations", kwargs)

    def get_actions(self, indices: int | Sequence[int] | slice | None = None, **kwargs: Any) -> Any:
        """RLlib's getter: the actions at ``indices`` (as ``get_observations``)."""
        return _get(self.actions, indices, "get_actions", kwargs)

    def get_rewards(self, indices: int | Sequence[int] | slice | None = None, **kwargs: Any) -> Any:
        """RLlib's getter: the rewards at ``indices`` (as ``get_observations``)."""
        return _get(self.rewards, indices, "get_rewards", kwargs)

    def get_infos(self, indices: int | Sequence[int] | slice | None = None, **kwargs: Any) -> Any:
        """RLlib's getter: the info dicts at ``indices`` (as ``get_observations``)."""
        return _get(self.infos, indices, "get_infos", kwargs)

    def get_extra_model_outputs(
        self, key: str, indices: int | Sequence[int] | slice | None = None, **kwargs: Any
    ) -> Any:
        """RLlib's getter: the model output ``key`` recorded at ``indices`` (as ``get_observations``).

        Raises:
            KeyError: Naming the recorded keys, for a key that was not recorded.
        """
        if key not in self.extra_model_outputs:
            raise KeyError(f"no extra model output {key!r} in this episode; it has {sorted(self.extra_model_outputs)}")
        return _get(self.extra_model_outputs[key], indices, "get_extra_model_outputs", kwargs)

    def set_observations(self, **kwargs: Any) -> None:
        """Refused: see ``set_rewards``."""
        _refuse_set("set_observations", "obs")

    def set_actions(self, **kwargs: Any) -> None:
        """Refused: see ``set_rewards``."""
        _refuse_set("set_actions", "actions")

    def set_rewards(self, **kwargs: Any) -> None:
        """Refused with an error naming what to do here instead.

        In RLlib a Learner connector piece may change the episodes before the batch is made of
        them. Here every piece runs after ``AddColumnsFromEpisodes`` has made the batch, so a
        changed episode would change nothing: the piece changes ``batch[module_id][column]``.
        """
        _refuse_set("set_rewards", "rewards")

    def set_extra_model_outputs(self, **kwargs: Any) -> None:
        """Refused: see ``set_rewards``."""
        _refuse_set("set_extra_model_outputs", "the output's column")

    def __getitem__(self, item: slice) -> SingleAgentEpisode:
        """Return the steps ``item.start .. item.stop - 1`` as a new chunk of the same episode.

        The chunk holds observations ``start .. stop`` (both ends included), keeps ``id_``,
        starts at ``t_started + start``, and is terminated or truncated only if it contains
        this chunk's last step. Numpy fields are views, not copies.

        Args:
            item: A slice of step indices; negative and omitted bounds work as for lists.

        Raises:
            TypeError: For anything but a slice.
            ValueError: For a slice step other than 1.
        """
        if not isinstance(item, slice):
            raise TypeError(f"episodes are indexed by slices of steps (episode[a:b]), got {type(item).__name__}")
        start, stop, step = item.indices(len(self))
        if step != 1:
            raise ValueError(f"episode slices take step 1 only, got step {item.step}")
        stop = max(start, stop)
        if not len(self.observations):
            return SingleAgentEpisode(self.id_, t_started=self.t_started)
        contains_end = stop == len(self)
        return SingleAgentEpisode(
            self.id_,
            observations=self.observations[start : stop + 1],
            actions=self.actions[start:stop],
            rewards=self.rewards[start:stop],
            infos=self.infos[start : stop + 1] if self.infos else None,
            terminated=self.is_terminated and contains_end,
            truncated=self.is_truncated and contains_end,
            extra_model_outputs={key: values[start:stop] for key, values in self.extra_model_outputs.items()},
            t_started=self.t_started + start,
        )

    # ------------------------------------------------------------------------------------
    # Joining chunks
    # ------------------------------------------------------------------------------------

    def concat_episode(self, other: SingleAgentEpisode) -> None:
        """Append ``other``, the next chunk of this episode, in place.

        ``other``'s first observation is this chunk's last one, so it is kept once. When only
        one side recorded infos, the other side's steps get empty info dicts.

        Args:
            other: A chunk with the same ``id_`` that starts where this one ends.

        Raises:
            ValueError: Naming the mismatch, if the ids differ, ``other.t_started != self.t``,
                this episode is already done, the shared observation differs, or the extra
                model output keys differ. Nothing changes then.
        """
        if other.id_ != self.id_:
            raise ValueError(f"cannot concat episode {other.id_} to episode {self.id_}: the ids differ")
        if self.is_done:
            raise ValueError(f"cannot concat to episode {self.id_}: it is already done at t={self.t}")
        if other.t_started != self.t:
            raise ValueError(
                f"cannot concat to episode {self.id_}: the chunk starts at t_started={other.t_started}, "
                f"this episode ends at t={self.t}"
            )
        if not len(other.observations):
            return
        if not len(self.observations):
            raise ValueError(f"cannot concat to episode {self.id_}: it has no observations yet")
        if not _same_observation(self.observations[-1], other.observations[0]):
            raise ValueError(
                f"cannot concat to episode {self.id_}: the chunk's first observation differs from "
                "this episode's last observation"
            )
        if len(other) and len(self) and set(other.extra_model_outputs) != set(self.extra_model_outputs):
            raise ValueError(
                f"cannot concat to episode {self.id_}: the chunk's extra_model_outputs keys "
                f"{sorted(other.extra_model_outputs)} differ from {sorted(self.extra_model_outputs)}"
            )
        if self.infos or other.infos:
            own = self.infos or [{} for _ in range(len(self.observations))]
            self.infos = own + (other.infos[1:] if other.infos else [{} for _ in range(len(other))])
        if self._is_numpy:
            # An episode without steps has placeholder arrays of no particular dtype: take
            # the chunk's arrays instead of concatenating (which would change their dtype).
            # Read once, before the fields below change this episode's length.
            had_steps = len(self) > 0

            def joined(mine: np.ndarray, theirs: Any) -> np.ndarray:
                return np.concatenate([mine, np.asarray(theirs)]) if had_steps else np.asarray(theirs)

            self.observations = np.concatenate([self.observations, np.asarray(other.observations[1:])])
            if len(other):
                self.actions = joined(self.actions, other.actions)
                self.rewards = np.concatenate([self.rewards, np.asarray(other.rewards, dtype=np.float32)])
                self.extra_model_outputs = {
                    key: joined(self.extra_model_outputs.get(key, _NO_ACTIONS), values)
                    for key, values in other.extra_model_outputs.items()
                }
        else:
            self.observations.extend(list(other.observations[1:]))
            self.actions.extend(list(other.actions))
            self.rewards.extend(list(other.rewards))
            for key, values in other.extra_model_outputs.items():
                self.extra_model_outputs.setdefault(key, []).extend(list(values))
        self.is_terminated = other.is_terminated
        self.is_truncated = other.is_truncated

    def __repr__(self) -> str:
        if self.is_terminated:
            state = "terminated"
        elif self.is_truncated:
            state = "truncated"
        else:
            state = "running"
        return (
            f"SingleAgentEpisode(id_={self.id_[:8]}, t_started={self.t_started}, len={len(self)}, "
            f"return={self.get_return():.4g}, {state})"
        )


def _same_observation(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "fc" and b.dtype.kind in "fc":
        return np.array_equal(a, b, equal_nan=True)
    return np.array_equal(a, b)


_GETTER_OPTIONS = ("neg_index_as_lookback", "fill", "one_hot_discrete", "return_list")


def _get(values: Any, indices: int | Sequence[int] | slice | None, getter: str, options: Mapping[str, Any]) -> Any:
    """``values`` at ``indices`` for RLlib's episode getters; options other than their defaults are refused."""
    unknown = sorted(set(options) - set(_GETTER_OPTIONS))
    if unknown:
        raise TypeError(f"{getter}() got unexpected arguments {unknown}")
    used = sorted(name for name, value in options.items() if value not in (None, False))
    if used:
        raise ValueError(
            f"{getter}({', '.join(f'{name}=...' for name in used)}): RLlib's lookback, fill and one-hot options have "
            "no counterpart here (episodes keep no lookback buffer); index the steps you need, or read the arrays"
        )
    if indices is None:
        return values
    if isinstance(indices, (int, np.integer, slice)):
        return values[indices]
    if isinstance(values, np.ndarray):
        return values[list(indices)]
    return [values[index] for index in indices]


def _refuse_set(setter: str, column: str) -> None:
    raise ValueError(
        f"SingleAgentEpisode.{setter}: in RLlib a Learner connector piece changes the episodes before the batch is "
        "made of them; here every piece runs after AddColumnsFromEpisodes has made the batch, so changing an episode "
        f"would change nothing. Change batch[module_id][{column!r}] in your piece instead"
    )
