"""Which episodes an evaluation keeps when several envs play side by side.

Keeping the first ``num_episodes`` episodes to *end* favours short ones: they win the race to
the finish, so the mean return of a policy whose episode lengths vary reads low (or high). An
evaluation that keeps the first ``num_episodes`` episodes to *start*, each played to its end,
keeps what sequential play would: whether an episode counts is decided before it is played.
``lightning-rl evaluate`` and ``record``, :meth:`EnvRunner.sample_episodes` and
:meth:`MultiAgentEnvRunner.sample_episodes` all keep their episodes by this one rule.
"""

from __future__ import annotations

from lightning_rl.core.arguments import check_int


class EpisodeQuota:
    """The first ``num_episodes`` episodes to start in ``num_envs`` envs, each played to its end.

    Envs ``0 .. min(num_envs, num_episodes) - 1`` start the first episodes; an env whose counted
    episode ends starts the next one while fewer than ``num_episodes`` have started, and
    otherwise plays no more counted episodes (what it plays then is thrown away, or it stays
    idle). Episodes that start in the same step are ordered by env index.

    Args:
        num_episodes: How many episodes to play.
        num_envs: How many envs play them side by side.
    """

    def __init__(self, num_episodes: int, num_envs: int) -> None:
        check_int("num_episodes", num_episodes)
        check_int("num_envs", num_envs)
        self.num_episodes = num_episodes
        #: How many counted episodes have started; the latest one started is number ``started - 1``.
        self.started = min(num_envs, num_episodes)
        self._counting = [index < num_episodes for index in range(num_envs)]

    def counts(self, env: int) -> bool:
        """Whether env ``env``'s current episode is one of the counted ones."""
        return self._counting[env]

    @property
    def envs(self) -> list[int]:
        """The envs playing a counted episode, in index order."""
        return [index for index, counting in enumerate(self._counting) if counting]

    @property
    def done(self) -> bool:
        """Whether every counted episode ended."""
        return not any(self._counting)

    def end(self, env: int, *, kept: bool = True) -> bool:
        """Env ``env``'s counted episode ended; return whether its next episode counts.

        Args:
            env: The env whose counted episode ended.
            kept: ``False`` for an episode thrown away (a NaN value, a rebuilt env): one more
                episode is started in its place, so that ``num_episodes`` are still kept.
        """
        if not self._counting[env]:
            raise ValueError(f"env {env}'s episode is not a counted one")
        if not kept:
            self.num_episodes += 1
        if self.started < self.num_episodes:
            self.started += 1
            return True
        self._counting[env] = False
        return False
