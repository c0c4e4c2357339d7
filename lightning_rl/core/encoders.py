"""Observation encoders: what an algorithm module runs on its observations before its MLPs.

:func:`build_observation_encoder` makes, from an observation space and a module's
``model_config``, an :class:`ObservationEncoder`: an ``nn.Module`` that maps a batch of
observations as the ``obs`` column holds them (on the module's device) to float features
``[B, out_dim]``, on which the module puts its ``fcnet_hiddens`` MLPs:

- an image ``Box`` (the rule below): :class:`ImageEncoder`, a CNN from ``conv_filters``, flattened;
- a ``Dict`` or ``Tuple`` (other than the action-mask Dict of :mod:`~lightning_rl.core.action_masks`)
  with an image among its leaves: :class:`StructuredEncoder`, a CNN per image leaf and the
  other leaves as they are, side by side;
- anything else (flat Boxes, ``Discrete``, ``MultiDiscrete``, ``MultiBinary``, Dicts and Tuples
  without images): :class:`FlatEncoder`, gymnasium's flatten layout
  (:func:`~lightning_rl.core.mlp.flatten_obs`). It has no weights, so a module on such
  observations has exactly the layers (and ``state_dict`` keys) it had before encoders existed.

What is an image (``model_config["image_layout"]``):

- ``"auto"`` (default): a ``Box`` of dtype ``uint8`` (pixels) or ``bool`` (MinAtar's planes)
  with 3 dims, one image, or 4 dims, a stack of images along the first axis (gymnasium's
  ``FrameStackObservation``). The channel axis of an image ``(a, b, c)`` is the smaller of
  ``a`` and ``c``: ``(84, 84, 4)`` is channels-last, ``(4, 84, 84)`` channels-first; a tie
  reads channels-last. Other dtypes (float, int8 board planes) stay flat, as before.
- ``"channels_last"`` / ``"channels_first"``: every 3-D or 4-D ``Box`` (of any dtype; of a
  Dict or Tuple, every such leaf) is an image with its channels on that axis; at least one
  must exist.
- ``"flat"``: nothing is; every observation goes to the MLPs flattened.

A stack's frames are merged into the channels, frame by frame: ``(4, 10, 10, 4)`` is an image
of 16 channels, ``(4, 84, 84)`` one of 4. ``uint8`` images are divided by 255 inside
:meth:`ImageEncoder.forward`, once, on the device the observations arrived on: they travel
there as bytes. ``bool`` images become 0/1 floats; float images are taken as they are.

``conv_filters`` is RLlib's list of ``[out_channels, kernel, stride]`` (optionally a fourth
entry, zero ``padding``), each of kernel, stride and padding an int or ``[h, w]``; no padding
by default. Unset, it depends on the image (:func:`default_conv_filters`): the Nature CNN for
images of at least 36x36 pixels, one 3x3 layer of 16 filters (the MinAtar paper's) for smaller ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from lightning_rl.core.action_masks import observation_part
from lightning_rl.core.mlp import ObservationFlattener, make_activation
from lightning_rl.core.module_checks import ModelConfigKey
from lightning_rl.core.observation_layout import FlatLeaf, ObservationLayout

NATURE_CNN_FILTERS: tuple[tuple[int, int, int], ...] = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
"""The DQN Nature paper's convolutions (Mnih et al., 2015), as Stable-Baselines3 and CleanRL use for Atari."""

SMALL_CNN_FILTERS: tuple[tuple[int, int, int], ...] = ((16, 3, 1),)
"""The MinAtar paper's one convolution (Young and Tian, 2019), for small images such as 10x10."""

NATURE_CNN_MIN_SIZE = 36
"""The smallest height and width the Nature CNN takes (it shrinks 36x36 to 1x1): from there on it is the default."""

IMAGE_LAYOUTS: tuple[str, ...] = ("auto", "channels_last", "channels_first", "flat")
"""The values of ``image_layout`` (see the module docstring)."""

DEFAULT_CONV_ACTIVATION = "relu"
"""The activation after each convolution when ``conv_activation`` is unset (RLlib's default)."""

_IMAGE_DTYPES = (np.dtype(np.uint8), np.dtype(np.bool_))


OBSERVATION_ENCODER_KEYS: dict[str, ModelConfigKey] = {
    "conv_filters": ModelConfigKey(
        None,
        "null (a default by image size) or a non-empty list of [out_channels, kernel, stride] or "
        "[out_channels, kernel, stride, padding], each of kernel and stride an int >= 1 or [h, w] of them, "
        "padding an int >= 0 or [h, w] of them",
        lambda value: _is_conv_filters(value),
    ),
    "conv_activation": ModelConfigKey.activation(DEFAULT_CONV_ACTIVATION),
    "image_layout": ModelConfigKey.choice("auto", IMAGE_LAYOUTS),
}
"""The ``model_config`` keys of the observation encoder, which every algorithm module declares."""


