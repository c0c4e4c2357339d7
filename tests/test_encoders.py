"""Observation encoders: which observations are images, the CNN's defaults and scaling, Dict observations, checks."""

from __future__ import annotations

from collections import OrderedDict

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms.bc import BCLearner, BCModule
from lightning_rl.algorithms.dqn import DQNModule
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.algorithms.sac import SACModule
from lightning_rl.core.encoders import (
    FlatEncoder,
    ImageEncoder,
    StructuredEncoder,
    build_observation_encoder,
    image_shape,
)
from lightning_rl.core.mlp import flatten_obs
from lightning_rl.core.observation_layout import ObservationLayout
from lightning_rl.learner.learner import Learner

DISCRETE = gym.spaces.Discrete(3)
BOX_ACTIONS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ATARI = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
MINATAR = gym.spaces.Box(0, 1, (10, 10, 4), bool)
DICT = gym.spaces.Dict(
    OrderedDict(
        [
            ("pixels", gym.spaces.Box(0, 255, (10, 10, 3), np.uint8)),
            ("position", gym.spaces.Box(-1.0, 1.0, (3,), np.float32)),
            ("room", gym.spaces.Discrete(4)),
        ]
    )
)


def convolutions(module: nn.Module) -> list[nn.Conv2d]:
    return [layer for layer in module.modules() if isinstance(layer, nn.Conv2d)]


def first_conv_inputs(encoder: nn.Module) -> list[torch.Tensor]:
    """Record what the first convolution of ``encoder`` gets on each call."""
    seen: list[torch.Tensor] = []
    convolutions(encoder)[0].register_forward_pre_hook(lambda _, args: seen.append(args[0].detach().clone()))
    return seen


def dict_rows(rows: int, seed: int = 0) -> np.ndarray:
    """``rows`` observations of ``DICT`` as an env runner stores them: gymnasium's flat layout, float32."""
    DICT.seed(seed)
    return np.stack([ObservationLayout(DICT).flatten_one(DICT.sample()) for _ in range(rows)])


# ---- Which observations are images -----------------------------------------------------


@pytest.mark.parametrize(
    ("space", "channels", "height", "width"),
    [
        (ATARI, 4, 84, 84),  # channels-last: the last dim is the smaller
        (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), 4, 84, 84),  # FrameStackObservation of 84x84 grayscale
        (MINATAR, 4, 10, 10),
        (gym.spaces.Box(0, 1, (4, 10, 10, 4), bool), 16, 10, 10),  # 4 stacked MinAtar frames of 4 channels
        (gym.spaces.Box(0, 255, (3, 5, 3), np.uint8), 3, 3, 5),  # a tie reads channels-last
    ],
)
def test_uint8_and_bool_boxes_of_three_or_four_dims_are_images_with_stacked_frames_merged_into_channels(
    space, channels, height, width
):
    image = image_shape(space)
    assert (image.channels, image.height, image.width) == (channels, height, width)
    encoder = build_observation_encoder(space, {})
    assert isinstance(encoder, ImageEncoder) and convolutions(encoder)[0].in_channels == channels


def test_stacked_frames_become_channels_frame_by_frame():
    image = image_shape(gym.spaces.Box(0, 255, (2, 5, 5, 3), np.uint8))
    obs = torch.arange(2 * 5 * 5 * 3).reshape(1, 2, 5, 5, 3)
    images = image.to_images(obs)
    assert images.shape == (1, 6, 5, 5)
    for frame in range(2):
        for channel in range(3):
            assert torch.equal(images[0, frame * 3 + channel], obs[0, frame, :, :, channel])


@pytest.mark.parametrize(
    ("space", "image_layout"),
    [
        (gym.spaces.Box(-1.0, 1.0, (8,), np.float32), "auto"),
        (gym.spaces.Box(0, 255, (84, 84), np.uint8), "auto"),  # 2-D: not an image
        (gym.spaces.Box(0.0, 1.0, (84, 84, 3), np.float32), "auto"),  # float: only if asked
        (gym.spaces.Box(0, 1, (6, 7, 2), np.int8), "auto"),  # connect four's board planes stay as they were
        (ATARI, "flat"),
        (gym.spaces.MultiDiscrete([3, 2]), "auto"),
    ],
)
def test_other_observations_stay_flat(space, image_layout):
    encoder = build_observation_encoder(space, {"image_layout": image_layout})
    assert isinstance(encoder, FlatEncoder) and encoder.out_dim == gym.spaces.flatdim(space)


def test_an_explicit_layout_makes_float_boxes_images_and_says_where_the_channels_are():
    space = gym.spaces.Box(0.0, 1.0, (3, 40, 40), np.float32)
    assert image_shape(space, "channels_first").channels == 3
    assert image_shape(space, "channels_last").channels == 40
    with pytest.raises(ValueError, match="image_layout 'channels_last' reads 3-D and 4-D Box observations as images"):
        RLModuleSpec(PPOModule, gym.spaces.Box(-1.0, 1.0, (4,)), DISCRETE, {"image_layout": "channels_last"})


