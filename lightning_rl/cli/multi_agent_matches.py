"""What ``evaluate`` and ``record`` play on a multi-agent checkpoint: its PettingZoo env, its modules, an opponent.

A checkpoint is multi-agent when its run trained on ``MultiAgentDataModule`` (its data
module's state or class path in the checkpoint), or, for a ``save_to_path`` directory (which
holds no data-module settings), when ``--config`` names ``MultiAgentDataModule`` or an
``--opponent`` is given.

The env is, in this order: ``--env`` (a PettingZoo env as a data module names it: a registry
id, a module path or a factory path, imported because you named it); the data section of
``--config`` (its ``env`` and ``env_kwargs``); or the checkpoint's data-module settings when
its env is a PettingZoo registry id or a module of PettingZoo's or mpe2's envs
(``pettingzoo.<family>.<name>_vN``, ``mpe2.<name>_vN``): a checkpoint never makes a command
import anything else.

Who plays:

- with an ``--opponent``, the module ``--module_id`` (the checkpoint's only module when it has
  one) against ``random`` (uniform over legal moves), ``heuristic`` (connect four only: win
  now, else block, else random), ``self`` (a copy of the module) or a checkpoint path (its
  module named ``--module_id``, else its only module, else its ``main``). The module takes
  each seat in turn (:func:`~lightning_rl.env.matches.seat_mapping`), so that over an even
  number of games it plays every seat equally often;
- without one, every agent acts with the module the run's ``policy_mapping_fn`` maps it to
  (``shared``: ``default_policy``; ``per_agent``: the agent's own), or with ``--module_id``
  when given.

Games are played greedily unless told otherwise, in ``min(--num_envs, --num_episodes)`` env
copies; copy ``i`` first resets with seed ``S + i`` and its later games go on from its random
state, and a random opponent draws from a generator seeded with ``S``: the same ``--seed``
and ``--num_envs`` replay the same games.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from lightning_rl.cli._command_line import CommandError
from lightning_rl.cli.run_settings import read_data_section, run_base_seed
from lightning_rl.core.checkpoint import checkpoint_file, read_checkpoint_file
from lightning_rl.core.rl_modules import MultiRLModule, RLModule
from lightning_rl.core.spaces import space_to_dict
from lightning_rl.env.frame_recorder import RGB_ARRAY, RecordedFrames
from lightning_rl.env.matches import seat_mapping
from lightning_rl.env.multi_agent_episode import AgentID, ModuleID, MultiAgentEpisode
from lightning_rl.env.multi_agent_runner import MultiAgentEnvRunner
from lightning_rl.env.opponents import OPPONENTS
from lightning_rl.env.pettingzoo_env import check_pettingzoo_env_name, make_pettingzoo_env
from lightning_rl.env.pettingzoo_frames import record_first_episode
from lightning_rl.env.policy_mapping import BUILT_IN_MAPPINGS, PolicyMappingFn, module_spaces
from lightning_rl.policy.loading import checkpoint_module_ids, choose_module_id, policy_module

#: The data module whose checkpoints are multi-agent.
MULTI_AGENT_DATA_MODULE = "MultiAgentDataModule"
#: ``--opponent``'s names; anything else is a checkpoint's path.
SELF_OPPONENT = "self"
OPPONENT_NAMES = (*OPPONENTS, SELF_OPPONENT)
#: The module id the opponent plays under (``opponent_2`` if the evaluated module has this id).
OPPONENT_MODULE_ID = "opponent"
#: The module an opponent checkpoint with several modules falls back to.
MAIN_MODULE_ID = "main"
# PettingZoo's own env modules, which a checkpoint may name: the only imports it can cause.
_PETTINGZOO_ENV_MODULE = re.compile(r"(pettingzoo(\.[a-z][a-z0-9_]*)+|mpe2)\.[a-z][a-z0-9_]*_v[0-9]+")
# The env a heuristic opponent can play (PettingZoo's ``metadata["name"]``).
_CONNECT_FOUR = "connect_four"


@dataclasses.dataclass(frozen=True)
class PettingZooSource:
    """The PettingZoo env to play in, and where that came from.

    Attributes:
        env: A PettingZoo registry id, module path or factory path.
        env_kwargs: Keyword arguments for the env.
        origin: ``"--env"``, ``"--config"`` or ``"the checkpoint"`` (for the report).
        base_seed: The run's base seed, when known.
        policy_mapping_fn: The run's mapping by name (``"shared"``, ``"per_agent"``); ``None``
            when the run mapped agents with a callable, which is not saved.
    """

    env: str
    env_kwargs: dict[str, Any]
    origin: str
    base_seed: int | None
    policy_mapping_fn: str | None

    def make_runner(self, num_envs: int, seed: int, recorded: RecordedFrames | None = None) -> MultiAgentEnvRunner:
        """``num_envs`` copies of the env; copy ``i`` first resets with ``seed + i``; no time limit on a call.

        Args:
            num_envs: The copies.
            seed: Copy 0's first seed.
            recorded: If given, the copies are made with ``render_mode="rgb_array"`` and copy 0's
                first episode's frames are appended to ``recorded.frames`` (``--video``; the
                other copies never render).

        Raises:
            CommandError: With ``recorded``, for ``env_kwargs`` that set another render mode.
        """
        env: str | Callable[..., Any] = self.env
        env_kwargs = self.env_kwargs
        if recorded is not None:
            given = env_kwargs.get("render_mode", RGB_ARRAY)
            if given != RGB_ARRAY:
                raise CommandError(
                    f"--video records rgb_array frames, but the env's env_kwargs set render_mode={given!r}"
                )
            env, env_kwargs = _FirstCopyRecorded(self.env, recorded), {**env_kwargs, "render_mode": RGB_ARRAY}
        # "per_agent" maps any env's agents (each to a module of its own); the games get their own mapping.
        return MultiAgentEnvRunner(
            env,
            env_kwargs=env_kwargs,
            num_envs=num_envs,
            policy_mapping_fn="per_agent",
            seed=seed,
            sample_timeout_s=None,
        )


class _FirstCopyRecorded:
    """An env factory for a runner (``sync`` mode: copies are made in order, here) whose first env records frames.

    Args:
        env: The PettingZoo env's import path.
        recorded: Where copy 0's first episode's frames go (``pettingzoo_frames.record_first_episode``).
    """

    def __init__(self, env: str, recorded: RecordedFrames) -> None:
        self.env = env
        self.recorded = recorded
        self.made = 0

    def __call__(self, **env_kwargs: Any) -> Any:
        built = make_pettingzoo_env(self.env, env_kwargs)
        self.made += 1
        return record_first_episode(built, self.recorded) if self.made == 1 else built


@dataclasses.dataclass
class Match:
    """The modules that play, and how agents map to them.

    Attributes:
        modules: Every module that acts, by id.
        mapping: ``(agent_id, episode) -> module_id``; a seat mapping remembers the games it
            seated, so play each match once.
        module_id: The module evaluated against the opponent; ``None`` without an opponent.
        opponent: ``--opponent`` as given; ``None`` without one.
        opponent_id: The opponent's module id; ``None`` without one.
        mapping_name: How agents map, for the report (``"the run's policy mapping 'shared'"``).
    """

    modules: MultiRLModule
    mapping: PolicyMappingFn
    module_id: ModuleID | None
    opponent: str | None
    opponent_id: ModuleID | None
    mapping_name: str

    def play(
        self,
        runner: MultiAgentEnvRunner,
        num_episodes: int,
        explore: bool,
        on_episode: Callable[[MultiAgentEpisode], None] | None = None,
    ) -> list[MultiAgentEpisode]:
        """Play ``num_episodes`` whole games in ``runner``'s copies; greedy unless ``explore``.

        ``on_episode`` gets each game as it ends (``MultiAgentEnvRunner.sample_episodes``).
        """
        return runner.sample_episodes(
            self.modules,
            num_episodes=num_episodes,
            explore=explore,
            policy_mapping_fn=self.mapping,
            on_episode=on_episode,
        )


def is_multi_agent_checkpoint(checkpoint: Mapping[str, Any], config: Path | None, opponent: str | None) -> bool:
    """Whether ``evaluate`` and ``record`` play ``checkpoint`` in a PettingZoo env (see the module docstring)."""
    saved = checkpoint.get("datamodule_hyper_parameters")
    if saved:
        class_path = saved.get("_class_path")
        named = isinstance(class_path, str) and class_path.rpartition(".")[2] == MULTI_AGENT_DATA_MODULE
        return MULTI_AGENT_DATA_MODULE in checkpoint or named
    if config is not None:
        class_path = read_data_section(config).class_path
        if class_path is not None and class_path.rpartition(".")[2] == MULTI_AGENT_DATA_MODULE:
            return True
    return opponent is not None


def pettingzoo_source(
    env: str | None, config: Path | None, checkpoint: Mapping[str, Any], ckpt_path: str
) -> PettingZooSource:
    """The env to play in: ``--env``, else ``--config``'s data section, else the checkpoint's data settings.

    Raises:
        CommandError: If none of them names a PettingZoo env this command builds without
            importing what a checkpoint names, or the one named does not resolve.
    """
    saved = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    base_seed = run_base_seed(checkpoint, ckpt_path)
    mapping = _mapping_name(saved.get("policy_mapping_fn"))
    if env is not None:
        _check_env(env, "--env")
        return PettingZooSource(env, {}, "--env", base_seed, mapping)
    if config is not None:
        section = read_data_section(config)
        named = section.init_args.get("env")
        if not isinstance(named, str):
            raise CommandError(f"--config {config}: its data section names no PettingZoo env (env: {named!r})")
        _check_env(named, f"--config {config}")
        seed = base_seed if section.seed is None else section.seed
        config_mapping = _mapping_name(section.init_args.get("policy_mapping_fn", "shared"))
        return PettingZooSource(
            named, dict(section.init_args.get("env_kwargs") or {}), "--config", seed, config_mapping
        )
    named = saved.get("env")
    if named is None:
        raise CommandError(f"{ckpt_path}: it holds no data-module settings naming an env; pass --env or --config")
    if not isinstance(named, str) or not (_is_registry_id(named) or _PETTINGZOO_ENV_MODULE.fullmatch(named)):
        raise CommandError(
            f"{ckpt_path}: its env {named!r} is neither a PettingZoo registry id nor a module of PettingZoo's or "
            "mpe2's envs (pettingzoo.<family>.<name>_vN, mpe2.<name>_vN), which is all a checkpoint may make this "
            "command import; pass --env or --config your_config.yaml"
        )
    _check_env(named, str(ckpt_path))
    return PettingZooSource(named, dict(saved.get("env_kwargs") or {}), "the checkpoint", base_seed, mapping)


def load_match(
    ckpt_path: str,
    checkpoint: Mapping[str, Any],
    module_id: str | None,
    opponent: str | None,
    runner: MultiAgentEnvRunner,
    source: PettingZooSource,
    seed: int,
) -> Match:
    """The modules of ``checkpoint`` (and the opponent) that play in ``runner``'s env, and how they are seated.

    Args:
        ckpt_path: The checkpoint's path, for messages.
        checkpoint: Its content.
        module_id: ``--module_id``.
        opponent: ``--opponent``: a name of :data:`OPPONENT_NAMES` or a checkpoint's path; ``None`` for none.
        runner: The env copies (their agents and spaces).
        source: The env, with the run's mapping.
        seed: Seeds a random opponent's generator.

    Raises:
        CommandError: One line for an unknown module id (listing the ids), a mapping to modules
            the checkpoint lacks, a heuristic opponent on another game than connect four, an
            opponent that is neither a name nor an existing checkpoint, or a module whose
            spaces do not fit the env's agents.
    """
    file = checkpoint_file(ckpt_path)
    ids = checkpoint_module_ids(checkpoint, file)
    if opponent is None:
        return _team(file, checkpoint, ids, module_id, runner, source)
    main_id = _chosen(ids, module_id, file)
    main = _fitting_module(checkpoint, main_id, file, runner, runner.possible_agents)
    opponent_module = _opponent(opponent, main, main_id, runner, seed)
    opponent_id = OPPONENT_MODULE_ID if main_id != OPPONENT_MODULE_ID else f"{OPPONENT_MODULE_ID}_2"
    try:
        mapping = seat_mapping(main_id, opponent_id, runner.possible_agents)
    except ValueError as error:
        raise CommandError(
            f"--opponent {opponent}: {source.env} is not a game of two or more players: {error}"
        ) from error
    modules = MultiRLModule({main_id: main, opponent_id: opponent_module})
    return Match(modules, mapping, main_id, opponent, opponent_id, f"{main_id} against {opponent}")


def random_players(match: Match, seed: int) -> Match:
    """``match`` with its recorded players acting uniformly at random (legal moves where the env masks them).

    Against an opponent the evaluated module plays randomly and the opponent as it was; without
    one, every module does. ``record --random_fraction`` plays its random games with it.

    Args:
        match: A match :func:`load_match` returned, not played yet (its seat mapping is its own).
        seed: Seeds the random players' generator.
    """
    replaced = [match.module_id] if match.module_id is not None else list(match.modules.keys())
    modules = {
        module_id: OPPONENTS["random"](
            observation_space=module.observation_space, action_space=module.action_space, model_config={"seed": seed}
        ).eval()
        if module_id in replaced
        else module
        for module_id, module in match.modules.items()
    }
    name = f"random actions for {', '.join(replaced)} ({match.mapping_name})"
    return dataclasses.replace(match, modules=MultiRLModule(modules), mapping_name=name)


def agent_spaces(runner: MultiAgentEnvRunner) -> tuple[dict[str, gym.Space], dict[str, gym.Space]]:
    """``({agent: observation space}, {agent: action space})`` of every possible agent, in the env's order."""
    agents = runner.possible_agents
    return {a: runner.observation_space(a) for a in agents}, {a: runner.action_space(a) for a in agents}