@dataclasses.dataclass(frozen=True)
class ImageShape:
    """How a ``Box`` observation reads as an image ``[channels, height, width]``.

    Args:
        obs_shape: The Box's shape: ``(H, W, C)`` or ``(C, H, W)``, with a leading stack axis
            for stacked frames.
        channels_last: Whether each frame's channels are its last axis.
        channels: The image's channels: the frames' channels times the number of frames.
        height: Its height in pixels.
        width: Its width in pixels.
        scale_uint8: Whether the Box is ``uint8``, whose values are divided by 255.
    """

    obs_shape: tuple[int, ...]
    channels_last: bool
    channels: int
    height: int
    width: int
    scale_uint8: bool

    def to_images(self, obs: Tensor) -> Tensor:
        """``[B, *obs_shape]`` (or ``[B, prod(obs_shape)]``) observations as ``[B, C, H, W]``, dtype kept."""
        images = obs.reshape(obs.shape[0], *self.obs_shape)
        if self.channels_last:  # [B, (S,) H, W, C] -> [B, (S,) C, H, W]
            images = images.movedim(-1, -3)
        return images.reshape(obs.shape[0], self.channels, self.height, self.width)


def image_shape(space: gym.Space, image_layout: str = "auto") -> ImageShape | None:
    """How ``space`` reads as an image under ``image_layout``, or ``None`` if it is no image.

    Args:
        space: An observation space (or a Dict's subspace).
        image_layout: One of :data:`IMAGE_LAYOUTS`; see the module docstring for the rule.
    """
    if image_layout == "flat" or not isinstance(space, gym.spaces.Box) or len(space.shape) not in (3, 4):
        return None
    if image_layout == "auto" and space.dtype not in _IMAGE_DTYPES:
        return None
    frame = space.shape[-3:]
    frames = space.shape[0] if len(space.shape) == 4 else 1
    channels_last = image_layout == "channels_last" or (image_layout == "auto" and frame[2] <= frame[0])
    height, width, channels = frame if channels_last else (frame[1], frame[2], frame[0])
    return ImageShape(
        obs_shape=tuple(space.shape),
        channels_last=channels_last,
        channels=frames * channels,
        height=height,
        width=width,
        scale_uint8=space.dtype == np.uint8,
    )


def default_conv_filters(height: int, width: int) -> list[list[int]]:
    """``conv_filters`` when unset: the Nature CNN from 36x36 pixels on, the MinAtar paper's one layer below.

    Args:
        height: The image's height in pixels.
        width: Its width.
    """
    filters = NATURE_CNN_FILTERS if min(height, width) >= NATURE_CNN_MIN_SIZE else SMALL_CNN_FILTERS
    return [list(entry) for entry in filters]


class ObservationEncoder(nn.Module):
    """Observations ``[B, ...]`` (the ``obs`` column, on the module's device) to float features ``[B, out_dim]``.

    Attributes:
        out_dim: The width of the features, the input size of the MLP on top.
    """

    out_dim: int


class FlatEncoder(ObservationEncoder):
    """gymnasium's flatten layout as float32 (:func:`~lightning_rl.core.mlp.flatten_obs`); no weights.

    Args:
        space: A ``Box``, ``Discrete``, ``MultiDiscrete`` or ``MultiBinary`` space, a ``Dict`` or
            ``Tuple`` of those, or a masked space whose observation part is one.
    """

    def __init__(self, space: gym.Space) -> None:
        super().__init__()
        self._flatten = ObservationFlattener.of(space)  # read off the space once, not on every pass
        self.out_dim = self._flatten.width

    def forward(self, obs: Tensor) -> Tensor:
        return self._flatten(obs)


