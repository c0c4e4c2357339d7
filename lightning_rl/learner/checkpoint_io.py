"""``AtomicCheckpointIO``: the Lightning checkpoint plugin that writes whole files or none, and checks them on load.

Lightning's own ``TorchCheckpointIO`` serialises a checkpoint into memory and moves it into
place through fsspec, which writes a temporary file under ``$TMPDIR``: when the checkpoint
directory is on another filesystem, that move is a copy, and a process killed during it
leaves a truncated checkpoint under its final name (and the temporary file behind). This
plugin writes beside the target instead (``lightning_rl.core.checkpoint.atomic_write``) and
loads only plain data, with the file's checksum checked::

    trainer = Trainer(plugins=[AtomicCheckpointIO()], callbacks=[ModelCheckpoint(...)])
"""

from __future__ import annotations

import os
from typing import Any

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lightning_rl.core.checkpoint import (
    checkpoint_file,
    load_checked,
    remove_stale_temporary_files,
    save_checkpoint_file,
)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Save checkpoints atomically with a checksum; load them as plain data, checked.

    ``save_checkpoint`` writes a temporary file in the target's directory, fsyncs it,
    renames it into place with ``os.replace`` and fsyncs the directory; on any error the
    temporary file is removed, and temporary files of saves that were killed are removed by
    the next save into that directory. The file is a plain ``torch.save`` file holding the
    checkpoint plus its checksum under ``"lightning_rl_checksum"``, so any tool loads it.

    ``load_checkpoint`` loads with ``torch.load(weights_only=True)`` and checks the
    checksum (files without one, written by other plugins, still load), then removes the
    temporary files of killed saves beside the checkpoint (a resumed run saves elsewhere,
    so no later save there would). Every bad file is a
    ``ValueError`` of one line naming the file and the problem. ``remove_checkpoint`` is
    Lightning's. Only local paths are supported.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically, with its checksum; called by ``Trainer.save_checkpoint``.

        Raises:
            TypeError: For ``storage_options`` (as Lightning's plugin).
            ValueError: For a remote path (``s3://...``).
        """
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        save_checkpoint_file(checkpoint, _local(path))

    def load_checkpoint(
        self,
        path: str | os.PathLike,
        map_location: Any = lambda storage, location: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Load the checkpoint at ``path`` as plain data and check its checksum; called when a fit resumes.

        Args:
            path: The checkpoint file.
            map_location: As ``torch.load``'s (Lightning passes one).
            weights_only: ``None`` or ``True``; the file is always loaded as plain data.

        Raises:
            ValueError: One line naming the file: missing, empty, truncated, garbage, holding
                code, or a checksum mismatch; and for ``weights_only=False``, which this
                plugin never does.
        """
        if weights_only is False:
            raise ValueError(
                f"{type(self).__name__} loads checkpoints as plain data only (weights_only=True): a checkpoint "
                "never runs code"
            )
        file = checkpoint_file(_local(path))
        checkpoint = load_checked(file, map_location=map_location)
        # A resumed run saves elsewhere (a new version directory), so the temporary file of a
        # save killed beside this checkpoint would otherwise stay forever.
        remove_stale_temporary_files(file.parent)
        return checkpoint


def _local(path: str | os.PathLike) -> str:
    if "://" in str(path):
        raise ValueError(f"{path}: AtomicCheckpointIO writes and reads local files only")
    return os.fspath(path)
