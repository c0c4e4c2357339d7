"""Memory of the LearnerGroup's batch transport: peak memory of the driver and its learners during an update.

One ``LearnerGroup(num_learners=N)`` (BC, a small MLP, so that training adds little) trains on
one batch of ``--mb`` megabytes (float32 observations and int64 actions), ``--updates`` times,
through one of the paths of the group's transport (``--batch``): ``numpy`` arrays, which the
group copies into shared memory for each update (target 2x: the batch and one copy),
``shared`` torch tensors built in shared memory (``Tensor.share_memory_()``), which the
learners read where they are (target 1x), or ``batches``: the numpy batch passed as
``update(batches=[first half, second half])``, which the group joins (in shared memory, where
the learners read the join: target 2x).
One thread samples the memory of the driver and all its descendants every few milliseconds,
in four parts: the driver's private pages (``Pss_Anon`` of ``/proc/<pid>/smaps_rollup``), its
descendants' private pages, every process's file pages (``RssFile`` of ``/proc/<pid>/status``)
and every shared-memory block any of them maps, once, at its size. The printed multiple is

    1 + (peak during the update - the reading once the batch is built) / batch bytes

so the driver's batch is exactly 1x, and the target is 2x (the batch + one copy of its
shards); each part's change is printed beside it, and the old multiple, over the idle reading
taken before the batch was built, after it.

Why each reading is taken as it is (each was found to add to the multiple without being the
group's memory):

- Shared blocks are counted from ``/proc/<pid>/maps``, not as summed ``Pss_Shmem``: the
  processes are read one after another, and a block's pages move PSS from the driver to a
  learner as the learner touches them, so a sum read meanwhile counts some pages 1.5 times
  (2.51x where this count reads 2.08x, under load).
- Since 2026-11-27 (evening), four more:
  - The sampling thread runs for the whole benchmark, started before any reading: one thread
    per update (as before) put its new stack and its allocator arena, 0.3-0.4 MB of the
    driver's, into every update's peak.
  - File pages are each process's ``RssFile``, not ``Pss_File``: the PSS of a shared
    library's pages is split among every process on the machine that maps it, so it moved by
    up to 1 MB per process, either way, as other people's Python processes started and ended.
  - The baseline is the reading once the batch is built, the batch counted at its size:
    building it (numpy's random generator) left 0-0.9 MB of scratch in the driver that the
    idle reading did not hold. Nothing of the group runs between the two readings.
  - The warm-up update takes ``--warmup-steps`` (8) full minibatch steps per learner, not one:
    a learner's heap (glibc) keeps growing by 1-2.5 MB over its first full-size steps, the
    activations and gradients of an 8,192-row minibatch (0.5 MB tensors), and then holds it.

What is left over the batch and its shards (0.9-1.4 MB at 256 MB, 2.2-5.0 MB at 1 GB) is the
learners' own private memory, their heap (``mallinfo2``): free chunks glibc keeps between and
above the minibatch steps' tensors, and memory in use that grows by about 2 KB per minibatch
step under DDP until it levels off, about 3.3 MB per learner after some 2,000 steps (measured
over 4,500; one learner does not grow; a plain Lightning DDP fit with manual optimization grows
alike, plain torch DDP does not). It depends on the steps taken so far, not on the batch. No
copy of a shard or of a column is made in either process: a learner's prepared batch is
tensors on the driver's blocks (``test_learner_group_transport.py``), its minibatches views of
them (without shuffling), and the driver's growth during an update reads 0.0 MB.

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

The same evening (load average 10, ``--updates 3``, niced), the measurement above (old) and
this one (new) on the same code, run in turn:

    batch    old                      new (over the idle reading)
    256 MB   2.01x / 2.01x / 2.02x    2.0035x / 2.0045x / 2.0055x (2.0035x / 2.0045x / 2.0055x)
    1 GB     2.01x / 2.02x / 2.03x    2.0022x / 2.0022x / 2.0049x (the same)
    1 GB     (a second run, new only)  2.0023x / 2.0037x / 2.0037x (the same)

No library code changed between the two columns: the drop is the measurement's alone.

Later that evening (load average 7-9, ``--updates 3``, niced, each run in turn), this script on
the library before (3c5de3a) and after the learners read a batch already in shared memory
where it is:

    batch                    before                       after
    256 MB numpy (copied)    2.0040x / 2.0059x / 2.0069x  2.0035x / 2.0080x / 2.0080x
    256 MB --batch shared    2.0045x / 2.0054x / 2.0054x  1.0033x / 1.0060x / 1.0075x
    1 GB --batch shared      2.0020x / 2.0035x / 2.0044x  1.0022x / 1.0022x / 1.0023x
    256 MB --batch batches   3.0045x / 2.9987x / 2.9987x  2.0045x / 2.0065x / 2.0070x

After the change a shared batch adds no block (shared +0.0 MB): only the learners' heap; and
the group joins ``batches=`` in shared memory instead of a private join copied once more.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any, NamedTuple

import numpy as np
import torch


class Reading(NamedTuple):
    """The memory of the driver and its descendants at one moment, in MB, by part."""

    driver: float  # the driver's private pages (Pss_Anon)
    learners: float  # the private pages of its descendants (learners, resource tracker)
    files: float  # file pages, each process's own count (RssFile)
    shared: float  # the shared-memory blocks any of them maps, each once, at its size

    @property
    def total(self) -> float:
        return self.driver + self.learners + self.files + self.shared

    def minus(self, other: Reading) -> str:
        """Each part's change since ``other``, as text."""
        parts = zip(("driver", "learners", "file pages", "shared blocks"), self, other)
        return ", ".join(f"{name} {now - before:+.1f}" for name, now, before in parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=256.0, help="the batch's size in MB (default 256)")
    parser.add_argument("--num-learners", type=int, default=2)
    parser.add_argument("--updates", type=int, default=2, help="updates on the same batch, each measured")
    parser.add_argument("--minibatch-size", type=int, default=8192)
    parser.add_argument(
        "--warmup-steps", type=int, default=8, help="full minibatch steps per learner in the warm-up update (default 8)"
    )
    parser.add_argument("--obs-dim", type=int, default=64)
    parser.add_argument(
        "--batch",
        choices=("numpy", "shared", "batches"),
        default="numpy",
        help="numpy arrays (copied into shared memory per update), torch tensors already in shared memory, or the "
        "numpy batch passed as batches= in two halves (joined by the group)",
    )
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
    sampler = PeakSampler(os.getpid())
    row_bytes = args.obs_dim * 4 + 8
    rows = int(args.mb * 2**20 // row_bytes)

    def batch_of(n: int) -> dict[str, Any]:
        if args.batch == "shared":
            # Built in shared memory: moving an empty tensor there copies untouched (unbacked) pages.
            generator = torch.Generator().manual_seed(0)
            obs = torch.empty((n, args.obs_dim), dtype=torch.float32).share_memory_().normal_(generator=generator)
            actions = torch.empty(n, dtype=torch.int64).share_memory_().random_(0, 4, generator=generator)
            return {"obs": obs, "actions": actions}
        rng = np.random.default_rng(0)
        return {
            "obs": rng.standard_normal((n, args.obs_dim), dtype=np.float32),
            "actions": rng.integers(0, 4, size=n),
        }

    settings = dict(minibatch_size=args.minibatch_size, shuffle_batch_per_epoch=False)

    def train_on(batch: dict[str, Any]) -> None:
        if args.batch == "batches":
            half = len(batch["actions"]) // 2
            group.update(batches=[{k: v[:half] for k, v in batch.items()}, {k: v[half:] for k, v in batch.items()}], **settings)
        else:
            group.update(batch=batch, **settings)
    # Warm-up, through the same path (shared memory, full minibatches): the first updates' one-off
    # allocations, code pages and the learners' heap for a minibatch step are no part of what a batch costs.
    warmup_rows = args.warmup_steps * args.num_learners * args.minibatch_size + 1
    train_on(batch_of(warmup_rows))
    time.sleep(1.0)
    idle = read_tree(sampler.root)
    batch = batch_of(rows)
    batch_mb = sum(a.numel() * a.element_size() if args.batch == "shared" else a.nbytes for a in batch.values()) / 2**20
    with_batch = read_tree(sampler.root)
    # What the batch is; which path of the transport it takes is the library's (2x: copied, 1x: read in place).
    kind = {
        "numpy": "numpy arrays (private memory)",
        "shared": "torch tensors in shared memory (share_memory_())",
        "batches": "numpy arrays (private memory) passed as batches= in two halves",
    }
    print(
        f"LearnerGroup(num_learners={args.num_learners}), a batch of {kind[args.batch]}: {batch_mb:.1f} MB ({rows} rows), idle "
        f"{idle.total:.1f} MB, with the batch {with_batch.total:.1f} MB (+{with_batch.total - idle.total:.1f} MB: "
        f"{with_batch.minus(idle)})"
    )
    for update in range(args.updates):
        sampler.reset()
        start = time.monotonic()
        train_on(batch)
        seconds = time.monotonic() - start
        peak = sampler.peak()
        added = peak.total - with_batch.total
        print(
            f"update {update + 1}: {seconds:.1f} s, peak {peak.total:.1f} MB = {1 + added / batch_mb:.4f}x the batch "
            f"(the batch + {added:.1f} MB: {peak.minus(with_batch)}); "
            f"over the idle reading: {(peak.total - idle.total) / batch_mb:.4f}x"
        )
    sampler.stop()
    group.shutdown()


class PeakSampler:
    """The largest reading of ``root``'s tree since ``reset``, read every few milliseconds by one thread.

    One thread for the whole run, started before the idle reading: its stack and its
    allocator arena (about 0.4 MB) are then in every reading, not counted as the update's.
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._peak: Reading | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            reading = read_tree(self.root)
            with self._lock:
                if self._peak is None or reading.total > self._peak.total:
                    self._peak = reading
            time.sleep(0.005)

    def reset(self) -> None:
        with self._lock:
            self._peak = None

    def peak(self) -> Reading:
        with self._lock:
            peak = self._peak
        return peak if peak is not None else read_tree(self.root)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()


def read_tree(root: int) -> Reading:
    """The memory of ``root`` and its descendants: private pages, file pages, shared blocks once each."""
    driver_kb = descendants_kb = files_kb = 0
    blocks: dict[tuple[str, str], int] = {}
    for pid in _descendants(root) | {root}:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as file:
                for line in file:
                    if line.startswith("Pss_Anon:"):
                        if pid == root:
                            driver_kb += int(line.split()[1])
                        else:
                            descendants_kb += int(line.split()[1])
            with open(f"/proc/{pid}/status") as file:
                for line in file:
                    if line.startswith("RssFile:"):
                        files_kb += int(line.split()[1])
            with open(f"/proc/{pid}/maps") as file:
                for line in file:
                    fields = line.split()
                    if len(fields) >= 6 and fields[5].startswith("/dev/shm/"):
                        start, end = (int(bound, 16) for bound in fields[0].split("-"))
                        blocks[(fields[3], fields[4])] = max(blocks.get((fields[3], fields[4]), 0), end - start)
        except OSError:
            continue  # exited meanwhile
    return Reading(driver_kb / 1024, descendants_kb / 1024, files_kb / 1024, sum(blocks.values()) / 2**20)


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
