"""``ClosesOnce``: the closing both env runners share: ``close()`` once, and ``with runner:``."""

from __future__ import annotations

from typing import Self


class ClosesOnce:
    """Closes its envs on the first ``close()`` (later calls are no-ops), and at the end of a ``with`` block.

    A subclass says how its envs close (``_close_envs``).
    """

    _closed = False

    def close(self) -> None:
        """Close the envs (and any subprocesses they run in); calling it again is a no-op."""
        if not self._closed:
            self._closed = True
            self._close_envs()

    def _close_envs(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
