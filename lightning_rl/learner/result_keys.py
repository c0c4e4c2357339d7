"""The keys of a Learner's update results, with RLlib's names and strings.

``Learner.update_from_batch`` returns ``{module_id: {key: float}}`` (plus an ``ALL_MODULES``
entry); these are the keys the base Learner reports. Each is also readable as a class
attribute of the Learner (``Learner.TOTAL_LOSS_KEY``), as in RLlib.
"""

from __future__ import annotations

TOTAL_LOSS_KEY = "total_loss"
LR_KEY = "learning_rate"
NUM_ENV_STEPS_TRAINED = "num_env_steps_trained"
NUM_ENV_STEPS_TRAINED_LIFETIME = "num_env_steps_trained_lifetime"
NUM_MODULE_STEPS_TRAINED = "num_module_steps_trained"
NUM_MODULE_STEPS_TRAINED_LIFETIME = "num_module_steps_trained_lifetime"
MODULE_TRAIN_BATCH_SIZE_MEAN = "module_train_batch_size_mean"
WEIGHTS_SEQ_NO = "weights_seq_no"
NUM_NON_FINITE_UPDATES_SKIPPED = "num_non_finite_updates_skipped"
# Iterations over a data iterator (``Learner.update_from_iterator``): this update's and lifetime.
DATASET_NUM_ITERS_TRAINED = "dataset_num_iters_trained"
DATASET_NUM_ITERS_TRAINED_LIFETIME = "dataset_num_iters_trained_lifetime"
EPISODE_RETURN_MEAN = "episode_return_mean"
TRAIN_RETURN_KEY = f"env_runners/{EPISODE_RETURN_MEAN}"