def test_channels_first_and_channels_last_give_the_same_features_for_transposed_images():
    last = gym.spaces.Box(0, 255, (10, 10, 3), np.uint8)
    first = gym.spaces.Box(0, 255, (3, 10, 10), np.uint8)
    torch.manual_seed(0)
    encoder_last = build_observation_encoder(last, {})
    torch.manual_seed(0)
    encoder_first = build_observation_encoder(first, {})
    obs = torch.randint(0, 256, (5, 10, 10, 3), dtype=torch.uint8)
    torch.testing.assert_close(encoder_last(obs), encoder_first(obs.permute(0, 3, 1, 2)), rtol=0, atol=0)


# ---- The CNN ---------------------------------------------------------------------------


def test_the_default_cnn_is_the_nature_cnn_for_84x84_and_the_minatar_one_for_10x10():
    atari = build_observation_encoder(ATARI, {})
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convolutions(atari)] == [
        (32, (8, 8), (4, 4)),
        (64, (4, 4), (2, 2)),
        (64, (3, 3), (1, 1)),
    ]
    assert atari.out_dim == 64 * 7 * 7
    minatar = build_observation_encoder(MINATAR, {})
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convolutions(minatar)] == [(16, (3, 3), (1, 1))]
    assert minatar.out_dim == 16 * 8 * 8


def test_conv_filters_set_the_layers_with_rectangular_kernels_padding_and_the_activation():
    encoder = build_observation_encoder(
        MINATAR, {"conv_filters": [[8, [3, 2], 1, 1], [4, 2, [2, 1]]], "conv_activation": "tanh"}
    )
    first, second = convolutions(encoder)
    assert (first.kernel_size, first.padding, second.stride) == ((3, 2), (1, 1), (2, 1))
    assert sum(isinstance(layer, nn.Tanh) for layer in encoder.modules()) == 2
    assert encoder.out_dim == 4 * 5 * 10  # 10x10 -> 10x11 (padding 1) -> 5x10
    assert encoder(torch.zeros(2, 10, 10, 4, dtype=torch.bool)).shape == (2, encoder.out_dim)


# The CUDA case belongs to the GPU lane (marker gpu, benchmarks/gpu_check.sh); it needs CUDA even when
# the lane is run on the CPU (LIGHTNING_RL_GPU_LANE=cpu).
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
    ),
]


def test_ppo_starts_its_convolutions_orthogonal_with_gain_sqrt_2_and_zero_bias():
    for config in ({"vf_share_layers": True}, {}):
        module = PPOModule(MINATAR, DISCRETE, config)
        for conv in convolutions(module):
            rows = conv.weight.detach().reshape(conv.out_channels, -1)  # 16 rows of 36: orthogonal rows
            torch.testing.assert_close(rows @ rows.T, 2.0 * torch.eye(conv.out_channels), atol=1e-5, rtol=0)
            assert not conv.bias.any()


@pytest.mark.parametrize("device", DEVICES)
def test_uint8_images_reach_the_first_convolution_divided_by_255_once_on_the_modules_device(device):
    module = PPOModule(ATARI, DISCRETE, {"vf_share_layers": True}).to(device)
    seen = first_conv_inputs(module.obs_encoder)
    obs = torch.full((2, 84, 84, 4), 255, dtype=torch.uint8, device=device)
    module.forward_exploration({Columns.OBS: obs})
    (conv_input,) = seen
    assert conv_input.dtype == torch.float32 and conv_input.device.type == device
    assert torch.equal(conv_input, torch.ones_like(conv_input))


@pytest.mark.parametrize("device", DEVICES)
def test_bool_images_become_zeros_and_ones(device):
    module = DQNModule(MINATAR, DISCRETE, {}).to(device)
    seen = first_conv_inputs(module.q_net.obs_encoder)
    obs = torch.zeros(3, 10, 10, 4, dtype=torch.bool, device=device)
    obs[:, 2, 5, 1] = True
    module.forward_inference({Columns.OBS: obs})
    assert seen[0].dtype == torch.float32 and seen[0].device.type == device
    assert seen[0].sum() == 3 and seen[0][:, 1, 2, 5].eq(1).all()


def test_float_images_are_not_rescaled():
    space = gym.spaces.Box(0.0, 255.0, (12, 12, 3), np.float32)
    encoder = build_observation_encoder(space, {"image_layout": "channels_last"})
    seen = first_conv_inputs(encoder)
    encoder(torch.full((1, 12, 12, 3), 255.0))
    assert seen[0].eq(255.0).all()


