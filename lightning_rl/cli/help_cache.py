"""A cache of ``lightning-rl fit --help``, ``validate --help`` and ``fit --model.help PPOLearner``, so that they answer in a fraction of a second.

Building that help needs the whole parser, so torch and Lightning (about 6 s of imports on
a 2-core machine, before any parser is built). The text depends only on the installed code,
so the first call saves it and later calls print the saved text, as long as nothing it
depends on has changed: the Python environment (``sys.prefix``), the versions of Python, torch,
Lightning, jsonargparse (and the docstring parsers it reads help from) and gymnasium, every
source file of this package (path, size and modification time), the terminal width and the
environment variables jsonargparse and Lightning read. Any change makes the next call build
the help again. Cached are the forms whose text depends on nothing else: ``SUBCOMMAND --help``
/ ``-h``, and a class's help, ``SUBCOMMAND --KEY.help CLASS`` (``--model.help PPOLearner``,
``--data.help OffPolicyDataModule``) where ``CLASS`` is a short name (resolved among the classes
this package and Lightning import, nothing of the user's) or a dotted path into
``lightning_rl`` or ``lightning``. Anything else (``--config x.yaml --help``, ``--model.help
my_package.MyLearner``) depends on more than the installed code and is always built.

The cache lives in ``$XDG_CACHE_HOME/lightning_rl`` (``~/.cache/lightning_rl`` by default),
one file per help text and terminal width; a cache that cannot be read or written is
skipped, never an error.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import sys
from pathlib import Path

# The distributions whose code decides what the help says.
_DISTRIBUTIONS = ("torch", "lightning", "jsonargparse", "gymnasium", "docstring-parser", "typeshed-client")
# Environment variables that change how jsonargparse and Lightning build the parser.
_ENV_PREFIXES = ("JSONARGPARSE_", "PL_")
_HELP_FLAGS = ("-h", "--help")
# A class's help flag (``--model.help``, ``--trainer.logger.help``) and the class names whose
# help depends on installed code only: short names, and dotted paths into this package or Lightning.
_CLASS_HELP_FLAG = re.compile(r"--[A-Za-z_][\w.]*\.help", re.ASCII)
_INSTALLED_CLASS = re.compile(r"[A-Za-z_]\w*|(lightning_rl|lightning)(\.[A-Za-z_]\w*)+", re.ASCII)
_MAX_NAME = 200  # longer class names are not cached (file names have limits)


class HelpCache:
    """The saved help text of one subcommand, or of one class's arguments under it, valid while its key matches.

    Args:
        subcommand: ``"fit"`` or ``"validate"``.
        directory: Where the text is kept.
        class_help: For a class's help, its flag and class name (``("--model.help", "PPOLearner")``);
            ``None`` for the subcommand's own help.
    """

    def __init__(self, subcommand: str, directory: Path, class_help: tuple[str, str] | None = None) -> None:
        self.columns = shutil.get_terminal_size().columns
        topic = subcommand
        if class_help is not None:  # ("--model.help", "PPOLearner"): one file per flag and class
            flag, name = class_help
            topic = f"{subcommand}-{flag.lstrip('-')}-{name}"
        self.path = directory / f"help-{topic}-{self.columns}.txt"
        self.key = _key(topic, self.columns)

    @classmethod
    def for_args(cls, args: list[str], subcommands: tuple[str, ...]) -> HelpCache | None:
        """The cache for ``args`` when they ask only for a help that depends on installed code, else ``None``.

        Args:
            args: The command's arguments, without the program name: ``SUBCOMMAND --help``
                (or ``-h``), or ``SUBCOMMAND --KEY.help CLASS`` (see the module's docstring).
            subcommands: The subcommands whose help may be cached.
        """
        if not args or args[0] not in subcommands:
            return None
        if len(args) == 2 and args[1] in _HELP_FLAGS:
            return cls(args[0], _cache_directory())
        if (
            len(args) == 3
            and _CLASS_HELP_FLAG.fullmatch(args[1])
            and len(args[2]) <= _MAX_NAME
            and _INSTALLED_CLASS.fullmatch(args[2])
        ):
            return cls(args[0], _cache_directory(), class_help=(args[1], args[2]))
        return None

    def read(self) -> str | None:
        """The saved text if it was saved under the current key, else ``None``."""
        try:
            key, _, text = self.path.read_text(encoding="utf-8").partition("\n")
        except (OSError, UnicodeDecodeError):
            return None
        return text if key == self.key and text else None

    def write(self, text: str) -> None:
        """Save ``text`` under the current key (atomically: a reader sees the old file or the new one)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            temporary.write_text(f"{self.key}\n{text}", encoding="utf-8")
            os.replace(temporary, self.path)
        except OSError:
            pass  # a read-only or full disk only costs the next call its speed


def _cache_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lightning_rl"


def _key(topic: str, columns: int) -> str:
    """A digest of everything the help text of ``topic`` (a subcommand, or a subcommand's class help) depends on."""
    digest = hashlib.sha256()
    # sys.prefix: two environments sharing one checkout (and one cache) may differ in what is installed.
    digest.update(f"{topic}\n{columns}\n{sys.version}\n{sys.prefix}\n".encode())
    for name in _DISTRIBUTIONS:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "-"
        digest.update(f"{name}={version}\n".encode())
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    for name in sorted(os.environ):
        if name.startswith(_ENV_PREFIXES):
            digest.update(f"{name}={os.environ[name]}\n".encode())
    return digest.hexdigest()
