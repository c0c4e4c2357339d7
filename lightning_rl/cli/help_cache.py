"""A cache of ``lightning-rl fit --help`` and ``validate --help``, so that they answer in a fraction of a second.

Building that help needs the whole parser, so torch and Lightning (about 6 s of imports on
a 2-core machine, before any parser is built). The text depends only on the installed code,
so the first call saves it and later calls print the saved text, as long as nothing it
depends on has changed: the Python environment (``sys.prefix``), the versions of Python, torch,
Lightning, jsonargparse (and the docstring parsers it reads help from) and gymnasium, every
source file of this package (path, size and modification time), the terminal width and the
environment variables jsonargparse and Lightning read. Any change makes the next call build
the help again. Only the two-word forms ``SUBCOMMAND --help`` / ``-h`` are cached; anything
else (``--config x.yaml --help``, ``--model.help PPOLearner``) depends on more than the
installed code and is always built.

The cache lives in ``$XDG_CACHE_HOME/lightning_rl`` (``~/.cache/lightning_rl`` by default),
one file per subcommand and terminal width; a cache that cannot be read or written is
skipped, never an error.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import sys
from pathlib import Path

# The distributions whose code decides what the help says.
_DISTRIBUTIONS = ("torch", "lightning", "jsonargparse", "gymnasium", "docstring-parser", "typeshed-client")
# Environment variables that change how jsonargparse and Lightning build the parser.
_ENV_PREFIXES = ("JSONARGPARSE_", "PL_")
_HELP_FLAGS = ("-h", "--help")


class HelpCache:
    """The saved help text of one subcommand, valid while its key matches.

    Args:
        subcommand: ``"fit"`` or ``"validate"``.
        directory: Where the text is kept.
    """

    def __init__(self, subcommand: str, directory: Path) -> None:
        self.columns = shutil.get_terminal_size().columns
        self.path = directory / f"help-{subcommand}-{self.columns}.txt"
        self.key = _key(subcommand, self.columns)

    @classmethod
    def for_args(cls, args: list[str], subcommands: tuple[str, ...]) -> HelpCache | None:
        """The cache for ``args`` when they ask only for a subcommand's help, else ``None``.

        Args:
            args: The command's arguments, without the program name.
            subcommands: The subcommands whose help may be cached.
        """
        if len(args) != 2 or args[0] not in subcommands or args[1] not in _HELP_FLAGS:
            return None
        return cls(args[0], _cache_directory())

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


def _key(subcommand: str, columns: int) -> str:
    """A digest of everything the help text of ``subcommand`` depends on."""
    digest = hashlib.sha256()
    # sys.prefix: two environments sharing one checkout (and one cache) may differ in what is installed.
    digest.update(f"{subcommand}\n{columns}\n{sys.version}\n{sys.prefix}\n".encode())
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