@pytest.mark.parametrize(
    ("shape", "conv_filters", "message"),
    [
        ((20, 20, 3), [[16, 8, 4], [32, 4, 2], [32, 3, 1]], r"conv_filters\[2\] = \[32, 3, 1\] shrinks the 1x1 image"),
        ((10, 10, 3), [[16, 12, 1]], r"conv_filters\[0\] = \[16, 12, 1\] shrinks the 10x10 image it gets to 0x0"),
    ],
)
def test_convolutions_that_shrink_the_image_below_a_pixel_fail_when_the_spec_is_made(shape, conv_filters, message):
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    with pytest.raises(ValueError, match=f"PPOModule: {message}"):
        RLModuleSpec(PPOModule, space, DISCRETE, {"conv_filters": conv_filters})
    with pytest.raises(ValueError, match=message):
        PPOModule(space, DISCRETE, {"conv_filters": conv_filters})


def test_a_dict_or_tuple_leaf_whose_image_is_too_small_is_named():
    space = gym.spaces.Dict({"tiny": gym.spaces.Box(0, 255, (2, 2, 1), np.uint8)})
    with pytest.raises(ValueError, match=r"PPOModule: observation\['tiny'\]: conv_filters\[0\] = \[16, 3, 1\]"):
        RLModuleSpec(PPOModule, space, DISCRETE)
    space = gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Box(0, 255, (2, 2, 1), np.uint8)])
    with pytest.raises(ValueError, match=r"observation\[1\]: conv_filters\[0\]"):
        PPOModule(space, DISCRETE, {})


@pytest.mark.parametrize(
    "conv_filters",
    [
        [], [[16, 3]], [[16, 3, 1, 0, 0]], [[0, 3, 1]], [[16, 0, 1]], [[16, 3, 0]], [[16, 3, 1, -1]], [[16, [3], 1]],
        "nature", [[16.0, 3, 1]],
    ],
)  # fmt: skip
def test_malformed_conv_filters_fail_when_the_learner_is_made(conv_filters):
    expected = r"PPOModule: model_config\['conv_filters'\] must be null .* or a non-empty list"
    with pytest.raises(ValueError, match=expected):
        PPOLearner(model_config={"conv_filters": conv_filters})


@pytest.mark.parametrize(
    ("key", "value"), [("conv_activation", "gelu"), ("image_layout", "hwc"), ("conv_filtres", None)]
)
def test_bad_encoder_keys_fail_when_the_learner_is_made(key, value):
    with pytest.raises(ValueError, match=f"PPOModule: .*'{key}'"):
        PPOLearner(model_config={key: value})


def test_the_spec_checks_the_convolutions_again_when_it_gets_its_space_from_the_data_module():
    import dataclasses

    spec = RLModuleSpec(PPOModule, model_config={"conv_filters": [[16, 12, 1]]})  # no space yet: fine
    with pytest.raises(ValueError, match=r"conv_filters\[0\] = \[16, 12, 1\] shrinks the 10x10 image"):
        dataclasses.replace(spec, observation_space=MINATAR, action_space=DISCRETE)


# ---- Flat observations -----------------------------------------------------------------


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32),
        gym.spaces.Discrete(4, start=2),
        gym.spaces.MultiDiscrete([3, 2, 4], start=[1, 0, -1]),
        gym.spaces.MultiDiscrete([[2, 3], [2, 2]]),
        gym.spaces.MultiBinary([2, 3]),
    ],
)
def test_flat_observations_are_laid_out_as_gymnasium_flattens_them(space):
    space.seed(0)
    samples = [space.sample() for _ in range(5)]
    expected = np.stack([gym.spaces.flatten(space, sample) for sample in samples]).astype(np.float32)
    flat = flatten_obs(torch.as_tensor(np.stack(samples)), space)
    assert flat.dtype == torch.float32
    torch.testing.assert_close(flat, torch.as_tensor(expected))
    assert build_observation_encoder(space, {}).out_dim == expected.shape[1]


def test_modules_on_flat_observations_keep_their_layer_names():
    obs = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    mlp = ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]

    def names(*nets: str, layers: list[str] = mlp) -> set[str]:
        return {f"{net}.{layer}" for net in nets for layer in layers}

    assert set(PPOModule(obs, DISCRETE, {}).state_dict()) == names("pi", "vf")
    shared = PPOModule(obs, DISCRETE, {"vf_share_layers": True}).state_dict()
    assert set(shared) == names("encoder", layers=mlp[:4]) | names("pi", "vf", layers=["weight", "bias"])
    assert set(DQNModule(obs, DISCRETE, {}).state_dict()) == names("q_net.q", "target_q_net.q") | {"epsilon"}
    sac = SACModule(obs, BOX_ACTIONS, {})
    assert set(sac.state_dict()) == names("pi", "qf", "qf_twin", "target_qf", "target_qf_twin") | {"log_alpha"}
    assert [online for online, _ in sac.get_target_network_pairs()] == [sac.qf, sac.qf_twin]


