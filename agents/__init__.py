"""Networks built from env specs, and the Agent that predicts, evaluates, saves and loads."""

import envs  # noqa: F401  (first: it unsets an unusable MUJOCO_GL before TorchRL imports MuJoCo)
from agents.actor_critic import (
    ForeachSoftUpdate,
    SharedBuffers,
    TensorDDPGLoss,
    TensorSACLoss,
    TensorTD3Loss,
    share_target_buffers,
)
from agents.advantages import OneCallGAE, OneCallTD1
from agents.agent import POLICY_BUILDERS, Agent, EvaluationResult, video_writer, write_video
from agents.continuous import make_deterministic_actor, make_exploration_env, make_qvalue_critic
from agents.fast_paths import compiled, flat_select
from agents.fast_paths import install as install_fast_paths
from agents.gsde import make_gsde_actor, make_gsde_env
from agents.loss_addons import KLPenalty, LossAddon, addon_losses, build_loss_addons, trainable_parameters
from agents.networks import (
    find_normalizer,
    image_layout,
    input_encoder,
    is_image_spec,
    make_actor,
    make_critic,
    make_mlp,
    make_recurrent_critic,
    orthogonal_init,
    without_log_prob,
)
from agents.normalization import ObservationNormalizer, RewardNormalizer
from agents.ppo_loss import TensorClipPPOLoss
from agents.qvalue import (
    TRANSITION_KEYS,
    DuelingHead,
    ExplorationConfig,
    MaxNormalisedPriorityWeights,
    NStepReturns,
    TensorDQNLoss,
    make_q_actor,
    make_q_network,
    make_target_updater,
    prioritized_sampler,
    reset_target_noise,
)
from agents.recurrent import make_recurrent_env
from agents.rnd import INTRINSIC_REWARD_KEY, RandomNetworkDistillation, make_rnd_networks
from agents.tabular import IntegerCells, ObservationGrid, QTable, make_q_table

install_fast_paths()

__all__ = [
    "INTRINSIC_REWARD_KEY",
    "POLICY_BUILDERS",
    "TRANSITION_KEYS",
    "Agent",
    "DuelingHead",
    "EvaluationResult",
    "ExplorationConfig",
    "ForeachSoftUpdate",
    "IntegerCells",
    "KLPenalty",
    "LossAddon",
    "MaxNormalisedPriorityWeights",
    "NStepReturns",
    "ObservationGrid",
    "ObservationNormalizer",
    "OneCallGAE",
    "OneCallTD1",
    "QTable",
    "RandomNetworkDistillation",
    "RewardNormalizer",
    "SharedBuffers",
    "TensorClipPPOLoss",
    "TensorDDPGLoss",
    "TensorDQNLoss",
    "TensorSACLoss",
    "TensorTD3Loss",
    "addon_losses",
    "build_loss_addons",
    "compiled",
    "find_normalizer",
    "flat_select",
    "image_layout",
    "input_encoder",
    "is_image_spec",
    "make_actor",
    "make_critic",
    "make_deterministic_actor",
    "make_exploration_env",
    "make_gsde_actor",
    "make_gsde_env",
    "make_mlp",
    "make_q_actor",
    "make_q_network",
    "make_q_table",
    "make_qvalue_critic",
    "make_recurrent_critic",
    "make_recurrent_env",
    "make_rnd_networks",
    "make_target_updater",
    "orthogonal_init",
    "prioritized_sampler",
    "reset_target_noise",
    "share_target_buffers",
    "trainable_parameters",
    "video_writer",
    "without_log_prob",
    "write_video",
]
