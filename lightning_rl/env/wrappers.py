"""Env wrappers shipped with the package, and the env ids built from them.

``CartPoleNoVelocity`` hides CartPole's two velocities, so that a policy has to remember past
observations to balance the pole: the standard memory check for recurrent modules
(rl-baselines3-zoo and sb3-contrib call the env ``CartPoleNoVel-v1``). Importing this module
registers it with gymnasium as :data:`CARTPOLE_NO_VEL_ID`; ``lightning_rl.env`` imports it, so
a config names the env as ``env: lightning_rl/CartPoleNoVel-v1``, and code that only has
gymnasium writes ``gym.make("lightning_rl.env.wrappers:lightning_rl/CartPoleNoVel-v1")``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

#: The registered id: CartPole-v1's dynamics, reward and 500-step limit, observations
#: ``[cart position, pole angle]``. Namespaced, so it cannot clash with another package's id.
CARTPOLE_NO_VEL_ID = "lightning_rl/CartPoleNoVel-v1"

# CartPole's observation: [cart position, cart velocity, pole angle, pole angular velocity].
_CARTPOLE_POSITION_INDICES = (0, 2)


class CartPoleNoVelocity(gym.ObservationWrapper):
    """CartPole observing only the cart position and the pole angle (indices 0 and 2 of 4).

    The velocities are dropped, not zeroed (sb3-contrib's ``CartPoleNoVelEnv`` does the same;
    rl-baselines3-zoo's ``MaskVelocityWrapper`` zeroes them and keeps 4 entries): the
    observation is 2 numbers and its ``Box`` keeps CartPole's bounds of those two.

    Args:
        env: A CartPole env (an observation ``Box`` of shape ``(4,)``), e.g.
            ``gym.make("CartPole-v1")``.

    Raises:
        ValueError: If ``env``'s observation space is not a ``Box`` of shape ``(4,)``.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or space.shape != (4,):
            raise ValueError(f"CartPoleNoVelocity wraps CartPole (a Box of shape (4,)), got {space}")
        indices = list(_CARTPOLE_POSITION_INDICES)
        self.observation_space = gym.spaces.Box(space.low[indices], space.high[indices], dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """Keep the cart position and the pole angle."""
        return observation[list(_CARTPOLE_POSITION_INDICES)]


def make_cartpole_no_velocity(**kwargs: Any) -> gym.Env:
    """The entry point of :data:`CARTPOLE_NO_VEL_ID`: a bare ``CartPoleEnv`` in :class:`CartPoleNoVelocity`.

    The bare env, not ``gym.make("CartPole-v1")``: the registration adds the 500-step time
    limit (and gymnasium's checkers) outside the wrapper, once.

    Args:
        **kwargs: ``CartPoleEnv``'s own (``render_mode``, ``sutton_barto_reward``).
    """
    # Imported here: importing lightning_rl.env registers the id but builds no env.
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    return CartPoleNoVelocity(CartPoleEnv(**kwargs))


# Guarded: a module can be imported again under another name (a reload, a test's importlib),
# and gymnasium warns when an id is registered twice.
if CARTPOLE_NO_VEL_ID not in gym.registry:
    gym.register(
        id=CARTPOLE_NO_VEL_ID,
        entry_point=f"{__name__}:make_cartpole_no_velocity",  # a string: workers import it on make
        max_episode_steps=500,
        reward_threshold=475.0,  # CartPole-v1's
    )
