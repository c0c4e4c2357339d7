"""Exporting a ``Policy`` for deployment: an ONNX file or a ``torch.export`` program (``.pt2``).

The exported graph is the policy's :class:`~lightning_rl.policy.policy.PolicyNet` in greedy
mode: observation normalization, the module's inference pass, the greedy action and Box
clipping. Its one input is a batch of observations ``obs`` ``[batch, *obs_shape]`` in the
observation space's dtype (the batch dimension is dynamic), its one output the actions
``[batch, *action_shape]`` (int64 indices for Discrete and MultiDiscrete spaces). For a Dict or
Tuple observation space the input is the stored flat layout, ``[batch, flatdim]`` in its stored
dtype (uint8 or float32, see :mod:`~lightning_rl.core.observation_layout`): each row
``gym.spaces.flatten(space, obs)`` of the env's
observation (keys in the Dict's order, Discrete parts one-hot), which the deployment must
compute itself.

A recurrent (stateful) policy's graph takes one step from a given state and returns the next:
inputs ``obs``, ``state_in`` ``[batch, S]`` float32 (the module's state packed, names in sorted
order, :func:`~lightning_rl.core.recurrent.pack_state`; zeros, ``get_initial_state()`` packed,
at an episode's first step), then ``prev_actions`` ``[batch, *action_shape]`` (the previous
step's actions, zeros at an episode's first step) only if the module was built with
``lstm_use_prev_action``, and ``prev_rewards`` ``[batch]`` float32 (the reward after that
step, zero at the first) only with ``lstm_use_prev_reward``; outputs ``actions`` and
``state_out`` ``[batch, S]``, which the deployment feeds back as the next step's ``state_in``.
A torch.export program takes ``prev_actions`` / ``prev_rewards`` by keyword:
``program.module()(obs, state_in, prev_rewards=rewards)``.

A module on PettingZoo's masked observation space (``{"action_mask", "observation"}``, a
self-play connect-four module) exports with one more input, after the others: ``action_mask``
``[batch, n]`` in the mask space's dtype (int8 as PettingZoo gives it; 1 where an action is
legal), beside ``obs``, the observation part. The graph masks the logits as ``Policy.act``
does, so its greedy actions are legal. A torch.export program takes it by keyword:
``program.module()(obs, action_mask=mask)``. The check then runs on random masks, each with at
least one legal action.

Before a file is written, the exported graph is run on 1,000 observations (and masks) and must return
``Policy.act``'s actions (Discrete: equal; Box: within ``EXPORT_ATOL``); a recurrent graph
on :data:`NUM_CHECK_STEPS` consecutive steps of 200 rows, carrying its state as a deployment
would, against ``Policy.act`` on the same steps. The file is then
written atomically, so an existing output is replaced whole or not at all. ONNX needs the
``export`` extra (``pip install "lightning-rl[export]"``: onnx, onnxruntime, onnxscript).

    from lightning_rl.policy.export import export_policy
    export_policy(policy, "policy.onnx", "onnx")
    export_policy(policy, "policy.pt2", "torch")   # torch.export.load("policy.pt2").module()(obs)
"""

from __future__ import annotations

import copy
import io
import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.core.action_masks import ACTION_MASK, observation_part
from lightning_rl.core.checkpoint import atomic_write
from lightning_rl.core.observation_layout import ObservationLayout
from lightning_rl.core.recurrent import batched_initial_state, pack_state
from lightning_rl.policy.policy import Policy, PolicyNet

ExportFormat = Literal["onnx", "torch"]
#: An exported graph as the check runs it: ``obs -> actions``; a recurrent one's
#: ``(obs, state_in=..., [prev_actions=...], [prev_rewards=...]) -> (actions, state_out)``.
GraphRunner = Callable[..., Any]
EXPORT_FORMATS: tuple[str, ...] = ("onnx", "torch")
#: The largest difference allowed between an exported graph's Box actions and ``Policy.act``'s.
EXPORT_ATOL = 1e-5
#: How many observations an export is checked on before it is written.
NUM_CHECK_OBSERVATIONS = 1_000
#: Over how many consecutive steps a recurrent policy's export is checked (the observations split among them).
NUM_CHECK_STEPS = 5
_INPUT_NAME = "obs"
_STATE_OUTPUT_NAME = "state_out"


