"""Memory of the LearnerGroup's batch transport: peak memory of the driver and its learners during an update.

One ``LearnerGroup(num_learners=N)`` (BC, a small MLP, so that training adds little) trains on
one batch of ``--mb`` megabytes (float32 observations and int64 actions), ``--updates`` times.
A thread samples the memory of the driver and all its descendants every few milliseconds:
each process's private and file pages (``Pss_Anon + Pss_File`` of ``/proc/<pid>/smaps_rollup``)
plus every shared-memory block any of them maps, once, at its size. The printed multiple is

    (peak during the update - the idle baseline before the batch was built) / batch bytes

so the driver's batch itself is 1x; the target is 2x (the batch + one copy of its shards).

Shared blocks are counted from ``/proc/<pid>/maps`` and not as summed ``Pss_Shmem``: the
processes are read one after another, and a block's pages move PSS from the driver to a
learner as the learner touches them, so a sum read while they do counts some pages 1.5 times:
about +0.4x on a loaded machine (2.51x where this count reads 2.08x), where reading them takes longer.

Run (Linux): ``PYTHONPATH=. python benchmarks/learner_group_memory.py --mb 256``

Measured 2026-11-27 on the 2-core dev machine (CPU, minibatches of 8,192 unshuffled rows),
first / later updates, summed PSS and a warm-up of 1,024 rows: pickled through the queues
(before), 256 MB 4.01x / 5.86x and 1 GB 4.07x / 5.82x; through shared memory, 256 MB 2.06x /
2.09-2.12x and 1 GB 2.11x / 2.14x. Of that excess over 2x, per process: the learners' private
memory (their loss metrics: one small CPU tensor kept per minibatch step, among the steps' large
ones, held freed heap pages until the update ended: about 24 bytes per row) and the driver's (a
Python list of one weight per row, built to cut the shards: 8 bytes per row).

With both gone, measured as above (shared blocks once each, a warm-up through the same path),
the same day and machine under a load average of 10 (other jobs), each tree run in turn:

    batch    before (c5e8315)         after
    256 MB   2.05x / 2.09x / 2.09x    2.01x / 2.02x / 2.02x
    1 GB     2.06x / 2.09x / 2.09x    2.01x / 2.01x / 2.01x

The rest, 3-13 MB, does not grow with the batch (mostly the learners' private memory, 1-2 MB each).
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=256.0, help="the batch's size in MB (default 256)")
    parser.add_argument("--num-learners", type=int, default=2)
    parser.add_argument("--updates", type=int, default=2, help="updates on the same batch, each measured")
    parser.add_argument("--minibatch-size", type=int, default=8192)
    parser.add_argument("--obs-dim", type=int, default=64)
    args = parser.parse_args()

    import gymnasium as gym

    from lightning_rl import LearnerGroup, RLModuleSpec
    from lightning_rl.algorithms.bc import BCLearner, BCModule

    spec = RLModuleSpec(
        module_class=BCModule,
        observation_space=gym.spaces.Box(-np.inf, np.inf, (args.obs_dim,), np.float32),
        action_space=gym.spaces.Discrete(4),
        model_config={"fcnet_hiddens": [16]},
    )
    group = LearnerGroup(
        BCLearner(module_spec=spec, lr=1e-4), num_learners=args.num_learners, num_threads_per_learner=1, timeout_s=600
    )
    root = os.getpid()
    row_bytes = args.obs_dim * 4 + 8
    rows = int(args.mb * 2**20 // row_bytes)

    def batch_of(n: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        return {
            "obs": rng.standard_normal((n, args.obs_dim), dtype=np.float32),
            "actions": rng.integers(0, 4, size=n),
        }

    settings = dict(minibatch_size=args.minibatch_size, shuffle_batch_per_epoch=False)
    # Warm-up, through the same path (shared memory, several minibatches): the first update's
    # one-off allocations and code pages are no part of what a batch costs.
    group.update_from_batch(batch_of(2 * args.minibatch_size + 1), **settings)
    time.sleep(1.0)
    idle_mb = tree_memory_mb(root)
    batch = batch_of(rows)
    batch_mb = sum(a.nbytes for a in batch.values()) / 2**20
    with_batch_mb = tree_memory_mb(root)
    print(
        f"LearnerGroup(num_learners={args.num_learners}): batch {batch_mb:.0f} MB ({rows} rows), "
        f"idle {idle_mb:.0f} MB, with the batch {with_batch_mb:.0f} MB ({(with_batch_mb - idle_mb) / batch_mb:.2f}x)"
    )
    for update in range(args.updates):
        peak = [0.0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], tree_memory_mb(root))
                time.sleep(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.monotonic()
        group.update_from_batch(batch, **settings)
        seconds = time.monotonic() - start
        stop.set()
        sampler.join()
        print(
            f"update {update + 1}: {seconds:.1f} s, peak {peak[0]:.0f} MB over idle {peak[0] - idle_mb:.0f} MB "
            f"= {(peak[0] - idle_mb) / batch_mb:.2f}x the batch"
        )
    group.shutdown()


def tree_memory_mb(root: int) -> float:
    """The memory of ``root`` and its descendants, in MB: private and file pages (PSS), shared blocks once each."""
    tree = _descendants(root) | {root}
    private_kb, blocks = 0, {}
    for pid in tree:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as file:
                for line in file:
                    if line.startswith(("Pss_Anon:", "Pss_File:")):
                        private_kb += int(line.split()[1])
            with open(f"/proc/{pid}/maps") as file:
                for line in file:
                    fields = line.split()
                    if len(fields) >= 6 and fields[5].startswith("/dev/shm/"):
                        start, end = (int(bound, 16) for bound in fields[0].split("-"))
                        blocks[(fields[3], fields[4])] = max(blocks.get((fields[3], fields[4]), 0), end - start)
        except OSError:
            continue  # exited meanwhile
    return private_kb / 1024 + sum(blocks.values()) / 2**20


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as file:
                    parents[int(entry)] = int(file.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, frontier = set(), [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in found]
        found.update(children)
        frontier.extend(children)
    return found


if __name__ == "__main__":
    main()
