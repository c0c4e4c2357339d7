"""The vocabulary every layer shares: columns, spaces, distributions, schedules, batches,
metrics, checkpoints, RL modules, the target-network API and the typed train item."""
