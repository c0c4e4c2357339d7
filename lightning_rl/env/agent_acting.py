"""How the agents of the MultiAgentEnvRunner's env copies act: one :class:`Acting` per module, a row per (copy, agent).

Every (env copy, agent) pair owns one row of each module's :class:`~lightning_rl.core.acting.Acting`,
so a recurrent module keeps its state per agent per copy, whichever agents act together in a
step. A copy's rows start afresh (initial state, no previous action or reward) when its episode
changes: a new episode has a new ``id_``, while the chunk an episode continues in keeps it.
For a feed-forward module, acting is :func:`~lightning_rl.core.acting.compute_actions` as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lightning_rl.core.acting import Acting
from lightning_rl.core.rl_modules import RLModule
from lightning_rl.env.multi_agent_episode import AgentID, ModuleID


class AgentActing:
    """The acting state of every (copy, agent) of a runner, for one (Multi)RLModule object.

    Args:
        module: The ``MultiRLModule`` (or single ``RLModule``) the runner was given.
        copies: The runner's env copies, in a fixed order (rows are found by the copy object).
        agents: Every agent that may act in a copy (the env's ``possible_agents``).
    """

    def __init__(self, module: RLModule, copies: Sequence[Any], agents: Sequence[AgentID]) -> None:
        self.module = module
        #: Whether any module carries a recurrent state (otherwise nothing is tracked).
        self.stateful = module.is_stateful()
        self._copy_index = {id(copy): index for index, copy in enumerate(copies)}
        self._agent_index = {agent: index for index, agent in enumerate(agents)}
        self._num_rows = len(copies) * len(agents)
        self._actings: dict[ModuleID, Acting] = {}
        self._episode_ids: list[str | None] = [None] * len(copies)

    def row(self, copy: Any, agent: AgentID) -> int:
        """The row of ``agent`` in ``copy``, the same in every module's :class:`Acting`."""
        return self._copy_index[id(copy)] * len(self._agent_index) + self._agent_index[agent]

    def follow_episode(self, copy: Any, episode_id: str) -> None:
        """Call before ``copy`` acts: if its episode is another than last time, its agents start afresh.

        Args:
            copy: An env copy given to the constructor.
            episode_id: The ``id_`` of the episode running in it.
        """
        index = self._copy_index[id(copy)]
        if not self.stateful or self._episode_ids[index] == episode_id:
            return
        self._episode_ids[index] = episode_id
        first = index * len(self._agent_index)
        rows = torch.arange(first, first + len(self._agent_index))
        for acting in self._actings.values():
            acting.start_episodes(rows)

    def act(
        self,
        module_id: ModuleID,
        module: RLModule,
        rows: Sequence[int],
        obs: torch.Tensor,
        *,
        explore: bool,
        action_mask: torch.Tensor | None,
    ) -> tuple[dict[str, Any], torch.Tensor]:
        """One forward pass of ``module`` (the one ``module_id`` names) for ``rows``.

        Args:
            module_id: The module's id.
            module: The module itself (an :class:`Acting` is rebuilt, its rows afresh, when
                the object under ``module_id`` changes).
            rows: The rows (:meth:`row`) whose observations ``obs`` holds, in order.
            obs: ``[B, *obs_shape]`` on the module's device.
            explore: As in :func:`~lightning_rl.core.acting.compute_actions`.
            action_mask: ``[B, n]`` or ``None``.

        Returns:
            What :meth:`Acting.act` returns.
        """
        acting = self._acting(module_id, module)
        index = torch.as_tensor(rows, dtype=torch.long) if acting.stateful else None
        return acting.act(obs, explore=explore, rows=index, action_mask=action_mask)

    def observe_rewards(self, module_id: ModuleID, rows: Sequence[int], rewards: Sequence[float]) -> None:
        """Record the rewards ``rows`` received (their next ``prev_rewards``); nothing for a module that has not acted.

        Args:
            module_id: The module the rows' agents are mapped to.
            rows: As in :meth:`act`.
            rewards: One per row.
        """
        acting = self._actings.get(module_id)
        if acting is not None and acting.stateful:
            acting.observe_rewards(torch.as_tensor(rewards), torch.as_tensor(rows, dtype=torch.long))

    def _acting(self, module_id: ModuleID, module: RLModule) -> Acting:
        acting = self._actings.get(module_id)
        if acting is None or acting.module is not module:
            acting = self._actings[module_id] = Acting(module, self._num_rows)
        return acting
