"""torch.compile of the training forward pass or of the complete update."""

from __future__ import annotations

import pytest
import torch
from _helpers import bc_spec, random_batch

from lightning_rl import DEFAULT_MODULE_ID
from lightning_rl.algorithms.bc import BCLearner


@pytest.mark.slow
@pytest.mark.parametrize("what", ["forward_train", "complete_update"])
def test_compiled_updates_match_eager_updates(what):
    torch.manual_seed(3)
    eager = BCLearner(module_spec=bc_spec(), lr=1e-2)
    eager.build()
    compiled = BCLearner(module_spec=bc_spec(), lr=1e-2, torch_compile=True, torch_compile_what_to_compile=what)
    compiled.build()
    compiled.set_state(eager.get_state())
    for seed in range(3):
        a = eager.update_from_batch(random_batch(seed=seed), num_epochs=2, minibatch_size=24)
        b = compiled.update_from_batch(random_batch(seed=seed), num_epochs=2, minibatch_size=24)
    assert b[DEFAULT_MODULE_ID]["total_loss"] == pytest.approx(a[DEFAULT_MODULE_ID]["total_loss"], rel=1e-4)
    for name, value in eager.module.state_dict().items():
        torch.testing.assert_close(compiled.module.state_dict()[name], value, rtol=1e-4, atol=1e-5)
