"""Training recipes, one file per algorithm: `python -m recipes.<name> --help`."""

import envs  # noqa: F401  (first: it unsets an unusable MUJOCO_GL before TorchRL imports MuJoCo)