class ExportCheckError(RuntimeError):
    """An exported graph's actions differ from ``Policy.act``'s (a bug in the export, never bad input)."""


_OUTPUT_NAME = "actions"


def export_policy(policy: Policy, output: str | os.PathLike, format: ExportFormat, *, seed: int = 0) -> Path:
    """Export ``policy``'s greedy graph to ``output``, checked against ``Policy.act`` first.

    Args:
        policy: The policy to export.
        output: The file to write; its directory must exist. An existing file is replaced
            atomically.
        format: ``"onnx"`` (run with onnxruntime) or ``"torch"`` (``torch.export.save``;
            load with ``torch.export.load(output).module()``).
        seed: Seeds the check observations.

    Returns:
        ``output`` as a ``Path``.

    Raises:
        ValueError: For an unknown format or a missing output directory.
        ImportError: For ``"onnx"`` without the ``export`` extra installed.
        ExportCheckError: If the exported graph's actions differ from ``Policy.act``'s (nothing
            is written then).
    """
    if format not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {format!r}; expected one of {list(EXPORT_FORMATS)}")
    output = Path(output)
    if not output.parent.is_dir():
        raise ValueError(f"cannot write {output}: the directory {output.parent} does not exist")
    if output.is_dir():
        raise ValueError(f"cannot write {output}: it is a directory, expected a file name")
    net = _frozen_copy(policy.net)
    example = _example_inputs(
        net,
        torch.as_tensor(sample_observations(policy, 4, seed=seed)),
        torch.as_tensor(sample_action_masks(policy, 4, seed=seed)) if policy.is_masked else None,
    )
    content = _onnx_bytes(net, example) if format == "onnx" else _torch_export_bytes(net, example)
    observations = sample_observations(policy, NUM_CHECK_OBSERVATIONS, seed=seed)
    masks = sample_action_masks(policy, NUM_CHECK_OBSERVATIONS, seed=seed) if policy.is_masked else None
    run = _onnx_runner(content, net.state_inputs) if format == "onnx" else _torch_export_runner(content)
    if net.stateful:
        _check_recurrent_steps(policy, net, observations, masks, run, f"the {format} export", seed)
    elif masks is not None:
        expected = policy.act({ACTION_MASK: masks, "observation": observations})
        check_same_actions(expected, run(observations, **{ACTION_MASK: masks}), f"the {format} export")
    else:
        check_same_actions(policy.act(observations), run(observations), f"the {format} export")
    return atomic_write(output, lambda file: file.write(content))