def _team(
    file: Path,
    checkpoint: Mapping[str, Any],
    ids: Sequence[str],
    module_id: str | None,
    runner: MultiAgentEnvRunner,
    source: PettingZooSource,
) -> Match:
    """Every agent on the module the run's mapping (or ``--module_id``) gives it."""
    if module_id is not None:
        _chosen(ids, module_id, file)
        mapping: PolicyMappingFn = _EveryAgent(module_id)
        name = f"every agent on {module_id}"
    elif source.policy_mapping_fn is not None:
        mapping = BUILT_IN_MAPPINGS[source.policy_mapping_fn]
        name = f"the run's policy mapping {source.policy_mapping_fn!r}"
    else:
        raise CommandError(
            f"{file}: its run mapped agents to modules with a function, which is not saved; pass --module_id M "
            "(every agent acts with M) or --opponent"
        )
    spaces = module_spaces(runner.possible_agents, runner.observation_space, runner.action_space, mapping)
    missing = [mapped for mapped in spaces if mapped not in ids]
    if missing:
        raise CommandError(
            f"{file}: {name} maps {source.env}'s agents to {sorted(spaces)}, but it holds {list(ids)}; pass "
            "--module_id M (every agent acts with M) or --opponent"
        )
    probe = MultiAgentEpisode(agent_to_module_mapping_fn=mapping)
    modules = {}
    for mapped in spaces:
        agents = [agent for agent in runner.possible_agents if probe.module_for(agent) == mapped]
        modules[mapped] = _fitting_module(checkpoint, mapped, file, runner, agents)
    return Match(MultiRLModule(modules), mapping, None, None, None, name)


