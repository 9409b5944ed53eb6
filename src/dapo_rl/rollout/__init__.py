"""Rollout engines behind one protocol: prompt token ids + sampling params -> responses with sampling log-probs."""

from dapo_rl.rollout.base import GenerationOutput, RolloutEngine, SamplingParams
from dapo_rl.rollout.hf import HFRolloutEngine

__all__ = ["GenerationOutput", "HFRolloutEngine", "RolloutEngine", "SamplingParams", "build_engine"]


def build_engine(name: str, model, tokenizer, micro_batch_size: int = 512) -> RolloutEngine:
    """Build the rollout engine named by `rollout.name` (`hf`).

    Raises:
        ValueError: unknown engine name.
    """
    if name == "hf":
        return HFRolloutEngine(model, tokenizer, micro_batch_size=micro_batch_size)
    raise ValueError(f"unknown rollout engine {name!r}; available: hf")