def _example_inputs(net: PolicyNet, obs: torch.Tensor, masks: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The graph's inputs by name: ``obs``, a recurrent module's initial state and previous step, a mask last."""
    inputs = {_INPUT_NAME: obs}
    if net.stateful:
        inputs.update(_first_step_inputs(net, len(obs)))
    if masks is not None:
        inputs[ACTION_MASK] = masks
    return inputs


def _first_step_inputs(net: PolicyNet, count: int) -> dict[str, torch.Tensor]:
    """``state_in`` (the initial state), and zero ``prev_actions`` / ``prev_rewards`` where the module reads them."""
    inputs = {"state_in": pack_state(batched_initial_state(net.module, count)).float()}
    if "prev_actions" in net.state_inputs:
        space = net.action_space
        dtype = torch.float32 if isinstance(space, gym.spaces.Box) else torch.int64
        inputs["prev_actions"] = torch.zeros((count, *space.shape), dtype=dtype)
    if "prev_rewards" in net.state_inputs:
        inputs["prev_rewards"] = torch.zeros(count, dtype=torch.float32)
    return inputs


def _check_recurrent_steps(
    policy: Policy,
    net: PolicyNet,
    observations: np.ndarray,
    masks: np.ndarray | None,
    run: GraphRunner,
    what: str,
    seed: int,
) -> None:
    """Step the graph and a fresh ``Policy`` of the same module side by side, each carrying its own state."""
    check = Policy(net.module, policy.observation_space, policy.action_space, net.observation_normalization)
    steps = np.array_split(observations, NUM_CHECK_STEPS)
    step_masks = np.array_split(masks, NUM_CHECK_STEPS) if masks is not None else [None] * len(steps)
    rows = min(len(step) for step in steps)
    inputs = {name: value.numpy() for name, value in _first_step_inputs(net, rows).items()}
    rewards = np.random.default_rng(seed).standard_normal((len(steps), rows)).astype(np.float32)
    for step, (obs, mask) in enumerate(zip(steps, step_masks)):
        obs = obs[:rows]
        if mask is None:
            expected = check.act(obs)
            actions, state_out = run(obs, **inputs)
        else:
            expected = check.act({ACTION_MASK: mask[:rows], "observation": obs})
            actions, state_out = run(obs, **inputs, **{ACTION_MASK: mask[:rows]})
        check_same_actions(expected, actions, f"{what} at step {step} of {len(steps)} (carrying its state)")
        check.observe_rewards(rewards[step])
        inputs["state_in"] = state_out
        if "prev_actions" in inputs:
            inputs["prev_actions"] = actions
        if "prev_rewards" in inputs:
            inputs["prev_rewards"] = rewards[step]


def sample_observations(policy: Policy, count: int, seed: int = 0) -> np.ndarray:
    """``count`` observations around what the policy was trained on, within the space's bounds.

    Standard normal draws, scaled and shifted by the observation statistics when the policy
    normalizes observations (so the check covers the range it acts in), then clipped to the
    space's finite bounds; ``Box.sample`` would draw from bounds as wide as ``float32``'s.
    For a Dict or Tuple space: the space's own samples, flattened (valid one-hot parts). For
    a masked space: observations of its observation part (the masks: :func:`sample_action_masks`).
    """
    space = observation_part(policy.observation_space)
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        layout = ObservationLayout(space)
        sampler = copy.deepcopy(space)  # seeded here, leaving the policy's space's generator alone
        sampler.seed(seed)
        return np.stack([layout.flatten_one(sampler.sample()) for _ in range(count)])
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        return (space.start + rng.integers(space.n, size=count)).astype(space.dtype)
    draws = rng.standard_normal((count, *space.shape))
    normalization = policy.observation_normalization
    if normalization is not None:
        draws = draws * normalization.std.cpu().numpy() + normalization.mean.cpu().numpy()
    return np.clip(draws, space.low, space.high).astype(space.dtype)


def sample_action_masks(policy: Policy, count: int, seed: int = 0) -> np.ndarray:
    """``count`` random masks of a masked policy, ``[count, n]`` in the mask space's dtype, each with a legal action.

    Half the actions of a row are illegal on average, so the check sees the module's preferred
    action masked out often; one random action per row is then made legal, as a position of a
    game always has one.

    Args:
        policy: A policy on a masked observation space (``policy.is_masked``).
        count: How many masks.
        seed: Seeds the draws.
    """
    space = policy.observation_space[ACTION_MASK]
    rng = np.random.default_rng(seed + 1)  # not the observations' stream
    masks = rng.integers(0, 2, (count, *space.shape))
    masks[np.arange(count), rng.integers(0, space.shape[-1], count)] = 1
    return masks.astype(space.dtype)


def check_same_actions(expected: np.ndarray, actual: np.ndarray, what: str) -> None:
    """Raise ``ExportCheckError`` unless ``actual`` equals ``expected`` (Box actions: within ``EXPORT_ATOL``).

    Args:
        expected: ``Policy.act``'s actions.
        actual: The exported graph's.
        what: Names the graph in the error.
    """
    actual = np.asarray(actual)
    if actual.shape != expected.shape:
        raise ExportCheckError(f"{what} returned actions of shape {actual.shape}; Policy.act returns {expected.shape}")
    if np.issubdtype(expected.dtype, np.integer):
        differ = int(np.sum(actual != expected))
        if differ:
            raise ExportCheckError(
                f"{what} chose other actions than Policy.act for {differ} of {len(expected)} observations"
            )
        return
    difference = float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64)), initial=0.0))
    if not difference <= EXPORT_ATOL:
        raise ExportCheckError(
            f"{what}'s actions differ from Policy.act's by up to {difference:.3g} (allowed {EXPORT_ATOL})"
        )


def _frozen_copy(net: PolicyNet) -> PolicyNet:
    # A copy on the CPU without gradients, in the policy's own mode (so that it acts as
    # ``Policy.act`` does), leaving the policy's module (perhaps a Learner's) as it was.
    frozen = copy.deepcopy(net).cpu()
    frozen.requires_grad_(False)
    return frozen


def _dynamic_batch(inputs: dict[str, torch.Tensor]) -> dict[str, dict[int, torch.export.Dim]]:
    batch = torch.export.Dim("batch")
    return {name: {0: batch} for name in inputs}


def _split_inputs(inputs: dict[str, torch.Tensor]) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    # obs and state_in go by position; prev_actions / prev_rewards / action_mask by keyword (any may be absent).
    positional = tuple(inputs[name] for name in (_INPUT_NAME, "state_in") if name in inputs)
    keywords = {name: value for name, value in inputs.items() if name not in (_INPUT_NAME, "state_in")}
    return positional, keywords


def _torch_export_bytes(net: PolicyNet, inputs: dict[str, torch.Tensor]) -> bytes:
    args, kwargs = _split_inputs(inputs)
    program = torch.export.export(net, args, kwargs=kwargs, dynamic_shapes=_dynamic_batch(inputs))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return buffer.getvalue()


def _torch_export_runner(content: bytes) -> GraphRunner:
    module = torch.export.load(io.BytesIO(content)).module()

    def run(observations: np.ndarray, **state: np.ndarray) -> Any:
        inputs = {_INPUT_NAME: torch.from_numpy(observations)}
        inputs.update({name: torch.from_numpy(np.asarray(value)) for name, value in state.items()})
        args, kwargs = _split_inputs(inputs)
        with torch.no_grad():
            result = module(*args, **kwargs)
        if isinstance(result, tuple):
            return result[0].numpy(), result[1].numpy()
        return result.numpy()

    return run


def _onnx_bytes(net: PolicyNet, inputs: dict[str, torch.Tensor]) -> bytes:
    _require_onnx()
    args, kwargs = _split_inputs(inputs)
    output_names = [_OUTPUT_NAME, _STATE_OUTPUT_NAME] if net.stateful else [_OUTPUT_NAME]
    # The exporter logs that torchvision's operators are skipped when torchvision is not
    # installed; a policy never uses them.
    registration_log = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration_log.level
    registration_log.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        # The dynamo exporter's own internals call APIs that torch deprecates; nothing to act on.
        warnings.simplefilter("ignore", FutureWarning)
        # Every input shares the one "batch" dim; the exporter warns that it names the axis once,
        # and every input's axis 0 is still named "batch" in the graph.
        warnings.filterwarnings("ignore", message=r"# The axis name: \w+ will not be used", category=UserWarning)
        try:
            program = torch.onnx.export(
                net,
                args,
                kwargs=kwargs,
                dynamo=True,
                verbose=False,
                input_names=list(inputs),
                output_names=output_names,
                dynamic_shapes=_dynamic_batch(inputs),
            )
        finally:
            registration_log.setLevel(level)
    return program.model_proto.SerializeToString()


def _onnx_runner(content: bytes, state_inputs: tuple[str, ...]) -> GraphRunner:
    import onnxruntime

    session = onnxruntime.InferenceSession(content, providers=["CPUExecutionProvider"])
    outputs = [_OUTPUT_NAME, _STATE_OUTPUT_NAME] if state_inputs else [_OUTPUT_NAME]

    def run(observations: np.ndarray, **state: np.ndarray) -> Any:
        feed = {_INPUT_NAME: observations, **{name: np.asarray(value) for name, value in state.items()}}
        result = session.run(outputs, feed)
        return (result[0], result[1]) if state_inputs else result[0]

    return run


def _require_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"exporting to ONNX needs onnx, onnxruntime and onnxscript ({error}); "
            'install them with pip install "lightning-rl[export]"'
        ) from error
