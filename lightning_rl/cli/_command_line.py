"""What the ``evaluate`` and ``export`` commands share: a parser whose errors are one line, and the checks of paths."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from lightning_rl.core.arguments import check_num_envs


class CommandError(Exception):
    """A problem with the user's input, reported as one line (``lightning-rl <command>: error: ...``)."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """``argparse``'s parser, but a usage error is one line naming the problem, not the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def run_command(
    parser: argparse.ArgumentParser, args: list[str], command: Callable[[argparse.Namespace], None]
) -> None:
    """Parse ``args`` and run ``command``; bad input ends the process with one line on stderr and status 2.

    Args:
        parser: The command's parser.
        args: The command line after the command's name.
        command: Runs with the parsed arguments; raises ``CommandError`` or ``ValueError``
            for bad input (a missing file, an env that does not fit, ...), ``ImportError``
            for an optional package that is not installed.
    """
    namespace = parser.parse_args(args)
    try:
        command(namespace)
    except (CommandError, ValueError, ImportError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")


def existing_checkpoint(path: str) -> str:
    """``path`` if a file or directory is there; an argparse type, so a typo is a usage error at once."""
    if not Path(path).exists():
        raise argparse.ArgumentTypeError(f"{path}: no such file or directory")
    return path


def output_file(path: str) -> Path:
    """``path`` as an output file whose directory exists; an argparse type."""
    file = Path(path)
    if file.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a directory; expected a file name")
    if not file.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path}: the directory {file.parent} does not exist")
    return file


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type for ints >= ``minimum``, whose error says so."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, got {value}")
        return value

    return parse


#: An int >= 0; an argparse type.
nonnegative_int = _int_at_least(0)
#: An int >= 1; an argparse type.
positive_int = _int_at_least(1)


def num_envs_int(text: str) -> int:
    """An env count in ``[1, MAX_NUM_ENVS]``; an argparse type, whose error names the ceiling."""
    value = positive_int(text)
    try:
        check_num_envs("--num_envs", value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).replace("--num_envs must be", "expected an int")) from None
    return value


def tell(line: str) -> None:
    """Print a line of the command's report on stdout."""
    print(line, file=sys.stdout, flush=True)
