"""Recording the rgb frames of a PettingZoo env's first episode, for ``lightning-rl evaluate --video``.

``record_first_episode(env, recorded)`` wraps a ``ParallelEnv`` or an ``AECEnv`` made with
``render_mode="rgb_array"`` in a PettingZoo wrapper of its own API, so the multi-agent runner
steps it as it steps the env itself. The wrapper renders once after the first reset and once
after every step of that episode (an AEC env: every agent's move, and the steps that retire
done agents), appending each frame to ``recorded.frames``; later episodes are not rendered.

PettingZoo is an optional dependency: it is imported when the first env is wrapped.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from lightning_rl.env.frame_recorder import RGB_ARRAY, RecordedFrames, quiet_headless_rendering, rgb_frame
from lightning_rl.env.pettingzoo_env import is_parallel_env


def record_first_episode(env: Any, recorded: RecordedFrames) -> Any:
    """``env`` wrapped to append its first episode's frames (``[H, W, 3]`` uint8) to ``recorded.frames``.

    Args:
        env: A PettingZoo ``ParallelEnv`` or ``AECEnv`` made with ``render_mode="rgb_array"``.
        recorded: Where the frames go, in order; its ``fps`` is set to the env's.

    Raises:
        ValueError: If ``env`` does not render rgb arrays, naming it and its render mode.
    """
    quiet_headless_rendering()
    render_mode = getattr(env, "render_mode", None)
    if render_mode != RGB_ARRAY:
        raise ValueError(
            f"a video needs PettingZoo env {_name(env)} to render rgb_array frames, but its render_mode is "
            f"{render_mode!r} (the render modes it declares: {env.metadata.get('render_modes', [])})"
        )
    recorded.fps = int(env.unwrapped.metadata.get("render_fps") or recorded.fps)
    parallel_frames, aec_frames = _wrapper_classes()
    return (parallel_frames if is_parallel_env(env) else aec_frames)(env, recorded.frames)


class _FirstEpisodeFrames:
    """Renders the first episode of ``env`` into ``frames``: once after its reset, once after each step.

    Args:
        env: The env as made (its ``unwrapped.agents`` say when the episode is over).
        frames: Where the frames go.
    """

    def __init__(self, env: Any, frames: list[np.ndarray]) -> None:
        self.env = env
        self.frames = frames
        self.episodes = 0
        self.recording = False

    def after_reset(self) -> None:
        self.episodes += 1
        self.recording = self.episodes == 1
        if self.recording:
            self.frames.append(self._frame())

    def after_step(self) -> None:
        if self.recording:
            self.frames.append(self._frame())
            self.recording = bool(self.env.unwrapped.agents)  # no agent left: the episode is over

    def _frame(self) -> np.ndarray:
        return rgb_frame(self.env, f"PettingZoo env {_name(self.env)}")


@functools.cache
def _wrapper_classes() -> tuple[type, type]:
    """The two wrappers, for a ``ParallelEnv`` and an ``AECEnv``: PettingZoo wrappers, so built on first use."""
    from pettingzoo.utils.wrappers import BaseParallelWrapper, BaseWrapper

    class ParallelFrames(BaseParallelWrapper):
        def __init__(self, env: Any, frames: list[np.ndarray]) -> None:
            super().__init__(env)
            self.recorder = _FirstEpisodeFrames(env, frames)

        def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
            result = self.env.reset(seed=seed, options=options)
            self.recorder.after_reset()
            return result

        def step(self, actions: dict[Any, Any]) -> Any:
            result = self.env.step(actions)
            self.recorder.after_step()
            return result

    class AECFrames(BaseWrapper):
        def __init__(self, env: Any, frames: list[np.ndarray]) -> None:
            super().__init__(env)
            self.recorder = _FirstEpisodeFrames(env, frames)

        def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
            self.env.reset(seed=seed, options=options)
            self.recorder.after_reset()

        def step(self, action: Any) -> None:
            self.env.step(action)
            self.recorder.after_step()

    return ParallelFrames, AECFrames


def _name(env: Any) -> str:
    return repr(env.unwrapped.metadata.get("name") or type(env.unwrapped).__name__)