class _EveryAgent:
    """A policy mapping that maps every agent to one module."""

    def __init__(self, module_id: ModuleID) -> None:
        self.module_id = module_id

    def __call__(self, agent_id: AgentID, episode: MultiAgentEpisode) -> ModuleID:
        return self.module_id


def _opponent(name: str, main: RLModule, main_id: str, runner: MultiAgentEnvRunner, seed: int) -> RLModule:
    """The opponent's module: a fixed one by name, a copy of ``main``, or another checkpoint's module."""
    if name == SELF_OPPONENT:
        return copy.deepcopy(main)
    if name in OPPONENTS:
        game = str(runner.envs[0].metadata.get("name", ""))
        if name == "heuristic" and not game.startswith(_CONNECT_FOUR):
            raise CommandError(f"--opponent heuristic plays connect four only, not {game or 'this game'}")
        return OPPONENTS[name](
            observation_space=main.observation_space, action_space=main.action_space, model_config={"seed": seed}
        ).eval()
    if not Path(name).exists():
        raise CommandError(
            f"--opponent {name}: expected one of {list(OPPONENT_NAMES)} or a checkpoint's path, and there is no such "
            "file or directory"
        )
    file = checkpoint_file(name)
    content = read_checkpoint_file(file)
    ids = checkpoint_module_ids(content, file)
    if main_id in ids:
        chosen = main_id
    elif len(ids) == 1:
        chosen = ids[0]
    elif MAIN_MODULE_ID in ids:
        chosen = MAIN_MODULE_ID
    else:
        raise CommandError(
            f"--opponent {name}: it holds {ids}, neither {main_id!r} (--module_id) nor {MAIN_MODULE_ID!r}, nor only "
            "one module: which one plays is unclear"
        )
    try:
        return _fitting_module(content, chosen, file, runner, runner.possible_agents)
    except CommandError as error:
        raise CommandError(f"--opponent {name}: {error}") from error


