"""Checkpoint files: written atomically beside their target, checksummed, and every bad file one line naming it."""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch
from _helpers import ACT_SPACE, OBS_SPACE, assert_same_tensors, bc_spec, loader_of, make_trainer, random_batch, weights
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_rl import AtomicCheckpointIO, Learner
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.core.checkpoint import (
    CHECKPOINT_KEY,
    CHECKSUM_KEY,
    FORMAT_VERSION,
    LEARNER_CHECKSUM_KEY,
    TEMPORARY_PREFIX,
    add_learner_checksum,
    atomic_write,
    check_checkpoint_fits,
    read_checkpoint_file,
    save_checkpoint_file,
    with_checksum,
)

# ---- Helpers ------------------------------------------------------------------------------


def _learner() -> BCLearner:
    learner = BCLearner(module_spec=bc_spec(), lr=1e-2)
    learner.build()
    learner.update_from_batch(random_batch(seed=1), timesteps={"num_env_steps_sampled_lifetime": 64})
    return learner


def _fit(directory: Path, *plugins: AtomicCheckpointIO) -> tuple[BCLearner, Path]:
    """Fit a BC Learner on 2 batches, saving ``directory/last.ckpt``; the Learner and that file."""
    learner = BCLearner(module_spec=bc_spec(), lr=1e-2)
    callback = ModelCheckpoint(dirpath=directory, save_last=True)
    trainer = make_trainer(directory, callbacks=[callback], enable_checkpointing=True, plugins=list(plugins))
    trainer.fit(learner, loader_of([random_batch(seed=i) for i in range(2)]))
    return learner, directory / "last.ckpt"


def _resume(path: Path, *plugins: AtomicCheckpointIO) -> BCLearner:
    """Resume ``_fit``'s run from ``path`` (its one epoch is done: the weights stay the file's)."""
    learner = BCLearner(module_spec=bc_spec(), lr=1e-2)
    trainer = make_trainer(path.parent, max_epochs=1, plugins=list(plugins))
    trainer.fit(learner, loader_of([random_batch(seed=i) for i in range(2)]), ckpt_path=path)
    return learner


def _write(kind: str, directory: Path) -> tuple[BCLearner, Path]:
    """A checkpoint of a trained BC Learner written one of three ways; the Learner and the file."""
    if kind == "save_to_path":
        learner = _learner()
        return learner, Path(learner.save_to_path(str(directory / "learner"))) / "learner_state.pt"
    return _fit(directory, *([AtomicCheckpointIO()] if kind == "AtomicCheckpointIO" else []))


def _flip_a_bit_in_the_largest_tensor(file: Path) -> None:
    """Flip one bit in the middle of the largest tensor's bytes (torch.save stores them uncompressed)."""
    with zipfile.ZipFile(file) as archive:
        tensors = [info for info in archive.infolist() if "/data/" in info.filename]
    member = max(tensors, key=lambda info: info.file_size)
    with open(file, "r+b") as handle:
        handle.seek(member.header_offset + 26)  # a local file header's name and extra-field lengths
        name_length, extra_length = struct.unpack("<HH", handle.read(4))
        position = member.header_offset + 30 + name_length + extra_length + member.file_size // 2
        handle.seek(position)
        byte = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes([byte ^ 0x10]))


def _assert_one_line_naming(error: pytest.ExceptionInfo, file: Path, problem: str) -> None:
    message = str(error.value)
    assert "\n" not in message and str(file) in message and problem in message, message
    assert "weights_only" not in message, message  # never the advice to load unsafely


@pytest.fixture
def other_filesystem() -> Iterator[Path]:
    """A fresh directory on /dev/shm, a filesystem other than the temporary directory's."""
    if not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat(tempfile.gettempdir()).st_dev:
        pytest.skip("needs /dev/shm on a filesystem other than the temporary directory's")
    directory = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="lightning_rl-test-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


# ---- Checksums ----------------------------------------------------------------------------