class ImageEncoder(ObservationEncoder):
    """A CNN on image observations: convolutions, each followed by the activation, then flattened.

    Args:
        image: How the observations read as images (:func:`image_shape`).
        conv_filters: ``[[out_channels, kernel, stride(, padding)], ...]``, checked by
            :func:`conv_output_sizes`.
        activation: The activation after each convolution (see
            :func:`~lightning_rl.core.mlp.make_activation`).

    Raises:
        ValueError: If a convolution shrinks the image below one pixel.
    """

    def __init__(self, image: ImageShape, conv_filters: Sequence[Sequence[Any]], activation: str) -> None:
        super().__init__()
        self.image = image
        sizes = conv_output_sizes(image, conv_filters)
        layers: list[nn.Module] = []
        in_channels = image.channels
        for entry in conv_filters:
            out_channels, kernel, stride, padding = _conv_arguments(entry)
            layers.append(nn.Conv2d(in_channels, out_channels, kernel, stride, padding))
            activation_layer = make_activation(activation)
            if activation_layer is not None:
                layers.append(activation_layer)
            in_channels = out_channels
        self.convs = nn.Sequential(*layers)
        height, width = sizes[-1]
        self.out_dim = in_channels * height * width

    def forward(self, obs: Tensor) -> Tensor:
        """Features of ``[B, *obs_shape]`` (or flat ``[B, prod(obs_shape)]``) observations.

        The observations are rearranged in their own dtype (bytes for pixels) and then
        converted to float32 where they are, ``uint8`` ones divided by 255.
        """
        images = self.image.to_images(obs).float()
        if self.image.scale_uint8:
            images = images / 255.0
        return self.convs(images).flatten(1)


