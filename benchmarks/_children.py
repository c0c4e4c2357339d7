"""What the benchmark drivers (``ppo_cartpole.py``, ``off_policy.py``) share about their children.

Each driver runs every (seed, variant) as a fresh subprocess that reports in protocol lines
(``HEAD key=value ...``); this module launches such a child, reads the lines every protocol
has (``TRAINING_START time=<unix time>``, ``PEAK_RSS_MB=<float>``) and hands the others to
the driver, and holds the small helpers both drivers use to report and save the runs.
What each protocol line beyond those means stays in its driver.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent  # the children run from here


# ``--device`` of the drivers and their children: where the networks live and the gradient steps run.
DEVICES = ("cpu", "cuda")


def add_device_argument(parser: Any) -> None:
    """Add ``--device cpu|cuda`` (default ``cpu``) to an ``argparse`` parser."""
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="where every variant's networks live and train: ours through the Trainer's accelerator, the "
        "hand-written loop and SB3 on that torch device (default: cpu)",
    )


def check_device(device: str) -> None:
    """Exit with one line on stderr if ``device`` is ``"cuda"`` and this machine has no CUDA."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("--device cuda: CUDA is not available here (torch.cuda.is_available() is False); use --device cpu")


def trainer_device_args(device: str) -> list[str]:
    """``LightningRLCLI`` flags that put our Trainer on ``device``: one GPU for ``cuda``, the CPU otherwise.

    Explicit for the CPU too: the Trainer's default accelerator ("auto") would take a GPU where there is one.
    """
    return ["--trainer.accelerator", "gpu" if device == "cuda" else "cpu", "--trainer.devices", "1"]


def synchronize_device() -> None:
    """Wait for queued CUDA work (if this process started any), so a wall-clock reading covers it."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def parse_fields(line: str) -> dict[str, str]:
    """'EVAL env_steps=1 return_mean=2.5' -> {'env_steps': '1', 'return_mean': '2.5'}; 'reason=' takes the rest."""
    rest = line.split(" ", 1)[1] if " " in line else ""
    if rest.startswith("reason="):
        return {"reason": rest[len("reason=") :]}
    return dict(token.partition("=")[::2] for token in rest.split())


def follow_child(
    command: list[str],
    record: dict[str, Any],
    handle: Callable[[str, str, float], bool],
    *,
    threads: int,
    timeout: float,
    show_output: bool,
    on_launch: Callable[[subprocess.Popen], None] | None = None,
) -> tuple[int, list[str], float]:
    """Launch one child, follow its protocol lines until it exits, and fill ``record`` as they come.

    The child runs from the repo root with ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` set to
    ``threads``, unbuffered, stderr folded into stdout, and is killed after ``timeout``
    seconds. ``TRAINING_START`` sets ``record["setup_s"]`` (its time minus the launch) and
    ``PEAK_RSS_MB=`` sets ``record["peak_rss_mb"]``; every other line goes to ``handle``.

    Args:
        command: The child's command line.
        record: The run's record; it must name the ``"variant"`` (the prefix of echoed lines).
        handle: ``handle(head, line, launch)`` for the driver's own lines (``head`` is the
            line's first word, ``launch`` the unix time just before the launch); returns
            whether the line was one of them.
        threads: OMP/MKL threads of the child.
        timeout: Seconds before the child is killed.
        show_output: Echo the lines no one handled, as they come.
        on_launch: Called with the child's ``Popen`` right after the launch (to watch it, e.g.
            its process tree's memory).

    Returns:
        ``(returncode, other_lines, launch)``: the child's exit status, the lines no one
        handled (for an error report), and the launch time.
    """
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    other_lines: list[str] = []
    launch = time.time()
    proc = subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    if on_launch is not None:
        on_launch(proc)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            head = line.split(" ", 1)[0]
            if head == "TRAINING_START":
                record["setup_s"] = float(parse_fields(line)["time"]) - launch
            elif line.startswith("PEAK_RSS_MB="):
                record["peak_rss_mb"] = float(line.partition("=")[2])
            elif not handle(head, line, launch):
                other_lines.append(line)
                if show_output:
                    print(f"    [{record['variant']}] {line}", flush=True)
        returncode = proc.wait()
    finally:
        timer.cancel()
    return returncode, other_lines, launch


def rotated(variants: list[str], index: int) -> list[str]:
    """The variants' order for the ``index``-th seed: rotated, so no variant always runs first or after the same one."""
    return variants[index % len(variants) :] + variants[: index % len(variants)]


def available_variants(requested: list[str]) -> list[str]:
    """``requested`` without repeats, and without ``"sb3"`` (saying so) when stable_baselines3 is not installed."""
    variants = list(dict.fromkeys(requested))
    if "sb3" in variants and importlib.util.find_spec("stable_baselines3") is None:
        print("sb3: stable_baselines3 is not installed (pip install stable-baselines3); running without it")
        variants.remove("sb3")
    return variants


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted by ``spec``, or ``"-"`` for None (a table cell)."""
    return "-" if value is None else format(value, spec)


def finite_or_none(value: Any) -> Any:
    """JSON has no inf/nan: write them as null (a run's status says which runs got there)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item) for item in value]
    return value


def print_versions() -> dict[str, str | None]:
    """Print the installed versions on one line (:func:`versions`); return them all."""
    info = versions()
    print(", ".join(f"{name} {version}" for name, version in info.items() if version))
    return info


def write_json(path: str, payload: dict[str, Any], *, announce: bool = True) -> None:
    """Write ``payload`` to ``path`` as indented JSON (inf/nan as null, other non-JSON values as text).

    Args:
        path: The file, replaced whole.
        payload: What to write.
        announce: Whether to print that it was written (a driver that rewrites the file after
            every run, so that a stopped run keeps what finished, says so once at the end).
    """
    Path(path).write_text(json.dumps(finite_or_none(payload), indent=2, default=str))
    if announce:
        print(f"wrote {path}")


def versions() -> dict[str, str | None]:
    """Python's and the benchmarked packages' versions (None: not installed)."""
    found: dict[str, str | None] = {"python": sys.version.split()[0]}
    for dist in ("torch", "lightning", "gymnasium", "stable-baselines3", "lightning-rl"):
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = None
    return found
