"""Worked solutions for the supervised warm-up (`dapo_rl.data.solutions`) on real reasoning-gym problems."""

from dataclasses import replace

import pytest

from dapo_rl.config import ConfigError, load_config
from dapo_rl.data import DataError, Sample, reasoning_gym_samples
from dapo_rl.data.solutions import chain_steps, sft_completions, worked_solution
from dapo_rl.reward.reasoning_gym import compute_score_reasoning_gym


def _small_warmup(recipe: str, n: int, completion: str):
    """A small fresh tiny model and `n` warm-up examples of `recipe`'s task: `(model, tok, targets, prompt ids)`."""
    from dapo_rl.data import render_prompt
    from dapo_rl.sft import fresh_tiny_model

    cfg = load_config(recipe).sft
    model, tok = fresh_tiny_model(replace(cfg, hidden_size=64, num_heads=2, intermediate_size=128))
    t = cfg.task
    samples = reasoning_gym_samples(t.task, n, t.seed, dict(t.params), t.strip_instruction)
    comps = [c + tok.eos_token for c in sft_completions(samples, completion, 0.5, 0)]
    p_ids = tok([render_prompt(tok, s.prompt) for s in samples], add_special_tokens=False)["input_ids"]
    return model, tok, comps, p_ids


def test_chain_steps_by_hand():
    assert chain_steps("15 - 43 - 75 + 61") == ["15-43=-28", "-28-75=-103", "-103+61=-42"]
    assert chain_steps("1 + 5") == ["1+5=6"]
    assert chain_steps("-4 - 1") == ["-4-1=-5"]
    assert chain_steps("7") == []
    for bad in ("2 * 3", "(1 + 2)", "", "1 + x"):
        with pytest.raises(ValueError, match="not a \\+/- chain of integers"):
            chain_steps(bad)


def test_worked_solutions_of_real_problems_score_as_right():
    samples = reasoning_gym_samples("chain_sum", 50, 7, {"min_terms": 2, "max_terms": 5}, True)
    for s in samples:
        text = worked_solution(s)
        lines = text.split("\n")
        assert len(lines) == s.extra_info["metadata"]["num_terms"]  # one line per operation + the answer line
        assert lines[-1] == f"Answer: {s.ground_truth}"
        res = compute_score_reasoning_gym("chain_sum", text, s.ground_truth, s.extra_info)
        assert res["acc"] and res["score"] == 1.0


def test_worked_solution_errors_name_the_sample():
    s = reasoning_gym_samples("chain_sum", 1, 0, {}, True)[0]
    wrong = Sample(s.uid, s.data_source, s.prompt, "12345", s.extra_info)
    with pytest.raises(DataError, match=f"sample {s.uid}: the steps of .* end at .*ground truth is '12345'"):
        worked_solution(wrong)
    other = Sample("x:1", "math", s.prompt, "1", {})
    with pytest.raises(
        DataError, match="sample x:1: worked solutions are written for reasoning-gym chain_sum only"
    ):
        worked_solution(other)


def test_mixed_completions_take_the_steps_at_the_given_rate():
    samples = reasoning_gym_samples("chain_sum", 400, 3, {"min_terms": 2, "max_terms": 4}, True)
    mixed = sft_completions(samples, "mixed", 0.5, seed=0)
    worked = sum(not c.startswith("Answer:") for c in mixed)
    assert 160 <= worked <= 240 and mixed == sft_completions(samples, "mixed", 0.5, seed=0)
    assert all(
        c == f"Answer: {s.ground_truth}" for c, s in zip(sft_completions(samples, "answer", 0.5, 0), samples)
    )
    assert all(c.count("\n") >= 1 for c in sft_completions(samples, "steps", 0.0, 0))
    with pytest.raises(ValueError, match="completion style 'essay'"):
        sft_completions(samples, "essay", 0.5, 0)


