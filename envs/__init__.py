"""Gymnasium-native env layer: Gymnasium ids, envs and vector envs as batched TorchRL envs."""

from envs.errors import InputError
from envs.normalization import ObservationNormalizer
from envs.vector import EPISODE_LENGTH_KEY, EPISODE_RETURN_KEY, GymnasiumVectorEnv, make_env, space_to_spec

__all__ = [
    "EPISODE_LENGTH_KEY",
    "EPISODE_RETURN_KEY",
    "GymnasiumVectorEnv",
    "InputError",
    "ObservationNormalizer",
    "make_env",
    "space_to_spec",
]
