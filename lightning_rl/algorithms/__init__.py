"""Algorithms: one module per algorithm, each with its RL module and Learner."""
