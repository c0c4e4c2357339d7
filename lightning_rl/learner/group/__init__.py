"""The LearnerGroup: several Learners (processes or one local Learner) driven from a plain Python loop.

``learner_group`` is the public class; the private modules are its parts: ``_data`` cuts an
update's data into shards, ``_episodes`` turns a shard of episodes into arrays and back,
``_shared`` carries a shard's arrays through shared memory, ``_local`` runs one Learner in this
process (async updates on a thread), ``_processes`` starts and drives learner processes,
``_worker`` is what each of those processes runs, and ``_protocol`` the commands and replies
between them.
"""

from lightning_rl.learner.group.learner_group import LearnerGroup, LearnerGroupError

__all__ = ["LearnerGroup", "LearnerGroupError"]
