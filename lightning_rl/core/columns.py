"""Names shared across the package: batch columns, module ids and result keys.

The strings are RLlib's, so batches and results read the same in both libraries.
"""

DEFAULT_MODULE_ID = "default_policy"
"""The id a single-module learner trains its module under."""

ALL_MODULES = "__all_modules__"
"""Result key for numbers that sum or span over every module."""

NUM_ENV_STEPS_SAMPLED_LIFETIME = "num_env_steps_sampled_lifetime"
"""The lifetime env-step counter: sampled by the env runner, it drives the schedules."""


class Columns:
    """Column names of a train batch (``{column: Tensor[B, ...]}``)."""

    OBS = "obs"
    NEXT_OBS = "new_obs"
    ACTIONS = "actions"
    REWARDS = "rewards"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    ACTION_LOGP = "action_logp"
    ACTION_DIST_INPUTS = "action_dist_inputs"
    VF_PREDS = "vf_preds"
    ADVANTAGES = "advantages"
    VALUE_TARGETS = "value_targets"
    BOOTSTRAP_OBS = "bootstrap_obs"
    """The observation whose value completes a dataset row's ``value_targets``: the final
    observation of the row's episode (see :data:`BOOTSTRAP_DISCOUNT`). In a stateful module's
    sequences, ``[S, T, ...]``: the last chunk of the sequence's episode, ending in that final
    observation, which a recurrent value network runs over from its initial state (see
    :data:`BOOTSTRAP_STEPS`)."""
    BOOTSTRAP_STEPS = "bootstrap_steps"
    """``[S]``, the real steps of each sequence's ``bootstrap_obs`` chunk; the final observation is
    its last, at ``bootstrap_steps - 1``. An episode of ``T`` steps cut every ``max_seq_len = L``
    steps, with its final observation as one step more, has that observation in the chunk
    starting at step ``L * floor(T / L)``: ``T % L + 1`` steps (RLlib's grid, which values an
    episode with one time step added at its end)."""
    BOOTSTRAP_PREV_ACTIONS = "bootstrap_prev_actions"
    """``[S, T, ...]``: :data:`PREV_ACTIONS` of the ``bootstrap_obs`` chunk's steps."""
    BOOTSTRAP_PREV_REWARDS = "bootstrap_prev_rewards"
    """``[S, T]``: :data:`PREV_REWARDS` of the ``bootstrap_obs`` chunk's steps."""
    BOOTSTRAP_DISCOUNT = "bootstrap_discount"
    """``gamma^(T - t)`` for row ``t`` of an episode of ``T`` steps that did not terminate (it was
    truncated, or its recording stopped), 0 for one that terminated: the discounted return of the
    whole episode, had it gone on, is ``value_targets + bootstrap_discount * V(bootstrap_obs)``."""
    LOSS_MASK = "loss_mask"
    ACTION_MASK = "action_mask"
    """Which actions are legal, ``[B, n]`` (see :mod:`lightning_rl.core.action_masks`)."""
    STATE_IN = "state_in"
    """A recurrent module's state before each row's first step: ``{name: Tensor[B, ...]}`` in a
    pass's batch, one packed float vector per step in episodes (see :mod:`lightning_rl.core.recurrent`)."""
    STATE_OUT = "state_out"
    """A recurrent module's state after each row's last step, ``{name: Tensor[B, ...]}``."""
    PREV_ACTIONS = "prev_actions"
    """The action taken just before each step, ``[B, T, ...]`` (zeros at an episode's first step)."""
    PREV_REWARDS = "prev_rewards"
    """The reward received just before each step, ``[B, T]`` (zero at an episode's first step)."""
    VALUES_BOOTSTRAPPED = "values_bootstrapped"
    """``V(x_{t+1})``, the value of the observation after each step (0 where the step
    terminated its episode), from the module's weights when the batch was made (RLlib's name)."""
    LAST_IN_CHUNK = "last_in_chunk"
    """True on the last row of each episode chunk: where a sequence of consecutive rows ends."""
    EMBEDDINGS = "embeddings"
    # RLlib's names for columns a user's connector piece adds (no built-in piece writes them).
    RETURNS_TO_GO = "returns_to_go"
    INTRINSIC_REWARDS = "intrinsic_rewards"
    EPS_ID = "eps_id"


# Component names of a Learner's state (``Learner.get_state(components=...)``).
COMPONENT_RL_MODULE = "rl_module"
COMPONENT_OPTIMIZER = "optimizer"
COMPONENT_METRICS_LOGGER = "metrics_logger"