# ---- Dict observations -----------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_a_dict_observation_gets_a_cnn_per_image_key_and_the_other_keys_as_they_are(device):
    module = PPOModule(DICT, DISCRETE, {"vf_share_layers": True}).to(device)
    encoder = module.obs_encoder
    assert isinstance(encoder, StructuredEncoder)
    assert [(leaf.path, leaf.start, leaf.stop) for leaf in encoder.leaves] == [
        (("pixels",), 0, 300),
        (("position",), 300, 303),
        (("room",), 303, 307),
    ]
    image_part = encoder.parts[0]
    assert isinstance(image_part, ImageEncoder) and image_part.out_dim == 16 * 8 * 8
    assert encoder.out_dim == 16 * 8 * 8 + 3 + 4
    rows = torch.as_tensor(dict_rows(4), device=device)  # the stored row is float32: the image key's pixels too
    rows[:, :300] = 255.0
    seen = first_conv_inputs(image_part)
    features = encoder(rows)
    # uint8 key divided by 255, whatever the row's dtype
    assert torch.equal(seen[0], torch.ones(4, 3, 10, 10, device=device))
    torch.testing.assert_close(features[:, :1024], image_part(rows[:, :300]))
    torch.testing.assert_close(features[:, 1024:], rows[:, 300:])  # position, then room's one-hot
    assert module.forward_train({Columns.OBS: rows})[Columns.VF_PREDS].shape == (4,)


@pytest.mark.parametrize("device", DEVICES)
def test_a_tuple_of_bytes_keeps_its_uint8_rows_and_scales_only_the_image(device):
    space = gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.Box(0, 255, (10, 10, 1), np.uint8)])
    layout = ObservationLayout(space)
    assert layout.stored_space.dtype == np.uint8
    rows = layout.flatten_batch((np.array([2, 0]), np.full((2, 10, 10, 1), 255, np.uint8)))
    rows = torch.as_tensor(rows, device=device)
    encoder = build_observation_encoder(space, {}).to(device)
    assert isinstance(encoder, StructuredEncoder)
    seen = first_conv_inputs(encoder)
    features = encoder(rows)
    one_hots = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], device=device)
    assert torch.equal(features[:, :3], one_hots)  # one-hots as they are
    assert torch.equal(seen[0], torch.ones(2, 1, 10, 10, device=device))


def test_a_dict_without_images_is_flat():
    space = gym.spaces.Dict({"a": gym.spaces.Box(-1.0, 1.0, (2,)), "b": gym.spaces.Discrete(3)})
    encoder = build_observation_encoder(space, {})
    assert isinstance(encoder, FlatEncoder) and encoder.out_dim == 5
    assert not list(PPOModule(space, DISCRETE, {}).pi_obs_encoder.parameters())


def test_a_dict_observation_module_trains_and_comes_back_from_its_checkpoint(tmp_path):
    # The target action is the room (0, 1 or 2; room 3 never comes): the Discrete key decides.
    rows = dict_rows(256, seed=1)
    rooms = rows[:, 303:307].argmax(1)
    keep = rooms < 3
    batch = {Columns.OBS: rows[keep], Columns.ACTIONS: rooms[keep]}
    spec = RLModuleSpec(BCModule, DICT, DISCRETE, {"fcnet_hiddens": [32], "conv_filters": [[4, 3, 2]]})
    torch.manual_seed(0)
    learner = BCLearner(spec, lr=1e-2)
    learner.build()
    losses = [learner.update_from_batch(batch)["default_policy"]["total_loss"] for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0]

    saved = tmp_path / "learner"
    learner.save_to_path(str(saved))
    loaded = Learner.from_checkpoint(str(saved))
    obs = torch.as_tensor(rows[:8])
    for name, value in learner.module.state_dict().items():
        assert torch.equal(value, loaded.module.state_dict()[name]), name
    module, loaded_module = learner.module["default_policy"], loaded.module["default_policy"]
    assert torch.equal(
        module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS],
        loaded_module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS],
    )

    # The spec and weights as plain data, read back without unpickling.
    torch.save({"spec": spec.to_dict(), "weights": module.state_dict()}, tmp_path / "module.pt")
    data = torch.load(tmp_path / "module.pt", weights_only=True)
    rebuilt = RLModuleSpec.from_dict(data["spec"]).build()
    assert list(rebuilt.observation_space.spaces) == ["pixels", "position", "room"]
    rebuilt.load_state_dict(data["weights"])
    assert torch.equal(
        rebuilt.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS],
        module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS],
    )