LOADERS: dict[str, Callable[[Path], object]] = {
    "read_checkpoint_file": read_checkpoint_file,
    "Learner.from_checkpoint": lambda file: Learner.from_checkpoint(str(file)),
    "BCLearner.load_from_checkpoint": lambda file: BCLearner.load_from_checkpoint(file),
    "restore_from_path": lambda file: _learner().restore_from_path(str(file)),
}


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("writer", ["AtomicCheckpointIO", "plain Trainer", "save_to_path"])
def test_a_flipped_bit_is_an_error_naming_the_file(writer: str, loader: str, tmp_path: Path):
    _, file = _write(writer, tmp_path)
    _flip_a_bit_in_the_largest_tensor(file)
    torch.load(file, weights_only=True)  # it still loads: only the checksum sees the change
    with pytest.raises(ValueError) as error:
        LOADERS[loader](file)
    _assert_one_line_naming(error, file, "checksum mismatch: the file is damaged")


@pytest.mark.parametrize("plugins", [[AtomicCheckpointIO()], []], ids=["AtomicCheckpointIO", "plain Trainer"])
def test_resuming_a_fit_from_a_flipped_bit_is_an_error_naming_the_file(plugins: list, tmp_path: Path):
    _, file = _fit(tmp_path, *plugins)
    _flip_a_bit_in_the_largest_tensor(file)
    with pytest.raises(ValueError, match="checksum mismatch: the file is damaged") as error:
        _resume(file, *plugins)
    assert str(file) in str(error.value)


@pytest.mark.parametrize(
    ("writer", "change"),
    [
        ("AtomicCheckpointIO", "epoch"),  # outside the Learner's parts: the file's checksum sees it
        ("AtomicCheckpointIO", "weights_seq_no"),
        ("plain Trainer", "weights_seq_no"),  # the Learner's own checksum sees it
        ("save_to_path", "weights_seq_no"),
    ],
)
def test_a_changed_value_under_the_old_checksum_is_an_error(writer: str, change: str, tmp_path: Path):
    _, file = _write(writer, tmp_path)
    content = torch.load(file, weights_only=True)
    if change == "epoch":
        content["epoch"] += 1
    else:
        content.get(CHECKPOINT_KEY, content)["state"]["weights_seq_no"] += 1
    torch.save(content, file)
    with pytest.raises(ValueError) as error:
        read_checkpoint_file(file)
    _assert_one_line_naming(error, file, "checksum mismatch")


def test_a_checkpoint_without_a_checksum_still_loads_every_way(tmp_path: Path):
    fitted, file = _fit(tmp_path, AtomicCheckpointIO())
    content = torch.load(file, weights_only=True)  # a plain torch.save file for any tool
    assert CHECKSUM_KEY in content and LEARNER_CHECKSUM_KEY in content[CHECKPOINT_KEY]
    del content[CHECKSUM_KEY], content[CHECKPOINT_KEY][LEARNER_CHECKSUM_KEY]
    torch.save(content, file)  # as an older lightning_rl wrote it
    for loaded in (Learner.from_checkpoint(str(file)), BCLearner.load_from_checkpoint(file)):
        assert_same_tensors(weights(loaded), weights(fitted))
    assert read_checkpoint_file(file)[CHECKPOINT_KEY]["learner_class"].endswith("BCLearner")
    assert_same_tensors(weights(_resume(file, AtomicCheckpointIO())), weights(fitted))


def test_a_fit_resumes_from_a_file_the_plugin_wrote_with_or_without_the_plugin(tmp_path: Path):
    fitted, file = _fit(tmp_path, AtomicCheckpointIO())
    for plugins in ([AtomicCheckpointIO()], []):
        assert_same_tensors(weights(_resume(file, *plugins)), weights(fitted))


# ---- Bad files: one line naming the file and the problem -----------------------------------


class _Payload:
    """Not plain data: a file holding it must not load."""


def _good_learner_file(directory: Path) -> Path:
    return Path(_learner().save_to_path(str(directory / "good"))) / "learner_state.pt"


