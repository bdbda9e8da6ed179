"""Networks built from env specs, and the Agent that predicts, evaluates, saves and loads."""

from agents.agent import POLICY_BUILDERS, Agent, EvaluationResult, write_video
from agents.networks import find_normalizer, input_encoder, make_actor, make_critic, make_mlp

__all__ = [
    "POLICY_BUILDERS",
    "Agent",
    "EvaluationResult",
    "find_normalizer",
    "input_encoder",
    "make_actor",
    "make_critic",
    "make_mlp",
    "write_video",
]
