"""The one table benchmarks/gpu_check.sh ends with: the GPU lane's counts and each benchmark's key numbers.

    python benchmarks/_gpu_table.py OUT_DIR

Reads what gpu_check.sh left in ``OUT_DIR``: ``sections.tsv`` (each section's exit status,
seconds and log), the lane's ``lane.xml`` (JUnit; its log's pytest summary line if that is
missing), ``learner_update_*.log`` (the paired table of ``benchmarks/learner_update.py``) and
``off_policy_{dqn,sac}_{gpu,cpu}.json`` (``benchmarks/off_policy.py --json``). Whatever cannot be
read is ``n/a`` with the log to look at; this script never fails on a bad or missing file.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

LEARNER_UPDATE = {
    "learner_update mlp256": ("learner_update_mlp256.log", "update, MLP [256, 256], 4000/128/10"),
    "learner_update mlp1024": ("learner_update_mlp1024.log", "update, MLP [1024, 1024], 65536/4096/2"),
    "learner_update cnn": ("learner_update_cnn.log", "update, Atari Nature CNN, 1024/256/4"),
}
OFF_POLICY = {"dqn": "DQN CartPole-v1", "sac": "SAC Pendulum-v1"}
# A row of learner_update.py's paired table: "(a) hand-written loop   0.0063   0.0018   40,917   1.00x [..]".
ROW = re.compile(r"^\((?P<tag>[a-z])\)\s+(?P<label>.+?)\s{2,}(?P<median>[\d.]+)\s+(?P<best>[\d.]+)\s+"
                 r"(?P<rate>[\d,]+)\s+(?P<paired>-?[\d.]+)x")  # fmt: skip
SHORT = {"b": "Learner", "c": "Trainer.fit", "d": "cuda_graphs"}
PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")


def read_sections(out: Path) -> dict[str, dict[str, str]]:
    try:
        lines = (out / "sections.tsv").read_text().splitlines()[1:]
    except OSError:
        return {}
    sections = {}
    for line in lines:
        parts = line.split("\t")
        if len(parts) == 4:
            sections[parts[0]] = {"rc": parts[1], "seconds": parts[2], "log": parts[3]}
    return sections


def status_of(section: dict[str, str] | None) -> str:
    if section is None:
        return "not run"
    return {"0": "ok", "124": "TIMED OUT", "137": "TIMED OUT", "125": "skipped (no time)",
            "126": "not available"}.get(section["rc"], f"exit {section['rc']}")  # fmt: skip


def lane_counts(out: Path, log: Path) -> tuple[str, str]:
    """("N passed, M failed, K skipped", the failed test ids) from the JUnit file, else the log's summary line."""
    try:
        root = ElementTree.parse(out / "lane.xml").getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        failed = []
        for suite in suites:
            for key in counts:
                counts[key] += int(suite.get(key, 0))
            for case in suite.iter("testcase"):
                if case.find("failure") is not None or case.find("error") is not None:
                    failed.append(f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}")
        passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
        text = f"{passed} passed, {counts['failures']} failed, {counts['errors']} errors, {counts['skipped']} skipped"
        return text, ", ".join(failed)
    except (OSError, ElementTree.ParseError, ValueError):
        pass
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "n/a", ""
    failed = [line.split()[1] for line in lines if line.startswith(("FAILED ", "ERROR ")) and len(line.split()) > 1]
    for line in reversed(lines):
        found = PYTEST_COUNTS.findall(line)
        if found:
            return ", ".join(f"{count} {what}" for count, what in found), ", ".join(failed)
    return "n/a", ""


def learner_update_result(log: Path) -> str:
    """'hand-written N samples/s; Learner 0.97x; Trainer.fit 0.92x; <other variants> ...' or 'n/a'."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "n/a"
    rows = [match for line in text.splitlines() if (match := ROW.match(line.strip()))]
    if not rows:
        return "n/a"
    parts = []
    for row in rows:
        if row["tag"] == "a":
            parts.append(f"hand-written {row['rate']} samples/s")
        else:
            label = SHORT.get(row["tag"], row["label"].strip())
            parts.append(f"{label} {float(row['paired']):.2f}x")
    return "; ".join(parts)


def off_policy_rate(path: Path, algo: str) -> float | None:
    """Our median env steps/s in an ``off_policy.py --json`` file; None if it has none."""
    try:
        payload: dict[str, Any] = json.loads(path.read_text())
        rate = payload["algos"][algo]["summary"]["variants"]["ours"]["median_steps_per_s"]
        return float(rate) if rate else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(out: Path) -> None:
    sections = read_sections(out)
    rows: list[tuple[str, str, str, str, str]] = []  # check, status, result, seconds, log

    def row(name: str, check: str, result: str, log: Path) -> None:
        section = sections.get(name)
        seconds = section["seconds"] if section else ""
        shown_log = "" if result != "n/a" and section and section["rc"] == "0" else str(log)
        rows.append((check, status_of(section), result, seconds, shown_log))

    if "install" in sections:
        install_log = Path(sections["install"]["log"])
        row("install", "wheels from .whl/ into /tmp/site", "installed" if sections["install"]["rc"] == "0" else "n/a",
            install_log)  # fmt: skip
    lane_log = out / "lane.log"
    counts, failed = lane_counts(out, lane_log)
    row("test lane", "test lane (pytest -m gpu)", counts + (f"; failed: {failed}" if failed else ""), lane_log)
    # The lane's exit status is non-zero on a failed test: keep its log in the table then.
    if failed and rows[-1][4] == "":
        rows[-1] = (*rows[-1][:4], str(lane_log))

    for name, (log_name, check) in LEARNER_UPDATE.items():
        row(name, check, learner_update_result(out / log_name), out / log_name)

    for algo, check in OFF_POLICY.items():
        gpu, cpu = (off_policy_rate(out / f"off_policy_{algo}_{role}.json", algo) for role in ("gpu", "cpu"))
        graphs = off_policy_rate(out / f"off_policy_{algo}_graphs.json", algo)
        if gpu is not None and cpu is not None:
            result = f"GPU {gpu:,.0f} env steps/s, CPU {cpu:,.0f}: GPU/CPU {gpu / cpu:.2f}x"
            if graphs is not None:
                result += f"; GPU with cuda_graphs {graphs:,.0f}: {graphs / cpu:.2f}x CPU"
        else:
            parts = [f"{role} {'n/a' if rate is None else f'{rate:,.0f} env steps/s'}" for role, rate in
                     (("GPU", gpu), ("CPU", cpu))]  # fmt: skip
            result = "n/a (" + ", ".join(parts) + ")"
        log = out / f"off_policy_{algo}_{'gpu' if gpu is None else 'cpu'}.log"
        section = sections.get("off_policy")
        if not log.exists() and section is not None:
            log = Path(section["log"])  # the runs never started: the section's log says why
        rows.append((f"off_policy {check} (ours)", status_of(section), result,
                     section["seconds"] if section else "", "" if gpu is not None and cpu is not None else str(log)))  # fmt: skip

    if os.environ.get("GPU_CHECK_DEVICE") == "cpu":
        print("dry run on the CPU (GPU_CHECK_DEVICE=cpu): tiny sizes, and 'GPU' below is the CPU\n")
    print("| check | status | result | s | log |")
    print("|---|---|---|---:|---|")
    for check, status, result, seconds, log in rows:
        print(f"| {check} | {status} | {result} | {seconds} | {log} |")
    total = sum(int(section["seconds"]) for name, section in sections.items() if name != "versions")
    print(f"\nsections took {total} s in all; logs in {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_check_out"))