def _newer(directory: Path) -> Path:
    file = _good_learner_file(directory)
    content = torch.load(file, weights_only=True)
    content["format_version"] = FORMAT_VERSION + 1
    torch.save(with_checksum(content), file)
    return file


def _bytes(name: str, data: Callable[[Path], bytes]) -> Callable[[Path], Path]:
    def make(directory: Path) -> Path:
        content = data(directory)
        (directory / name).write_bytes(content)
        return directory / name

    return make


BAD_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "missing": (lambda d: d / "nowhere.ckpt", "no such file"),
    "a directory without learner_state.pt": (
        lambda d: (d / "empty_dir").mkdir() or d / "empty_dir",
        "a directory without learner_state.pt",
    ),
    "empty": (_bytes("empty.ckpt", lambda d: b""), "the file is empty (0 bytes)"),
    "truncated": (
        _bytes("truncated.ckpt", lambda d: _good_learner_file(d).read_bytes()[:-300]),
        "the file is truncated or damaged",
    ),
    "garbage text": (_bytes("text.ckpt", lambda d: b"not a checkpoint at all\n" * 40), "not a checkpoint"),
    "random bytes": (
        _bytes("random.ckpt", lambda d: torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes()),
        "not a checkpoint",
    ),
    "code": (
        lambda d: torch.save({"state_dict": {}, "x": _Payload()}, d / "code.ckpt") or d / "code.ckpt",
        "_Payload, which is code, not data",
    ),
    "not lightning_rl": (
        lambda d: torch.save({"state_dict": {"w": torch.zeros(2)}}, d / "other.ckpt") or d / "other.ckpt",
        "not a lightning_rl checkpoint",
    ),
    "newer": (_newer, f"written by a newer lightning_rl (checkpoint format {FORMAT_VERSION + 1}"),
}


@pytest.mark.parametrize("loader", ["read_checkpoint_file", "Learner.from_checkpoint"])
@pytest.mark.parametrize("case", BAD_FILES)
def test_every_bad_file_is_one_line_naming_the_file_and_the_problem(case: str, loader: str, tmp_path: Path):
    make, problem = BAD_FILES[case]
    path = make(tmp_path)
    with pytest.raises(ValueError) as error:
        LOADERS[loader](path)
    _assert_one_line_naming(error, path, problem)


def test_the_plugin_refuses_bad_files_in_one_line_too(tmp_path: Path):
    for case in ("missing", "empty", "truncated", "random bytes", "code"):
        make, problem = BAD_FILES[case]
        path = make(tmp_path)
        with pytest.raises(ValueError) as error:
            AtomicCheckpointIO().load_checkpoint(path)
        _assert_one_line_naming(error, path, problem)


def test_check_checkpoint_fits_names_a_wrong_algorithm(tmp_path: Path):
    file = _good_learner_file(tmp_path)
    checkpoint = read_checkpoint_file(file)
    check_checkpoint_fits(file, checkpoint, BCLearner, OBS_SPACE, ACT_SPACE)
    check_checkpoint_fits(file, checkpoint, Learner)  # the class a BCLearner derives from
    with pytest.raises(ValueError) as error:
        check_checkpoint_fits(file, checkpoint, PPOLearner, OBS_SPACE, ACT_SPACE)
    _assert_one_line_naming(error, file, "wrong algorithm: it was written by lightning_rl.algorithms.bc.BCLearner")


@pytest.mark.parametrize(
    ("observation_space", "action_space", "problem"),
    [
        (gym.spaces.Box(-1.0, 1.0, (3,)), ACT_SPACE, "module 'default_policy' was trained on the observation space"),
        (OBS_SPACE, gym.spaces.Discrete(3), "module 'default_policy' was trained on the action space Discrete(2)"),
    ],
)
def test_check_checkpoint_fits_names_a_wrong_env(observation_space, action_space, problem: str, tmp_path: Path):
    _, file = _fit(tmp_path, AtomicCheckpointIO())
    with pytest.raises(ValueError) as error:
        check_checkpoint_fits(file, read_checkpoint_file(file), BCLearner, observation_space, action_space)
    _assert_one_line_naming(error, file, f"wrong env: {problem}")


