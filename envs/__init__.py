"""Gymnasium-native env layer: Gymnasium ids, envs and vector envs as batched TorchRL envs, and torch-native
batched classic-control envs (registered with Gymnasium as ``rlkit/<id>``), and Atari games with the standard
preprocessing (:mod:`envs.atari`)."""

from envs.rendering import drop_unusable_mujoco_gl

drop_unusable_mujoco_gl()  # before TorchRL imports MuJoCo (see its docstring)

from envs.atari import is_atari, make_atari_env
from envs.classic import TORCH_ENVS, ClassicControlEnv
from envs.classic_gym import TorchClassicEnv, TorchClassicVectorEnv, register_envs
from envs.deepsea import DeepSeaEnv, register_deepsea_envs
from envs.partial import PositionsOnly, register_partial_envs
from envs.specs import EPISODE_LENGTH_KEY, EPISODE_RETURN_KEY, space_to_spec
from envs.vector import GymnasiumVectorEnv, make_env
from errors import InputError, NonFiniteError

register_envs()

__all__ = [
    "EPISODE_LENGTH_KEY",
    "EPISODE_RETURN_KEY",
    "TORCH_ENVS",
    "ClassicControlEnv",
    "DeepSeaEnv",
    "GymnasiumVectorEnv",
    "InputError",
    "NonFiniteError",
    "PositionsOnly",
    "TorchClassicEnv",
    "TorchClassicVectorEnv",
    "is_atari",
    "make_atari_env",
    "make_env",
    "register_deepsea_envs",
    "register_envs",
    "register_partial_envs",
    "space_to_spec",
]