def _fitting_module(
    checkpoint: Mapping[str, Any], module_id: str, file: Path, runner: MultiAgentEnvRunner, agents: Sequence[AgentID]
) -> RLModule:
    """Module ``module_id`` of ``checkpoint``, in eval mode, checked against the spaces of the agents it plays.

    Raises:
        CommandError: If its observation or action space differs from an agent's.
    """
    module, _ = policy_module(checkpoint, module_id, file)
    for agent in agents:
        for kind, env_space, own in (
            ("observation", runner.observation_space(agent), module.observation_space),
            ("action", runner.action_space(agent), module.action_space),
        ):
            if space_to_dict(env_space) != space_to_dict(own):
                raise CommandError(
                    f"{file}: module {module_id!r} has the {kind} space {own}, but agent {agent!r} of the env has "
                    f"{env_space}"
                )
    return module.eval()


def _chosen(ids: Sequence[str], module_id: str | None, file: Path) -> str:
    try:
        return choose_module_id(ids, module_id, str(file))
    except ValueError as error:
        raise CommandError(str(error).replace("pass module_id=", "pass --module_id")) from error


def _check_env(env: str, where: str) -> None:
    try:
        check_pettingzoo_env_name(env)
    except ValueError as error:
        raise CommandError(f"{where}: {error}") from error


def _is_registry_id(env: str) -> bool:
    import pettingzoo  # an optional dependency: imported when a multi-agent checkpoint is played

    return env in pettingzoo.parallel_registry or env in pettingzoo.aec_registry


def _mapping_name(value: Any) -> str | None:
    return value if isinstance(value, str) and value in BUILT_IN_MAPPINGS else None
