"""Recording one episode's rgb frames inside an env copy of a vector env, for evaluation videos.

An ``EnvRunner`` built with ``record_video=True`` makes its envs with
``render_mode="rgb_array"`` and wraps each copy (after the user's wrappers) in an
``EpisodeFrameRecorder``. The recorder renders nothing until it is armed; armed, it records
the episode that starts at the env's next reset, frame by frame, and stops when that episode
ends. The runner arms env 0 alone, so rendering never slows down the other envs, nor any
episode that is not recorded. The recorder runs where the env runs (the runner's process, or
the env's worker in ``"async"`` mode); the runner reaches it through the vector env's
``set_attr`` and ``call``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from lightning_rl.env.env_factory import WrapperSpec, make_env, resolve_env, resolve_wrappers

RGB_ARRAY = "rgb_array"


@dataclasses.dataclass
class RecordedFrames:
    """Where a recorder puts an episode's frames, and the rate they play at.

    Attributes:
        frames: ``[H, W, 3]`` uint8 frames, in order.
        fps: The env's ``metadata["render_fps"]`` (30 when it declares none), set by the recorder.
    """

    frames: list[np.ndarray] = dataclasses.field(default_factory=list)
    fps: int = 30


class EpisodeFrameRecorder(gym.Wrapper):
    """Records the rgb frames of the episode that follows the next reset, when armed.

    Args:
        env: An env made with ``render_mode="rgb_array"``.

    Attributes:
        record_next_episode: Set to ``True`` to record the episode the next ``reset`` starts.

    Raises:
        ValueError: If ``env`` does not render rgb arrays, naming it and its render mode.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        quiet_headless_rendering()
        if env.render_mode != RGB_ARRAY:
            raise ValueError(
                f"evaluation videos need env {_env_name(env)} to render rgb_array frames, but its render_mode is "
                f"{env.render_mode!r} (the render modes it declares: {env.metadata.get('render_modes', [])}); an env "
                "made by a function must accept render_mode='rgb_array' (pass it in env_kwargs)"
            )
        self.record_next_episode = False
        self._recording = False
        self._frames: list[np.ndarray] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset the env; an armed recorder starts recording with the reset's frame."""
        obs, info = self.env.reset(seed=seed, options=options)
        self._recording = self.record_next_episode
        self.record_next_episode = False
        if self._recording:
            self._frames = [self._frame()]
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the env; while recording, add the frame after the step, and stop when the episode ends."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._recording:
            self._frames.append(self._frame())
            self._recording = not (terminated or truncated)
        return obs, reward, terminated, truncated, info

    def take_frames(self) -> np.ndarray | None:
        """The recorded frames, ``[T, H, W, 3]`` uint8, and forget them; ``None`` if none were recorded."""
        frames, self._frames = self._frames, []
        self._recording = False
        return np.stack(frames) if frames else None

    def _frame(self) -> np.ndarray:
        return rgb_frame(self.env, f"env {_env_name(self.env)}")


def rgb_frame(env: Any, name: str) -> np.ndarray:
    """``env.render()`` (an env in ``render_mode="rgb_array"``), checked to be one ``[H, W, 3]`` frame, as uint8.

    Raises:
        ValueError: Naming the env (``name``) and what it rendered instead.
    """
    frame = env.render()
    if not (isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[-1] == 3):
        shape = getattr(frame, "shape", type(frame).__name__)
        raise ValueError(
            f"{name} rendered {shape} in render_mode='rgb_array'; an evaluation video needs [height, width, 3] frames"
        )
    return np.asarray(frame, dtype=np.uint8)


def env_kwargs_for_video(env: str | Callable[..., gym.Env], env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``env_kwargs`` with ``render_mode="rgb_array"`` for an env id (``gym.make`` takes it).

    An env made by a function is called with ``env_kwargs`` as they are: it must set that
    render mode itself (``EpisodeFrameRecorder`` says so otherwise).

    Raises:
        ValueError: If ``env_kwargs`` sets another ``render_mode``.
    """
    given = env_kwargs.get("render_mode", RGB_ARRAY)
    if given != RGB_ARRAY:
        raise ValueError(f"evaluation videos record rgb_array frames, but env_kwargs sets render_mode={given!r}")
    return {**env_kwargs, "render_mode": RGB_ARRAY} if isinstance(env, str) else dict(env_kwargs)


def check_records_frames(
    env: str | Callable[..., gym.Env], env_kwargs: dict[str, Any] | None, wrappers: Sequence[WrapperSpec]
) -> None:
    """Build one env as a recording ``EnvRunner`` does, reset it and record its first frame.

    So that an env that cannot be recorded fails when training sets up, not at the first video.

    Args:
        env, env_kwargs, wrappers: As for ``EnvRunner``.

    Raises:
        ValueError: For an env that does not render rgb frames, naming it.
        gymnasium.error.DependencyNotInstalled: When the renderer's package is missing (pygame
            for the classic-control envs), with gymnasium's instruction to install it.
    """
    env = resolve_env(env) if isinstance(env, str) else env  # an id stays an id; a factory path is imported
    kwargs = env_kwargs_for_video(env, dict(env_kwargs or {}))
    recorder = make_env(env, kwargs, [*resolve_wrappers(wrappers), EpisodeFrameRecorder])
    try:
        recorder.record_next_episode = True
        recorder.reset()
        recorder.take_frames()
    finally:
        recorder.close()


def quiet_headless_rendering() -> None:
    """Let pygame render without a display, silently.

    Without a display (a server, a container), SDL prints "XDG_RUNTIME_DIR is invalid or not
    set" when pygame initializes. Recording never opens a window, so SDL's "dummy" video
    driver serves. A driver the user chose is kept, and where a display exists nothing
    changes (another env in the process may open a window).
    """
    if not any(os.environ.get(name) for name in ("DISPLAY", "WAYLAND_DISPLAY")):
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


def _env_name(env: gym.Env) -> str:
    spec = getattr(env, "spec", None)
    return repr(spec.id) if spec is not None and spec.id else type(env.unwrapped).__name__
