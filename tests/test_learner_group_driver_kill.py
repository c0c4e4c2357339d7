"""A killed LearnerGroup driver stops its learners within seconds and leaves no shared-memory block behind.

They used to finish the update they were running (108 s and 2.5 GB each in the red-team run),
then wait for commands until the interpreter's end; now each learner ends itself as soon as the
driver's end of its status-probe pipe closes. The update's batch sits in shared-memory blocks
the driver created; Python's resource tracker (which outlives the killed driver until its
learners are gone too) unlinks them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]

_DRIVER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from _helpers import bc_spec
    from lightning_rl.algorithms.bc import BCLearner
    from lightning_rl.learner.group.learner_group import LearnerGroup

    # A script file with no `if __name__ == "__main__":`: the learners must not run it again.
    group = LearnerGroup(
        BCLearner(module_spec=bc_spec(hiddens=(256, 256))), num_learners=2, num_threads_per_learner=1, timeout_s=600
    )
    rng = np.random.default_rng(0)
    batch = {"obs": rng.normal(size=(20_000, 4)).astype(np.float32), "actions": rng.integers(0, 2, 20_000)}
    # Minutes of work: 2,000 epochs of 20,000 rows in minibatches of 32.
    group.update(batch=batch, num_epochs=2000, minibatch_size=32, async_update=True)
    print(" ".join(str(pid) for pid in group.learner_pids), flush=True)
    print(" ".join(shared.name for request in group._backend._shared.values() for shared in request.blocks), flush=True)
    sys.stdin.read()  # until killed
    """
)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to see the learners")
def test_killing_the_driver_ends_its_learners_within_seconds(tmp_path):
    pythonpath = os.pathsep.join([str(REPOSITORY), str(REPOSITORY / "tests"), os.environ.get("PYTHONPATH", "")])
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    driver = subprocess.Popen(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": pythonpath},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pids = [int(pid) for pid in driver.stdout.readline().split()]
        assert len(pids) == 2, "the driver did not start its learners"
        blocks = driver.stdout.readline().split()
        assert len(blocks) == 2 and all(os.path.exists(f"/dev/shm/{name}") for name in blocks)
        time.sleep(2.0)  # the update is under way
        assert all(os.path.exists(f"/proc/{pid}") for pid in pids)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.2)
        assert not [pid for pid in pids if _alive(pid)], "learners outlived their driver"
        while time.monotonic() < deadline and any(os.path.exists(f"/dev/shm/{name}") for name in blocks):
            time.sleep(0.2)
        assert not [name for name in blocks if os.path.exists(f"/dev/shm/{name}")], "shared memory outlived the group"
    finally:
        driver.kill()
        driver.wait(timeout=30)
        for pid in pids if "pids" in locals() else []:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (an orphan is reaped by init once it exits; a zombie does not run)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