def test_sft_settings_are_checked_and_the_default_cache_name_is_unchanged():
    from dapo_rl.sft import embedded_model_dir

    with pytest.raises(ConfigError, match="sft.completion='essay' is not one of answer, steps, mixed"):
        load_config(None, ["sft.completion=essay"])
    with pytest.raises(ConfigError, match="sft.steps_fraction=1.5 must be in"):
        load_config(None, ["sft.steps_fraction=1.5"])
    # settings added later keep the older embedded model's cache key when left at their defaults
    assert embedded_model_dir(load_config("tiny_chain_sum").sft).name == "tiny-chain_sum-35bf67648b14"
    # the tool warm-up's key changed when it stopped training on the tool's output (2026-12-06, d2966bf8807a) and
    # when its operands went from 4-5 digits to 4 (2026-12-07)
    assert embedded_model_dir(load_config("tiny_python_tool").sft).name == "tiny-chain_sum-9f6aa02db47f"
    steps = load_config("tiny_chain_steps").sft
    assert steps.completion == "mixed" and embedded_model_dir(steps) != embedded_model_dir(
        load_config("tiny_chain_sum").sft
    )
    assert load_config().sft == steps  # the embedded default


def test_warm_up_micro_batches_give_the_whole_batchs_gradient():
    """`sft.micro_batch_size`: rows sorted by length and split into passes give the gradient of one padded pass
    over the batch, on the real tiny model and real warm-up rows (worked steps, 10-60 tokens)."""

    import torch

    from dapo_rl.sft import batch_backward

    model, tok, comps, p_ids = _small_warmup("tiny_chain_steps", 64, "mixed")
    c_ids = tok(comps, add_special_tokens=False)["input_ids"]
    idx = list(range(48))
    lengths = sorted(len(p_ids[i]) + len(c_ids[i]) for i in idx)
    assert lengths[0] * 2 < lengths[-1]  # a real spread, so the passes pad differently
    grads, losses = [], []
    for micro in (0, 16):
        model.zero_grad(set_to_none=True)
        losses.append(batch_backward(model, idx, p_ids, c_ids, tok.pad_token_id, micro).item())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    assert (grads[1] - grads[0]).abs().max().item() <= 1e-5 * grads[0].abs().max().item()
    assert grads[0].abs().max().item() > 0


def test_tool_traces_run_in_the_sandbox_and_read_as_the_tool_episode_writes_them():
    """Each trace's program, run in the real sandbox, prints the ground truth; its interpreter block is the text the
    tool episode appends for that output; the model's part (the trace less that block) scores right."""
    from dapo_rl.data.solutions import RETOOL_TAGS, tool_output_text, tool_trace
    from dapo_rl.episode.tool import ToolFormat, extract_code
    from dapo_rl.sandbox import ProgramRunner

    samples = reasoning_gym_samples(
        "chain_sum", 20, 11, {"min_terms": 2, "max_terms": 3, "min_digits": 4}, True
    )
    traces = [tool_trace(s) for s in samples]
    codes = [extract_code(t.split("</code>")[0] + "</code>", ToolFormat()) for t in traces]
    assert codes[0] == f"print({samples[0].extra_info['metadata']['expression']})"
    with ProgramRunner(2) as runner:
        results = runner.run(codes)
    for s, t, r in zip(samples, traces, results):
        assert (r.status, r.stdout) == ("ok", f"{s.ground_truth}\n")
        block = tool_output_text(r.stdout, *RETOOL_TAGS[2:])
        call, answer = t.split(block)
        assert call.endswith("</code>") and answer == f"Answer: {s.ground_truth}"
        res = compute_score_reasoning_gym("chain_sum", call + answer, s.ground_truth, s.extra_info)
        assert res["acc"]
    mixed = sft_completions(samples * 10, "tool_mixed", 0.25, seed=1)
    assert 30 <= sum(c.startswith("<code>") for c in mixed) <= 70
    assert sft_completions(samples, "tool", 0.0, 0) == traces
    with pytest.raises(
        DataError, match="sample x:1: tool traces are written for reasoning-gym chain_sum only"
    ):
        tool_trace(Sample("x:1", "math", samples[0].prompt, "1", {}))