# ---- Atomic writes ------------------------------------------------------------------------


def test_save_into_another_filesystem_writes_the_temp_file_beside_the_target(
    other_filesystem: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    temporary_directory = tmp_path / "tmpdir"
    temporary_directory.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary_directory))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read $TMPDIR
    renames: list[tuple[Path, Path]] = []
    real_replace = os.replace

    def recording_replace(source, target) -> None:
        renames.append((Path(source), Path(target)))
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", recording_replace)
    fitted, file = _fit(other_filesystem, AtomicCheckpointIO())

    assert renames and file in [target for _, target in renames]
    for source, target in renames:
        assert source.parent == target.parent and source.name.startswith(TEMPORARY_PREFIX)
    assert list(temporary_directory.iterdir()) == []
    assert not [p for p in other_filesystem.iterdir() if p.name.startswith(TEMPORARY_PREFIX)]
    assert_same_tensors(weights(Learner.from_checkpoint(str(file))), weights(fitted))


def test_a_failed_save_removes_its_temporary_file_and_keeps_the_old_checkpoint(tmp_path: Path):
    file = save_checkpoint_file({"w": torch.arange(3.0)}, tmp_path / "a.ckpt")

    def failing_write(handle) -> None:
        handle.write(b"PK\x03\x04 the start of an archive")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(file, failing_write)
    assert [p.name for p in tmp_path.iterdir()] == ["a.ckpt"]
    assert torch.equal(torch.load(file, weights_only=True)["w"], torch.arange(3.0))


def _save_slowly(file: str, writing: Any) -> None:
    """In a forked child: a checkpoint save that writes the start of an archive, then hangs."""

    def slow_save(obj, handle, *args, **kwargs):
        handle.write(b"PK\x03\x04" + bytes(4096))  # the start of an archive, never finished
        handle.flush()
        writing.set()
        time.sleep(600)

    torch.save = slow_save  # the child's own torch; this process's is untouched
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.zeros(8)}}, file)


@pytest.mark.parametrize("place", ["same filesystem", "other filesystem"])
def test_a_killed_save_leaves_the_previous_checkpoint_loadable(
    place: str, tmp_path: Path, request: pytest.FixtureRequest
):
    directory = tmp_path if place == "same filesystem" else request.getfixturevalue("other_filesystem")
    fitted, file = _fit(directory, AtomicCheckpointIO())

    # A forked copy of this process is the saver: another process, with nothing to import.
    context = multiprocessing.get_context("fork")
    writing = context.Event()
    saver = context.Process(target=_save_slowly, args=(str(file), writing))
    saver.start()
    try:
        assert writing.wait(timeout=120)
    finally:
        os.kill(saver.pid, signal.SIGKILL)
        saver.join()  # reaped: its process no longer runs
    (orphan,) = [p for p in directory.iterdir() if p.name.startswith(TEMPORARY_PREFIX)]
    assert not orphan.name.endswith(".ckpt")  # so Lightning never takes it for a checkpoint

    assert_same_tensors(weights(Learner.from_checkpoint(str(file))), weights(fitted))
    assert_same_tensors(weights(_resume(file)), weights(fitted))

    # The next save removes the orphan, and only it.
    host = orphan.name[len(TEMPORARY_PREFIX) :].split(".")[0]
    kept = [
        f"{TEMPORARY_PREFIX}{host}.{os.getpid()}.b.ckpt.x1.tmp",  # a save in progress in a running process
        f"{TEMPORARY_PREFIX}another-host.1.b.ckpt.x2.tmp",  # another host's: its process cannot be asked
        f"{TEMPORARY_PREFIX}not-ours.tmp",
        "partial.tmp",
        "notes.txt",
    ]
    for name in kept:
        (directory / name).write_bytes(b"the user's")
    before = {p.name for p in directory.iterdir()}
    save_checkpoint_file({"w": torch.zeros(1)}, directory / "next.ckpt")
    assert {p.name for p in directory.iterdir()} == before - {orphan.name} | {"next.ckpt"}


