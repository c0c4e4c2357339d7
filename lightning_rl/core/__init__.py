"""The core of lightning_rl: RL modules, the Learner and what it is built from."""
