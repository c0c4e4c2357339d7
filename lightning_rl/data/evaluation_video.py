"""Evaluation videos: which evaluations record their first episode, and writing it to TensorBoard.

An environment data module with ``evaluation_video=k`` records every k-th evaluation's first
episode (env 0 of rank 0's evaluation runner, see ``EnvRunner.sample_episodes``) and writes it
to the Trainer's ``TensorBoardLogger`` as a video, tagged ``eval/episode_video`` at the
env-step count, beside the evaluation's scalars. Everything a video needs is checked when the
fit (or ``validate``) sets up, so a missing package or logger fails then, not hours later.

A TensorBoard video is an animated GIF in an image summary, which TensorBoard plays in its
Images tab. ``SummaryWriter.add_video`` writes one, but encodes it with moviepy 1.x, which
with current imageio loses the frame rate (every frame lasts 0 ms, which browsers play at
10 frames per second) and takes ~100 ms per 600x400 frame. The GIF is encoded here with
Pillow (which TensorBoard requires), at the env's ``render_fps``, about 7 times faster.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium.error import DependencyNotInstalled
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_rl.core.checkpoint import atomic_write

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

VIDEO_TAG = "eval/episode_video"
# What TensorBoard plays a video at when the env declares no ``render_fps``.
DEFAULT_FPS = 30
INSTALL_HINT = "pip install 'lightning-rl[video]'"


class EvaluationVideo:
    """Counts evaluations, says which record a video, and writes the video to TensorBoard.

    Args:
        every: Record the ``every``-th, ``2 * every``-th, ... evaluation (Lightning's sanity
            check does not count).
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self.num_evaluations = 0

    def check_setup(self, trainer: Trainer, check_env: Callable[[], None]) -> None:
        """Check that a video can be recorded and written; called on every rank when a fit or validate sets up.

        Args:
            trainer: The Trainer the data module is attached to.
            check_env: Builds one evaluation env and records a frame (``check_records_frames``).

        Raises:
            ValueError: Without a ``TensorBoardLogger`` among the Trainer's loggers, or for an
                env that cannot render rgb frames.
            ModuleNotFoundError: Without Pillow (which encodes the video) or the renderer's
                package (pygame, for the classic-control envs), naming the extra that installs them.
        """
        if _tensorboard_logger(trainer) is None:
            loggers = [type(logger).__name__ for logger in trainer.loggers]
            raise ValueError(
                f"evaluation_video writes videos to TensorBoard, but the Trainer's loggers are {loggers}: add a "
                "lightning.pytorch.loggers.TensorBoardLogger (the Trainer's default logger), or set evaluation_video=None"
            )
        try:
            import PIL  # noqa: F401
        except ImportError as error:
            raise ModuleNotFoundError(
                f"evaluation_video encodes videos with Pillow ({error}): {INSTALL_HINT}"
            ) from error
        try:
            check_env()
        except (ImportError, DependencyNotInstalled) as error:
            raise ModuleNotFoundError(
                f"evaluation_video: the evaluation env cannot render ({error}); {INSTALL_HINT} installs pygame, which "
                "the classic-control envs render with"
            ) from error

    def records_this_evaluation(self, trainer: Trainer) -> bool:
        """Count the evaluation about to run; whether it records a video (only rank 0 records).

        Called once per evaluation on every rank, so the count is the same on all of them.
        """
        if trainer.sanity_checking:
            return False
        self.num_evaluations += 1
        return trainer.global_rank == 0 and self.num_evaluations % self.every == 0

    def log(self, trainer: Trainer, frames: np.ndarray, *, fps: int | None, env_steps: int) -> None:
        """Write ``frames`` (``[T, H, W, 3]`` uint8) to the Trainer's TensorBoard as ``eval/episode_video``.

        Args:
            trainer: The Trainer, on rank 0.
            frames: The recorded episode.
            fps: The env's ``render_fps``; ``None`` for ``DEFAULT_FPS``.
            env_steps: ``num_env_steps_sampled_lifetime``: the video's step, as the scalars'.
        """
        writer = _tensorboard_logger(trainer).experiment
        _write_gif(writer, VIDEO_TAG, frames, fps or DEFAULT_FPS, int(env_steps))
        writer.flush()

    def state_dict(self) -> dict[str, Any]:
        """``{"num_evaluations": ...}``, so that a resumed run keeps recording every k-th evaluation."""
        return {"num_evaluations": self.num_evaluations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``; a state without the count (an older checkpoint) starts from 0."""
        self.num_evaluations = int(state.get("num_evaluations", 0))


def _tensorboard_logger(trainer: Trainer) -> TensorBoardLogger | None:
    return next((logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)), None)


def encode_gif(frames: np.ndarray, fps: int) -> bytes:
    """``frames`` (``[T, H, W, 3]`` uint8) as an animated GIF that plays at ``fps`` and loops.

    Each frame gets its own 256-colour palette (fast octree quantization: ~13 ms for a 600x400
    frame on a busy CPU); identical frames in a row become one frame shown as long.
    """
    from PIL import Image  # imported when a video is written, not with the package (TensorBoard requires Pillow)

    images = [Image.fromarray(frame).quantize(256, method=Image.Quantize.FASTOCTREE) for frame in frames]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0)
    return buffer.getvalue()


def write_gif_file(path: Path, frames: np.ndarray, fps: int) -> None:
    """Write ``frames`` (``[T, H, W, 3]`` uint8) to ``path`` as :func:`encode_gif`'s GIF, creating its folder.

    The file appears whole or not at all (written beside it, then renamed).
    """
    gif = encode_gif(frames, fps)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda file: file.write(gif))


def _write_gif(writer: SummaryWriter, tag: str, frames: np.ndarray, fps: int, step: int) -> None:
    """Write ``frames`` as the image summary TensorBoard plays as a video (what ``add_video`` writes)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    _, height, width, channels = frames.shape
    image = Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=encode_gif(frames, fps))
    # The writer's own file writer, which its add_* methods write every summary they build to;
    # SummaryWriter has no public method for a summary built outside it.
    writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
