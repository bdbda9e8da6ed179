"""Networks built from env specs, and the Agent that predicts, evaluates, saves and loads."""

from agents.agent import POLICY_BUILDERS, Agent, EvaluationResult, write_video
from agents.networks import find_normalizer, input_encoder, make_actor, make_critic, make_mlp
from agents.qvalue import (
    DuelingHead,
    NStepReturns,
    TensorDQNLoss,
    make_q_actor,
    make_q_network,
    make_target_updater,
)
from agents.tabular import ObservationGrid, QTable, make_q_table

__all__ = [
    "POLICY_BUILDERS",
    "Agent",
    "DuelingHead",
    "EvaluationResult",
    "NStepReturns",
    "ObservationGrid",
    "QTable",
    "TensorDQNLoss",
    "find_normalizer",
    "input_encoder",
    "make_actor",
    "make_critic",
    "make_mlp",
    "make_q_actor",
    "make_q_network",
    "make_q_table",
    "make_target_updater",
    "write_video",
]
