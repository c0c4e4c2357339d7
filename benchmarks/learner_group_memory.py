"""Memory of the LearnerGroup's batch transport: peak PSS of the driver and its learners during an update.

One ``LearnerGroup(num_learners=N)`` (BC, a small MLP, so that training adds little) trains on
one batch of ``--mb`` megabytes (float32 observations and int64 actions), ``--updates`` times.
A thread samples the summed PSS (``/proc/<pid>/smaps_rollup``: a page shared by several
processes, such as a shared-memory block the driver and a learner both map, counts once) of
the driver and all its descendants every few milliseconds. The printed multiple is

    (peak during the update - the idle baseline before the batch was built) / batch bytes

so the driver's batch itself is 1x; the target is 2x (the batch + one copy of its shards).

Run (Linux): ``PYTHONPATH=. python benchmarks/learner_group_memory.py --mb 256``

Measured 2026-11-27 on the 2-core dev machine (CPU, minibatches of 8,192 unshuffled rows),
first / later updates: pickled through the queues (before), 256 MB 4.01x / 5.86x and 1 GB
4.07x / 5.82x; through shared memory, 256 MB 2.06x / 2.09-2.12x and 1 GB 2.11x / 2.14x. Of
the 1 GB peak, per process (``Pss_Anon``, ``Pss_Shmem``): the driver's batch 1.0x, the shared
blocks 1.02x over all processes, the learners' anonymous memory (training) the rest.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
from appo import tree_memory_mb  # this directory is on sys.path when a benchmark runs as a script


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
    root = __import__("os").getpid()
    row_bytes = args.obs_dim * 4 + 8
    rows = int(args.mb * 2**20 // row_bytes)

    def batch_of(n: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        return {
            "obs": rng.standard_normal((n, args.obs_dim), dtype=np.float32),
            "actions": rng.integers(0, 4, size=n),
        }

    settings = dict(minibatch_size=args.minibatch_size, shuffle_batch_per_epoch=False)
    group.update_from_batch(batch_of(1024), **settings)  # warm-up: the learners' first step allocates
    time.sleep(1.0)
    _, idle_mb = tree_memory_mb(root)
    batch = batch_of(rows)
    batch_mb = sum(a.nbytes for a in batch.values()) / 2**20
    _, with_batch_mb = tree_memory_mb(root)
    print(
        f"LearnerGroup(num_learners={args.num_learners}): batch {batch_mb:.0f} MB ({rows} rows), "
        f"idle PSS {idle_mb:.0f} MB, with the batch {with_batch_mb:.0f} MB ({(with_batch_mb - idle_mb) / batch_mb:.2f}x)"
    )
    for update in range(args.updates):
        peak = [0.0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], tree_memory_mb(root)[1])
                time.sleep(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.monotonic()
        group.update_from_batch(batch, **settings)
        seconds = time.monotonic() - start
        stop.set()
        sampler.join()
        print(
            f"update {update + 1}: {seconds:.1f} s, peak PSS {peak[0]:.0f} MB over idle {peak[0] - idle_mb:.0f} MB "
            f"= {(peak[0] - idle_mb) / batch_mb:.2f}x the batch"
        )
    group.shutdown()


if __name__ == "__main__":
    main()
