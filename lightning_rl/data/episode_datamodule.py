"""``EpisodeDataModule``: the on-policy data module under the name it had before the split.

Configs and code written for it keep working for on-policy rollouts, and its checkpoints
keep their entry name. Its off-policy arguments moved to ``OffPolicyDataModule``.
"""

from __future__ import annotations

from lightning_rl.data.on_policy import OnPolicyDataModule


class EpisodeDataModule(OnPolicyDataModule):
    """``OnPolicyDataModule`` by its former name: the same arguments and behaviour.

    Off-policy arguments (``replay_buffer_capacity``, ``train_freq``, ...) raise a
    ``ValueError`` that names ``lightning_rl.data.OffPolicyDataModule``, which takes them now.
    """