def test_the_warm_up_does_not_train_on_the_tool_output_and_tokenizes_it_as_the_episode_appends_it():
    """A tool trace's target: the model's call and answer are trained on, the interpreter block (opening, output,
    closing) is not (label -100), and its ids are those the tool episode appends for the same output."""
    from dapo_rl.data import render_prompt
    from dapo_rl.data.solutions import RETOOL_TAGS, tool_output_spans, tool_trace
    from dapo_rl.models.tiny import build_tiny_tokenizer
    from dapo_rl.sft import _padded_rows, target_ids

    tok = build_tiny_tokenizer()
    sample = reasoning_gym_samples(
        "chain_sum", 1, 5, {"min_terms": 2, "max_terms": 2, "min_digits": 4}, True
    )[0]
    trace = tool_trace(sample) + tok.eos_token
    ids, trained = target_ids(tok, trace)
    assert tok.decode(ids) == trace and ids[-1] == tok.eos_token_id
    call, block, answer = (
        "".join(t for t, keep in tool_output_spans(trace)[a:b]) for a, b in ((0, 1), (1, 4), (4, 5))
    )
    assert block == f"\n<interpreter>\n{sample.ground_truth}\n\n</interpreter>\n"
    masked = [i for i, keep in zip(ids, trained) if not keep]
    enc = lambda x: tok(x, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert masked == enc("\n<interpreter>\n") + enc(f"{sample.ground_truth}\n") + enc("\n</interpreter>\n")
    assert trained == [True] * len(enc(call)) + [False] * len(masked) + [True] * len(enc(answer))
    assert RETOOL_TAGS[2] in block and RETOOL_TAGS[2] not in call + answer
    p_ids = [enc(render_prompt(tok, sample.prompt))]
    _, _, labels = _padded_rows([0], p_ids, [ids], tok.pad_token_id, [trained])
    row = labels[0, len(p_ids[0]) :].tolist()
    assert row == [i if keep else -100 for i, keep in zip(ids, trained)]
    assert (labels[0, : len(p_ids[0])] == -100).all()
    # a target without tool output: one piece, tokenized whole and trained on throughout
    plain = f"Answer: {sample.ground_truth}{tok.eos_token}"
    assert target_ids(tok, plain) == (enc(plain), [True] * len(enc(plain)))


def test_tool_output_spans_join_back_and_micro_batches_keep_the_masked_gradient():
    """The pieces join back to the text (two blocks, a block at the end, an opening tag directly followed by the
    closing one), and `batch_backward` with a loss mask gives the same gradient in one pass and in micro-batches
    (the divisor counts the trained tokens only)."""

    import torch

    from dapo_rl.data.solutions import tool_output_spans
    from dapo_rl.sft import batch_backward, target_ids

    block = "\n<interpreter>\n7\n\n</interpreter>\n"
    for text in (f"a{block}b{block}c", f"a{block}", "x\n<interpreter>\n</interpreter>\ny", "plain"):
        pieces = tool_output_spans(text)
        assert "".join(p for p, _ in pieces) == text
    assert [keep for _, keep in tool_output_spans(f"a{block}")] == [True, False, False, False]
    assert tool_output_spans("x\n<interpreter>\n</interpreter>\ny") == [
        (
            "x\n<interpreter>\n</interpreter>\ny",
            True,
        )  # no newline of its own before the closing tag: no block
    ]
    model, tok, comps, p_ids = _small_warmup("tiny_python_tool", 48, "tool_mixed")
    c_ids, c_trained = map(list, zip(*(target_ids(tok, c) for c in comps)))
    assert 0 < sum(not all(m) for m in c_trained) < 48  # tool traces and bare answers
    idx = list(range(48))
    grads, losses = [], []
    for micro in (0, 16):
        model.zero_grad(set_to_none=True)
        losses.append(
            batch_backward(model, idx, p_ids, c_ids, tok.pad_token_id, micro, c_trained=c_trained).item()
        )
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    assert (grads[1] - grads[0]).abs().max().item() <= 1e-5 * grads[0].abs().max().item()
    model.zero_grad(set_to_none=True)
    batch_backward(
        model, idx, p_ids, c_ids, tok.pad_token_id, 16
    )  # no mask: the tool's output trained on too
    unmasked = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert (unmasked - grads[0]).abs().max().item() > 1e-2 * grads[0].abs().max().item()
