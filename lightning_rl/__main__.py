"""``python -m lightning_rl``: the same as the ``lightning-rl`` command."""

from lightning_rl.cli import main

main()
