"""The tune file of ``lightning-rl tune``: read, checked once, into typed settings.

A tune file names a training config and says what to search over and how::

    config: ppo_cartpole.yaml           # a `lightning-rl fit` config, relative to this file
    output_dir: tune_logs/ppo_cartpole  # trial runs, the study's SQLite file, best_config.yaml
    search_space:                       # dotted keys of the training config's model/data sections
      model.init_args.lr: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}
      model.init_args.num_epochs: {type: int, low: 3, high: 15}
      model.init_args.minibatch_size: {type: categorical, choices: [64, 128, 256]}
    trial:                              # set in every trial's config (any dotted key)
      data.init_args.max_env_steps: 30000
    study: {n_trials: 20, n_jobs: 2, sampler: tpe, pruner: median, seed: 0}

Every problem is a ``CommandError`` of one line naming the key (and the closest known key
for a misspelled one). Nothing here becomes code: the values are numbers, strings and lists,
and class paths in the training config reach only LightningCLI, in each trial's fit.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from lightning_rl.callbacks.optuna_trials import DEFAULT_MONITOR, PRUNER_NAMES
from lightning_rl.cli._command_line import CommandError

TOP_LEVEL_KEYS = ("config", "output_dir", "search_space", "trial", "study")
STUDY_KEYS = (
    "n_trials", "n_jobs", "sampler", "pruner", "pruner_args", "storage", "study_name", "seed", "direction", "metric",
)  # fmt: skip
SAMPLERS = ("tpe", "random")
DIRECTIONS = ("maximize", "minimize")
# The keys of one search-space entry, by its type.
PARAMETER_KEYS = {
    "float": ("type", "low", "high", "log", "step"),
    "int": ("type", "low", "high", "log", "step"),
    "categorical": ("type", "choices"),
}
# The sections of a training config that a search space may reach.
SEARCHABLE_SECTIONS = ("model", "data")


@dataclasses.dataclass(frozen=True)
class SearchParameter:
    """One dimension of the search space.

    Attributes:
        key: The dotted key it sets in the training config (``model.init_args.lr``).
        type: ``float``, ``int`` or ``categorical``.
        low: The smallest value (numeric types).
        high: The largest value, included (numeric types).
        log: Sample on a log scale (numeric types).
        step: The spacing of the values (numeric types; not with ``log``).
        choices: The values of a ``categorical`` parameter.
    """

    key: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class StudySettings:
    """How the study runs (the tune file's ``study:`` section).

    Attributes:
        n_trials: Finished trials (complete or pruned) the study ends with, over all runs of it.
        n_jobs: Trials run at once, each a process of its own.
        sampler: ``tpe`` (Optuna's default) or ``random``.
        pruner: ``median``, ``successive_halving`` or ``none``.
        pruner_args: The pruner's keyword arguments (steps are env steps).
        storage: The study's storage URL (``sqlite:///...``).
        study_name: The study's name in the storage.
        seed: The sampler's seed; ``None`` for a random one.
        direction: ``maximize`` or ``minimize`` ``metric``.
        metric: The logged metric a trial is judged by.
    """

    n_trials: int
    n_jobs: int
    sampler: str
    pruner: str
    pruner_args: dict[str, Any]
    storage: str
    study_name: str
    seed: int | None
    direction: str
    metric: str


@dataclasses.dataclass(frozen=True)
class TuneSettings:
    """A checked tune file.

    Attributes:
        tune_file: The tune file.
        train_config_path: The training config it names.
        train_config: That config's content.
        output_dir: Where trial runs, the study's SQLite file and ``best_config.yaml`` go.
        search_space: What each trial samples.
        trial_overrides: Dotted keys set in every trial's config.
        study: How the study runs.
    """

    tune_file: Path
    train_config_path: Path
    train_config: dict[str, Any]
    output_dir: Path
    search_space: tuple[SearchParameter, ...]
    trial_overrides: dict[str, Any]
    study: StudySettings


def read_tune_file(
    path: Path, output_dir: Path | None = None, n_trials: int | None = None, n_jobs: int | None = None
) -> TuneSettings:
    """Read and check the tune file at ``path``; the command line's values win over the file's.

    Args:
        path: The tune file.
        output_dir: ``--output_dir``, if given.
        n_trials: ``--n_trials``, if given.
        n_jobs: ``--n_jobs``, if given.

    Raises:
        CommandError: One line naming the first problem found.
    """
    content = _read_yaml(path, "tune file")
    if not isinstance(content, Mapping):
        raise CommandError(f"{path}: expected a mapping with keys {', '.join(TOP_LEVEL_KEYS)}")
    _check_keys(content, TOP_LEVEL_KEYS, f"{path}: ")
    for required in ("config", "search_space"):
        if required not in content:
            raise CommandError(f"{path}: {required}: missing")
    if not isinstance(content["config"], str):
        raise CommandError(f"{path}: config: expected the path of a training config, got {content['config']!r}")
    train_config_path = (path.parent / content["config"]).resolve()
    train_config = _read_yaml(train_config_path, "training config")
    if not isinstance(train_config, dict):
        raise CommandError(f"{train_config_path}: expected a training config (a mapping with model and data)")
    trial_overrides = _mapping(content.get("trial") or {}, f"{path}: trial")
    for key in trial_overrides:
        _check_dotted_key(key, f"{path}: trial: {key}")
    configured = apply_overrides(train_config, trial_overrides)
    search_space = tuple(
        _search_parameter(key, spec, configured, f"{path}: search_space: {key}")
        for key, spec in _mapping(content["search_space"], f"{path}: search_space").items()
    )
    if not search_space:
        raise CommandError(f"{path}: search_space: empty; give at least one key to search over")
    study_name_default = path.stem
    study_content = _mapping(content.get("study") or {}, f"{path}: study")
    _check_keys(study_content, STUDY_KEYS, f"{path}: study: ")
    study_name = _string(study_content.get("study_name", study_name_default), f"{path}: study: study_name")
    output = Path(output_dir or content.get("output_dir") or Path("tune_logs") / study_name)
    study = StudySettings(
        n_trials=n_trials or _int_at_least(study_content.get("n_trials", 20), 1, f"{path}: study: n_trials"),
        n_jobs=n_jobs or _int_at_least(study_content.get("n_jobs", 1), 1, f"{path}: study: n_jobs"),
        sampler=_one_of(study_content.get("sampler", "tpe"), SAMPLERS, f"{path}: study: sampler"),
        pruner=_one_of(study_content.get("pruner", "median"), PRUNER_NAMES, f"{path}: study: pruner"),
        pruner_args=_mapping(study_content.get("pruner_args") or {}, f"{path}: study: pruner_args"),
        storage=_storage_url(study_content.get("storage"), output, f"{path}: study: storage"),
        study_name=study_name,
        seed=_seed(study_content.get("seed"), f"{path}: study: seed"),
        direction=_one_of(study_content.get("direction", "maximize"), DIRECTIONS, f"{path}: study: direction"),
        metric=_string(study_content.get("metric", DEFAULT_MONITOR), f"{path}: study: metric"),
    )
    return TuneSettings(path, train_config_path, train_config, output, search_space, trial_overrides, study)


def apply_overrides(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with each dotted key of ``overrides`` set (missing mappings on the way are made)."""
    result = _deep_copy(config)
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = result
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = _deep_copy(value)
    return result


def _search_parameter(key: str, spec: Any, config: Mapping[str, Any], where: str) -> SearchParameter:
    """Check one search-space entry against its own rules and against the training config."""
    _check_dotted_key(key, where)
    section = key.split(".")[0]
    if section not in SEARCHABLE_SECTIONS:
        raise CommandError(f"{where}: only the training config's model and data sections are searched")
    known = sorted(flat_keys({section: config.get(section)}))
    if key not in known:
        hint = _did_you_mean(key, known) or ""
        raise CommandError(f"{where}: not a key of the training config (set it there or under trial: to search it){hint}")
    spec = _mapping(spec, where)
    kind = spec.get("type")
    if kind not in PARAMETER_KEYS:
        raise CommandError(f"{where}: type: expected one of {', '.join(PARAMETER_KEYS)}, got {kind!r}")
    _check_keys(spec, PARAMETER_KEYS[kind], f"{where}: ")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise CommandError(f"{where}: choices: expected a non-empty list, got {choices!r}")
        for choice in choices:
            if choice is not None and not isinstance(choice, (bool, int, float, str)):
                raise CommandError(f"{where}: choices: expected numbers, strings, booleans or null, got {choice!r}")
        return SearchParameter(key, kind, choices=tuple(choices))
    number = int if kind == "int" else (int, float)
    bounds = {}
    for name in ("low", "high"):
        value = spec.get(name)
        if isinstance(value, bool) or not isinstance(value, number) or not math.isfinite(value):
            raise CommandError(f"{where}: {name}: expected a finite {kind}, got {value!r}")
        bounds[name] = value
    low, high = bounds["low"], bounds["high"]
    if low > high:
        raise CommandError(f"{where}: low ({low}) is above high ({high})")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise CommandError(f"{where}: log: expected true or false, got {log!r}")
    if log and low <= 0:
        raise CommandError(f"{where}: log: a log scale needs low > 0, got {low}")
    step = spec.get("step")
    if step is not None:
        if log:
            raise CommandError(f"{where}: step: not with log: true (Optuna samples one or the other)")
        if isinstance(step, bool) or not isinstance(step, number) or step <= 0:
            raise CommandError(f"{where}: step: expected a {kind} > 0, got {step!r}")
    return SearchParameter(key, kind, low=low, high=high, log=log, step=step)


def flat_keys(config: Any, prefix: str = "") -> set[str]:
    """Every dotted key of a nested mapping, leaves and the mappings on the way."""
    keys: set[str] = set()
    if isinstance(config, Mapping):
        for name, value in config.items():
            key = f"{prefix}{name}"
            keys.add(key)
            keys |= flat_keys(value, f"{key}.")
    return keys


def _read_yaml(path: Path, what: str) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise CommandError(f"{path}: cannot read the {what}: {error}".replace("\n", " ")) from error


def _check_keys(content: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in content:
        if key not in known:
            hint = _did_you_mean(str(key), known) or f" (expected {', '.join(known)})"
            raise CommandError(f"{where}{key}: unknown key{hint}")


def _did_you_mean(word: str, known: Sequence[str]) -> str | None:
    """``"; did you mean X?"`` for the closest of ``known`` to ``word``, or ``None`` when none is close."""
    close = difflib.get_close_matches(word, known, n=1)
    return f"; did you mean {close[0]}?" if close else None


def _check_dotted_key(key: Any, where: str) -> None:
    if not isinstance(key, str) or not all(key.split(".")):
        raise CommandError(f"{where}: expected a dotted key such as model.init_args.lr")


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise CommandError(f"{where}: expected a mapping, got {value!r}")
    return dict(value)


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise CommandError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _one_of(value: Any, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        hint = _did_you_mean(str(value), choices) or ""
        raise CommandError(f"{where}: expected one of {', '.join(choices)}, got {value!r}{hint}")
    return value


def _int_at_least(value: Any, minimum: int, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CommandError(f"{where}: expected an int >= {minimum}, got {value!r}")
    return value


def _seed(value: Any, where: str) -> int | None:
    return None if value is None else _int_at_least(value, 0, where)


def _storage_url(value: Any, output_dir: Path, where: str) -> str:
    """A SQLite URL: ``value`` as a URL or a file path, by default ``study.db`` in the output directory."""
    if value is None:
        return f"sqlite:///{(output_dir / 'study.db').resolve()}"
    value = _string(value, where)
    if value.startswith("sqlite:///"):
        return value
    if "://" in value:
        raise CommandError(f"{where}: expected a SQLite file (a path, or sqlite:///path), got {value!r}")
    return f"sqlite:///{Path(value).resolve()}"


def _deep_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _deep_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_deep_copy(item) for item in value]
    return value
