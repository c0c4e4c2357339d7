"""Replay buffers for off-policy learners: uniform and proportional prioritized replay.

The names off-policy code imports, gathered from the small modules that hold them:

- :mod:`~lightning_rl.data.uniform_replay`: ``ReplayBuffer``, the ring of transitions, its
  adding, uniform sampling and state.
- :mod:`~lightning_rl.data.prioritized_replay`: ``PrioritizedReplayBuffer`` (Schaul et al.
  2016, "Prioritized Experience Replay").
- :mod:`~lightning_rl.data.replay_n_step`: the sample columns ``N_STEP``, ``WEIGHTS`` and
  ``BATCH_INDEXES``, and the n-step walk that fills them.
- :mod:`~lightning_rl.data.replay_rows`, :mod:`~lightning_rl.data.replay_state`,
  :mod:`~lightning_rl.data.replay_checks` and :mod:`~lightning_rl.data.priority_tree`:
  the parts those buffers are built from.
"""

from lightning_rl.data.prioritized_replay import PrioritizedReplayBuffer

# The tree under its former private name, which tests/test_replay_buffer.py imports from here.
from lightning_rl.data.priority_tree import PriorityTree as _PriorityTree  # noqa: F401
from lightning_rl.data.replay_n_step import BATCH_INDEXES, N_STEP, WEIGHTS
from lightning_rl.data.uniform_replay import ReplayBuffer

__all__ = ["BATCH_INDEXES", "N_STEP", "WEIGHTS", "PrioritizedReplayBuffer", "ReplayBuffer"]
