"""Short reports of config errors for ``fit`` and ``validate``: one or two lines and a pointer to ``--help``.

jsonargparse reports a typo in a key or a value of the wrong type as the usage block followed
by a nested "Does not validate against any of the Union subtypes" report that repeats the whole
config. ``short_error`` reads that report and says instead which key is wrong and why:

    lightning-rl fit: error: model.init_args.gama: PPOLearner has no argument 'gama'; did you mean 'gamma'?
    see lightning-rl fit --model.help PPOLearner

    lightning-rl fit: error: model.init_args.minibatch_size: expected an int or None, got 256.5
    see lightning-rl fit --model.help PPOLearner

A message it does not recognise is kept as it is, followed by the same pointer to ``--help``.
"""

from __future__ import annotations

import difflib
import importlib
import re
import types
import typing
from typing import Any

# The parts of jsonargparse's reports that ``short_error`` reads.
_PARSER_KEY = re.compile(r'Parser key "([\w.]+)":')
_CLASS_PATH = re.compile(r"Problem with given class_path '([\w.]+)'")
_NOT_ACCEPTED = re.compile(r"Option '(\w+)' is not accepted")
_UNKNOWN_OPTION = re.compile(r"(?:Subcommand|Group) '[\w.]+' does not accept option '([\w.]+)'")
_UNRECOGNIZED = re.compile(r"(?i)unrecognized arguments: (--?[\w.-]+)")
_GIVEN_VALUE = re.compile(r"(?:Given value|Got value): (.*)")
# The sections whose class a config chooses by ``class_path``.
_CLASS_SECTIONS = ("model", "data")
_ARTICLES = {int: "an int", float: "a float", bool: "a bool", str: "a string", dict: "a dict", list: "a list"}


def short_error(prog: str, message: str, parser: Any = None) -> str:
    """The text to print for a parser error: the problem in one line (two with a hint), then where to look.

    Args:
        prog: The command, e.g. ``"lightning-rl fit"``.
        message: jsonargparse's error message.
        parser: The subcommand's parser, whose keys are the suggestions for an unknown
            top-level key (``trainer.max_epoch``); optional.

    Returns:
        The lines, ending in a newline, with no usage block and no union-type report.
    """
    section = _PARSER_KEY.search(message)
    class_paths = _CLASS_PATH.findall(message)
    see = f"see {prog} --help"
    if section and class_paths:
        name = section.group(1)
        cls = _load(class_paths[-1])  # the innermost class, whose argument is wrong
        own_section = name in _CLASS_SECTIONS and len(class_paths) == 1
        if own_section and cls is not None:
            see = f"see {prog} --{name}.help {cls.__name__}"
        problem = _class_argument_problem(name, cls, class_paths[-1], message, own_section)
    else:
        problem = _top_level_problem(message, parser)
    lines = [f"{prog}: error: {problem or message.strip()}"]
    return "\n".join([*lines, see]) + "\n"


def _class_argument_problem(
    section: str, cls: type | None, class_path: str, message: str, own_section: bool
) -> str | None:
    """An unknown or mistyped init argument of a class chosen by ``class_path``.

    ``own_section``: the class is the one ``model`` or ``data`` chooses, whose arguments are
    keys of their own (``model.init_args.gamma``); otherwise (a callback in ``trainer.callbacks``,
    a class inside an init argument) the section and the class name say where.
    """
    parameters = _init_parameters(cls)
    class_name = class_path.rsplit(".", 1)[-1]
    unknown = _NOT_ACCEPTED.search(message)
    keys = _PARSER_KEY.findall(message)
    name = unknown.group(1) if unknown else keys[-1] if len(keys) >= 2 else None
    if name is None:
        return None
    if unknown:
        where = f"{section}.init_args.{name}" if own_section else section
        return f"{where}: {class_name} has no argument '{name}'{_did_you_mean(name, parameters)}"
    where = f"{section}.init_args.{name}" if own_section else f"{section}: {class_name} argument '{name}'"
    return f"{where}: {_expected(parameters.get(name), message)}"


