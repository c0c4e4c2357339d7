"""Algorithms: one module per algorithm, each with its RL module and Learner.

Importing the package loads all of them, so that a checkpoint's class name (looked up among
the loaded classes, never imported) finds the package's own Learners and RLModules.
"""

from lightning_rl.algorithms import appo, bc, cql, dqn, impala, iql, marwil, ppo, sac  # noqa: F401