class _FlatPart(nn.Module):
    """A leaf's part of the flat row that is not an image: passed on as float32."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.out_dim = width

    def forward(self, part: Tensor) -> Tensor:
        return part.float()


class StructuredEncoder(ObservationEncoder):
    """Per-leaf features of ``Dict`` or ``Tuple`` observations, side by side in gymnasium's flatten order.

    The ``obs`` column holds the stored flat rows (:mod:`~lightning_rl.core.observation_layout`);
    each image leaf's part is reshaped to its space's shape and goes through a CNN of its own
    (divided by 255 if the leaf is ``uint8``, whatever dtype the row has); every other leaf's
    part is already flat (one-hot for ``Discrete``) and is passed on as it is.

    Args:
        space: The ``Dict`` or ``Tuple`` observation space.
        model_config: The module's config (its ``conv_filters``, ``conv_activation`` and
            ``image_layout`` apply to every image leaf).

    Raises:
        ValueError: As :class:`ImageEncoder`, naming the leaf (``observation['pixels']``).
    """

    def __init__(self, space: gym.Space, model_config: Mapping[str, Any]) -> None:
        super().__init__()
        self.leaves = _leaves(space)
        parts: list[nn.Module] = []
        for leaf in self.leaves:
            image = image_shape(leaf.space, model_config["image_layout"])
            if image is None:
                parts.append(_FlatPart(leaf.stop - leaf.start))
                continue
            try:
                parts.append(ImageEncoder(image, _filters_for(image, model_config), model_config["conv_activation"]))
            except ValueError as error:
                raise ValueError(f"{leaf.where}: {error}") from error
        self.parts = nn.ModuleList(parts)
        self.out_dim = sum(part.out_dim for part in parts)

    def forward(self, obs: Tensor) -> Tensor:
        features = [part(obs[:, leaf.start : leaf.stop]) for leaf, part in zip(self.leaves, self.parts)]
        return torch.cat(features, dim=1)


def build_observation_encoder(observation_space: gym.Space, model_config: Mapping[str, Any]) -> ObservationEncoder:
    """The encoder a module runs on observations of ``observation_space`` (see the module docstring).

    Called by the algorithm modules' ``setup``, once per network that reads observations.

    Args:
        observation_space: The module's observation space (of a masked space, the observation
            part is encoded).
        model_config: The module's config; its encoder keys (:data:`OBSERVATION_ENCODER_KEYS`)
            may be left out for their defaults.

    Raises:
        ValueError: For an observation space no encoder takes, an explicit channel layout with
            no 3-D or 4-D Box to apply to, or convolutions that shrink an image below one pixel.
    """
    config = _encoder_config(model_config)
    space = observation_part(observation_space)
    _check_some_image(space, config["image_layout"])
    if any(image_shape(leaf.space, config["image_layout"]) for leaf in _leaves(space)):
        return StructuredEncoder(space, config)
    image = image_shape(space, config["image_layout"])
    if image is not None:
        return ImageEncoder(image, _filters_for(image, config), config["conv_activation"])
    return FlatEncoder(space)


def check_observation_encoder(observation_space: gym.Space, model_config: Mapping[str, Any]) -> None:
    """Raise the ValueError :func:`build_observation_encoder` would for the images, without building a layer.

    What a module spec checks as soon as it knows its observation space.

    Args:
        observation_space: The module's observation space.
        model_config: The module's config (encoder keys may be left out).

    Raises:
        ValueError: For an explicit channel layout with no 3-D or 4-D Box to apply to, or
            convolutions that shrink an image below one pixel (naming the Dict or Tuple leaf, if
            any).
    """
    config = _encoder_config(model_config)
    space = observation_part(observation_space)
    _check_some_image(space, config["image_layout"])
    named_spaces = [(leaf.where, leaf.space) for leaf in _leaves(space)] or [(None, space)]
    for where, subspace in named_spaces:
        image = image_shape(subspace, config["image_layout"])
        if image is None:
            continue
        try:
            conv_output_sizes(image, _filters_for(image, config))
        except ValueError as error:
            raise ValueError(str(error) if where is None else f"{where}: {error}") from error


def conv_output_sizes(image: ImageShape, conv_filters: Sequence[Sequence[Any]]) -> list[tuple[int, int]]:
    """The ``(height, width)`` after each convolution of ``conv_filters`` on ``image``.

    Each is ``floor((size + 2 * padding - kernel) / stride) + 1`` per axis.

    Raises:
        ValueError: Naming the first layer that leaves less than one pixel, its input and
            output sizes and the image.
    """
    height, width = image.height, image.width
    sizes = []
    for index, entry in enumerate(conv_filters):
        _, kernel, stride, padding = _conv_arguments(entry)
        out_height = (height + 2 * padding[0] - kernel[0]) // stride[0] + 1
        out_width = (width + 2 * padding[1] - kernel[1]) // stride[1] + 1
        if out_height < 1 or out_width < 1:
            raise ValueError(
                f"conv_filters[{index}] = {list(entry)} shrinks the {height}x{width} image it gets to "
                f"{max(out_height, 0)}x{max(out_width, 0)} pixels (observations of shape {image.obs_shape} are "
                f"{image.height}x{image.width} images of {image.channels} channels); use smaller kernels or "
                "strides, padding, or fewer layers"
            )
        height, width = out_height, out_width
        sizes.append((height, width))
    return sizes


def _encoder_config(model_config: Mapping[str, Any]) -> dict[str, Any]:
    """The encoder keys of ``model_config``, the defaults filling the keys it leaves out."""
    return {key: model_config.get(key, spec.default) for key, spec in OBSERVATION_ENCODER_KEYS.items()}


def _filters_for(image: ImageShape, config: Mapping[str, Any]) -> Sequence[Sequence[Any]]:
    filters = config["conv_filters"]
    return default_conv_filters(image.height, image.width) if filters is None else filters


def _conv_arguments(entry: Sequence[Any]) -> tuple[int, tuple[int, int], tuple[int, int], tuple[int, int]]:
    """``(out_channels, kernel, stride, padding)`` of one ``conv_filters`` entry, each size as ``(h, w)``."""
    out_channels, kernel, stride, *rest = entry
    padding = rest[0] if rest else 0
    return int(out_channels), _as_pair(kernel), _as_pair(stride), _as_pair(padding)


def _as_pair(value: int | Sequence[int]) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _leaves(space: gym.Space) -> list[FlatLeaf]:
    """The leaves of a ``Dict`` or ``Tuple`` space as they are stored; none for other spaces.

    Raises:
        ValueError: For a ``Dict`` or ``Tuple`` that cannot be stored (``ObservationLayout``).
    """
    if not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return []
    return ObservationLayout(space).leaves


def _check_some_image(space: gym.Space, image_layout: str) -> None:
    """An explicit channel layout needs a 3-D or 4-D Box (or Dict or Tuple leaf) to read as images."""
    if image_layout not in ("channels_last", "channels_first"):
        return
    candidates = [leaf.space for leaf in _leaves(space)] or [space]
    if not any(image_shape(candidate, image_layout) for candidate in candidates):
        raise ValueError(
            f"image_layout {image_layout!r} reads 3-D and 4-D Box observations as images, but the observation "
            f"space {space} has none"
        )


def _is_conv_filters(value: Any) -> bool:
    return value is None or (
        isinstance(value, (list, tuple)) and len(value) > 0 and all(_is_conv_filter(entry) for entry in value)
    )


def _is_conv_filter(entry: Any) -> bool:
    if not isinstance(entry, (list, tuple)) or len(entry) not in (3, 4):
        return False
    out_channels, kernel, stride, *padding = entry
    return (
        _is_int(out_channels, minimum=1)
        and _is_pair(kernel, minimum=1)
        and _is_pair(stride, minimum=1)
        and all(_is_pair(entry, minimum=0) for entry in padding)
    )


def _is_pair(value: Any, *, minimum: int) -> bool:
    if isinstance(value, (list, tuple)):
        return len(value) == 2 and all(_is_int(v, minimum=minimum) for v in value)
    return _is_int(value, minimum=minimum)


def _is_int(value: Any, *, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum
