"""Splitting gymnasium's batched vector-env infos into one dict per env.

A vector env returns infos as ``{key: array[num_envs], "_key": mask}``, where the mask says
which envs set the key this step; in ``AutoresetMode.SAME_STEP`` it adds ``final_obs`` and
``final_info`` for the envs whose episode just ended. Episodes store one plain dict per step,
so the runner unbatches these here, and records infos at all only once the env returned keys
of its own (the restart mark of a ``SubEnvGuard`` is not the env's own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_rl.env.sub_env_guard import ENV_RESTARTED

# Keys the vector env adds to infos itself in SAME_STEP mode, and the one a SubEnvGuard adds
# when it rebuilt its env; anything else came from the env.
FINAL_KEYS = frozenset(
    {"final_obs", "_final_obs", "final_info", "_final_info", ENV_RESTARTED, "_" + ENV_RESTARTED}
)


def has_env_infos(infos: Mapping[str, Any]) -> bool:
    """Whether ``infos`` holds anything the env itself returned (not only the vector env's final keys)."""
    if any(key not in FINAL_KEYS for key in infos):
        return True
    return bool(infos.get("final_info"))


def unbatch_infos(infos: Mapping[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Split gymnasium's vector infos ``{key: [N], "_key": mask}`` into one dict per env."""
    return [unbatch_one(infos, i) for i in range(num_envs)]


def unbatch_one(infos: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The infos of env ``index``: the keys its mask sets, nested dicts unbatched too, final keys left out.

    Args:
        infos: Batched vector infos (or a nested dict of them, such as ``final_info``).
        index: The env's index in the vector env.
    """
    result: dict[str, Any] = {}
    for key, value in infos.items():
        if key in FINAL_KEYS:
            continue
        if key.startswith("_") and key[1:] in infos:
            continue  # a mask
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[index]:
            continue
        result[key] = unbatch_one(value, index) if isinstance(value, Mapping) else value[index]
    return result
