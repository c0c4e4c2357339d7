"""V-trace (``core/vtrace.py``) against the IMPALA paper's definition, computed directly."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_rl.core.vtrace import vtrace

GAMMA = 0.9


def _paper_vtrace(
    target_logp, behaviour_logp, rewards, values, bootstrap, discounts, length, rho_bar, pg_rho_bar, c_bar
) -> tuple[list[float], list[float]]:
    """Eq. (1) of Espeholt et al. (2018) for one sequence of ``length`` real steps, as sums, not a recursion."""
    ratio = [math.exp(target_logp[t] - behaviour_logp[t]) for t in range(length)]
    rho = [min(rho_bar, r) if rho_bar is not None else r for r in ratio]
    c = [min(c_bar, r) if c_bar is not None else r for r in ratio]
    value = [values[t] for t in range(length)] + [bootstrap]  # V(x_length) is the bootstrap value
    delta = [rho[t] * (rewards[t] + discounts[t] * value[t + 1] - value[t]) for t in range(length)]
    vs = []
    for s in range(length):
        total, weight = value[s], 1.0
        for t in range(s, length):
            total += weight * delta[t]
            weight *= discounts[t] * c[t]
        vs.append(total)
    next_vs = vs[1:] + [bootstrap]
    pg_rho = [min(pg_rho_bar, r) if pg_rho_bar is not None else r for r in ratio]
    advantages = [pg_rho[s] * (rewards[s] + discounts[s] * next_vs[s] - value[s]) for s in range(length)]
    return vs, advantages


def _sequences(seed: int, steps: int = 6, sequences: int = 5) -> dict[str, torch.Tensor]:
    """Random time-major sequences of different lengths (zero-padded), some ending in a termination."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([steps, steps - 1, 3, 1, steps])[:sequences]
    mask = torch.arange(steps)[:, None] < lengths[None, :]
    terminated = torch.zeros(steps, sequences, dtype=torch.bool)
    terminated[lengths[1] - 1, 1] = True  # sequence 1 ends its episode; the others are cut or truncated
    terminated[1, 4] = True  # an episode ends mid-sequence (the next one starts in the same column)
    return {
        "target_logp": -torch.rand(steps, sequences, generator=generator) * 2,
        "behaviour_logp": -torch.rand(steps, sequences, generator=generator) * 2,
        "rewards": torch.randn(steps, sequences, generator=generator),
        "values": torch.randn(steps, sequences, generator=generator),
        "bootstrap_values": torch.randn(sequences, generator=generator),
        "discounts": GAMMA * (~terminated).float() * mask,
        "loss_mask": mask,
        "lengths": lengths,
    }


@pytest.mark.parametrize(
    ("rho_bar", "pg_rho_bar", "c_bar"), [(1.0, 1.0, 1.0), (0.8, 1.5, 0.5), (None, None, None), (2.0, None, 1.0)]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_vtrace_equals_the_papers_sums_with_clipping_terminations_and_cut_sequences(seed, rho_bar, pg_rho_bar, c_bar):
    data = _sequences(seed)
    lengths = data.pop("lengths")
    out = vtrace(**data, clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar, clip_c_threshold=c_bar)
    for b, length in enumerate(lengths.tolist()):
        column = {key: value[:, b].tolist() for key, value in data.items() if value.dim() == 2}
        vs, advantages = _paper_vtrace(
            column["target_logp"], column["behaviour_logp"], column["rewards"], column["values"],
            float(data["bootstrap_values"][b]), column["discounts"], length, rho_bar, pg_rho_bar, c_bar,
        )  # fmt: skip
        assert out.vs[:length, b].tolist() == pytest.approx(vs, abs=1e-5)
        assert out.pg_advantages[:length, b].tolist() == pytest.approx(advantages, abs=1e-5)
        assert out.vs[length:, b].abs().sum() == 0 and out.pg_advantages[length:, b].abs().sum() == 0


def test_on_policy_without_clipping_the_targets_are_n_step_returns_bootstrapped_at_the_sequences_end():
    data = _sequences(seed=3)
    lengths = data.pop("lengths")
    data["behaviour_logp"] = data["target_logp"].clone()  # no lag: pi == mu
    out = vtrace(**data, clip_rho_threshold=None, clip_pg_rho_threshold=None, clip_c_threshold=None)
    for b, length in enumerate(lengths.tolist()):
        rewards, discounts = data["rewards"][:, b].tolist(), data["discounts"][:, b].tolist()
        values = data["values"][:, b].tolist()
        for s in range(length):
            n_step_return, weight = 0.0, 1.0
            for t in range(s, length):
                n_step_return += weight * rewards[t]
                weight *= discounts[t]
            n_step_return += weight * float(data["bootstrap_values"][b])
            assert float(out.vs[s, b]) == pytest.approx(n_step_return, abs=1e-5)
            next_v = float(out.vs[s + 1, b]) if s + 1 < length else float(data["bootstrap_values"][b])
            td_error = rewards[s] + discounts[s] * next_v - values[s]
            assert float(out.pg_advantages[s, b]) == pytest.approx(td_error, abs=1e-5)


def test_a_two_step_sequence_by_hand():
    # pi/mu = 2 then 0.5; rho = c = min(1, .) = 1 then 0.5; gamma 0.9, no termination, bootstrap 1.
    out = vtrace(
        target_logp=torch.tensor([[math.log(0.8)], [math.log(0.2)]]),
        behaviour_logp=torch.tensor([[math.log(0.4)], [math.log(0.4)]]),
        rewards=torch.tensor([[1.0], [2.0]]),
        values=torch.tensor([[0.5], [1.5]]),
        bootstrap_values=torch.tensor([1.0]),
        discounts=torch.tensor([[GAMMA], [GAMMA]]),
    )
    delta_1 = 0.5 * (2.0 + GAMMA * 1.0 - 1.5)  # 0.7
    v_1 = 1.5 + delta_1  # 2.2
    delta_0 = 1.0 * (1.0 + GAMMA * 1.5 - 0.5)  # 1.85
    v_0 = 0.5 + delta_0 + GAMMA * 1.0 * (v_1 - 1.5)  # 2.98
    assert out.vs[:, 0].tolist() == pytest.approx([v_0, v_1])
    assert out.pg_advantages[:, 0].tolist() == pytest.approx([1.0 + GAMMA * v_1 - 0.5, 0.5 * (2.0 + GAMMA - 1.5)])


def test_bad_shapes_and_a_mask_that_is_not_a_prefix_are_refused():
    data = _sequences(seed=0)
    data.pop("lengths")
    with pytest.raises(ValueError, match=r"rewards has shape \(5, 6\)"):
        vtrace(**{**data, "rewards": data["rewards"].T})
    with pytest.raises(ValueError, match="time-major"):
        vtrace(**{**data, "values": data["values"].reshape(-1)})
    holes = data["loss_mask"].clone()
    holes[0, 0] = False
    with pytest.raises(ValueError, match="prefix"):
        vtrace(**{**data, "loss_mask": holes})