def _top_level_problem(message: str, parser: Any) -> str | None:
    """An unknown or mistyped key outside a class's init arguments (``trainer.max_epochs``, ``seed_everything``)."""
    unknown = _UNKNOWN_OPTION.search(message) or _UNRECOGNIZED.search(message)
    keys = _parser_keys(parser)
    if unknown:
        key = unknown.group(1).lstrip("-")
        close = difflib.get_close_matches(key, list(keys), n=3)
        hint = f"; did you mean {_quoted(close)}?" if close else ""
        return f"unknown key '{key}'{hint}"
    key = _PARSER_KEY.match(message.lstrip())
    if key and key.group(1) in keys and ("Given value" in message or "Got value" in message):
        name, annotation = key.group(1), keys[key.group(1)]
        return f"{name}: {_expected(annotation, message)}{_class_name_hint(annotation, message)}"
    if key and "\n" not in message.strip():  # 'Parser key "config": File does not exist: ...'
        return f"{key.group(1)}: {message.lstrip()[key.end():].strip()}"
    return None


def _class_name_hint(annotation: Any, message: str) -> str:
    """"; did you mean 'PPOLearner'?" for a mistyped class name given to ``--model`` or ``--data``."""
    given = _GIVEN_VALUE.findall(message)
    if not given or not re.fullmatch(r"[\w.]+", given[0].strip()):
        return ""
    bases = [argument for argument in typing.get_args(annotation) or (annotation,) if isinstance(argument, type)]
    names = {cls.__name__ for base in bases if base is not type(None) for cls in _subclasses(base)}
    close = difflib.get_close_matches(given[0].strip().rsplit(".", 1)[-1], sorted(names), n=3)
    return f"; did you mean {_quoted(close)}?" if close else ""


def _subclasses(base: type) -> set[type]:
    found: set[type] = set()
    pending = [base]
    while pending:
        for cls in pending.pop().__subclasses__():
            if cls not in found:
                found.add(cls)
                pending.append(cls)
    return found


def _expected(annotation: Any, message: str) -> str:
    """``"expected an int or None, got 256.5"``, from the argument's type and the report's given value."""
    given = _GIVEN_VALUE.findall(message)
    value = given[0].strip() if given else "?"
    if len(value) > 60:
        value = value[:57] + "..."
    if annotation is None:
        return f"invalid value {value}"
    return f"expected {describe_type(annotation)}, got {value}"


def describe_type(annotation: Any) -> str:
    """A type annotation in words: ``int | None`` is "an int or None", ``Literal['a', 'b']`` "one of 'a', 'b'"."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_type(argument) for argument in typing.get_args(annotation))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(annotation))
    if annotation is type(None) or annotation is None:
        return "None"
    if annotation in _ARTICLES:
        return _ARTICLES[annotation]
    if isinstance(annotation, type) and origin is None:
        return f"a {annotation.__name__}"
    return "a " + re.sub(r"\b[\w.]+\.(\w+)", r"\1", str(annotation)).replace("typing.", "")


def _did_you_mean(name: str, parameters: dict[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(parameters), n=3, cutoff=0.6)
    if not close:  # "learning_rate" for "lr": a word of the name, or its initials
        initials = "".join(word[:1] for word in name.split("_"))
        close = [parameter for parameter in parameters if parameter == initials or parameter in name.split("_")]
    return f"; did you mean {_quoted(close)}?" if close else ""


def _quoted(names: list[str]) -> str:
    """``'a'``, ``'a' or 'b'``, ``'a', 'b' or 'c'``."""
    quoted = [f"'{name}'" for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _load(class_path: str) -> type | None:
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _init_parameters(cls: type | None) -> dict[str, Any]:
    """The class's init arguments and their types, those taken through ``**kwargs`` included."""
    if cls is None:
        return {}
    from jsonargparse._parameter_resolvers import get_signature_parameters

    try:
        return {parameter.name: parameter.annotation for parameter in get_signature_parameters(cls, None, logger=False)}
    except Exception:  # noqa: BLE001 (a signature jsonargparse cannot read: no suggestions then)
        return {}


def _parser_keys(parser: Any) -> dict[str, Any]:
    """Every key a subcommand's parser takes, with its type where it has one."""
    keys: dict[str, Any] = {}
    for action in getattr(parser, "_actions", []):
        dest = getattr(action, "dest", None)
        if dest and dest not in ("help", "config", "print_config") and not dest.endswith(".help"):
            keys[dest] = getattr(action, "_typehint", None)
    return keys