def _orphan_name(directory: Path) -> Path:
    """The name a save killed in a process that has exited would have left in ``directory``."""
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"
    return directory / f"{TEMPORARY_PREFIX}{host}.{exited.stdout.strip()}.last.ckpt.x1.tmp"


def test_resuming_through_the_plugin_removes_killed_saves_beside_the_checkpoint(tmp_path: Path):
    # A resumed run saves into a new version directory, where no later save would meet them.
    _, file = _fit(tmp_path, AtomicCheckpointIO())
    orphan = _orphan_name(tmp_path)
    orphan.write_bytes(b"half a checkpoint")
    (tmp_path / "notes.txt").write_text("the user's")
    _resume(file, AtomicCheckpointIO())
    assert not orphan.exists()
    assert (tmp_path / "notes.txt").exists() and file.exists()


# ---- Learner.load_from_checkpoint runs nothing a checkpoint names ---------------------------


@pytest.mark.parametrize("instantiator", ["builtins.print", "lightning.pytorch.cli.instantiate_module"])
def test_load_from_checkpoint_never_calls_or_imports_what_a_checkpoint_names(
    instantiator: str, tmp_path: Path, capsys: pytest.CaptureFixture
):
    _, file = _fit(tmp_path)
    content = torch.load(file, weights_only=True)
    # LightningCLI's instantiator parses hyperparameters as config: a callable-typed
    # argument given "builtins.print" becomes print, called on every update.
    content["hyper_parameters"].update(
        _instantiator=instantiator, _class_path="antigravity.Learner", policies_to_train="builtins.print"
    )
    del content[CHECKPOINT_KEY]["state"]["should_module_be_updated"]
    add_learner_checksum(content)  # a crafted file, not a damaged one
    torch.save(content, file)

    loaded = BCLearner.load_from_checkpoint(file)
    loaded.update_from_batch(random_batch(seed=3))
    assert capsys.readouterr().out == ""
    assert loaded.hparams.policies_to_train is None
    assert "antigravity" not in sys.modules

    # The Learner's own hyperparameters are values, checked by the Learner: a string is refused.
    content[CHECKPOINT_KEY]["hparams"]["policies_to_train"] = "builtins.print"
    add_learner_checksum(content)
    torch.save(content, file)
    with pytest.raises(ValueError, match="cannot load a Learner from it: policies_to_train must be a list"):
        BCLearner.load_from_checkpoint(file)
    assert capsys.readouterr().out == ""


def test_load_from_checkpoint_gives_the_learner_the_file_holds(tmp_path: Path):
    fitted, file = _fit(tmp_path)
    loaded = BCLearner.load_from_checkpoint(file, map_location="cpu", lr=5e-3)
    assert type(loaded) is BCLearner and loaded.hparams.lr == 5e-3
    assert_same_tensors(weights(loaded), weights(fitted))
    with pytest.raises(ValueError, match=r"does not support \['hparams_file', 'weights_only=False'\]"):
        BCLearner.load_from_checkpoint(file, hparams_file="h.yaml", weights_only=False)


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_files_are_written_with_the_users_umask(umask: int, tmp_path: Path):
    # mkstemp's 0600 made every checkpoint and export private whatever the umask said.
    before = os.umask(umask)
    try:
        path = atomic_write(tmp_path / "file.bin", lambda file: file.write(b"x"))
        save_checkpoint_file({"a": torch.zeros(1)}, tmp_path / "last.ckpt")
    finally:
        os.umask(before)
    for written in (path, tmp_path / "last.ckpt"):
        assert written.stat().st_mode & 0o777 == 0o666 & ~umask, oct(written.stat().st_mode)
