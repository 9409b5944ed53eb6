"""The tiny model recipe, the transformers rollout engine and the actor's log-probs, on the real tiny model."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dapo_rl.actor import Actor, TrainBatch
from dapo_rl.config import ActorConfig, AlgorithmConfig
from dapo_rl.models.tiny import build_tiny_model, build_tiny_tokenizer
from dapo_rl.rollout import HFRolloutEngine, SamplingParams

TEXT = "60 + 68 =\nAnswer: 128\n\tLaTeX: $\\frac{1}{2}$, non-ASCII: é ∑ 😀"


def test_tokenizer_round_trips_exactly_through_auto_tokenizer(tmp_path):
    tok = build_tiny_tokenizer()
    build_tiny_model().save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    ids = again(TEXT, add_special_tokens=False)["input_ids"]
    assert ids == tok(TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(TEXT.encode("utf-8"))  # one token per byte
    assert again.decode(ids) == TEXT  # spaces, newlines, tabs and non-ASCII survive
    assert again.eos_token_id == 256 and again.pad_token_id == 257
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert 1.4e6 < sum(p.numel() for p in model.parameters()) < 1.6e6


def _save_tiny(path, seed=0):
    tok = build_tiny_tokenizer()
    build_tiny_model(seed=seed).save_pretrained(path)
    tok.save_pretrained(path)
    return tok


def _engine_and_actor(path, seed=0):
    """An engine and an actor started from the same checkpoint, as the trainer starts them."""
    tok = _save_tiny(path, seed)
    engine = HFRolloutEngine(AutoModelForCausalLM.from_pretrained(path), tok, micro_batch_size=64)
    actor = Actor(str(path), ActorConfig(ppo_micro_batch_size=5), AlgorithmConfig(), temperature=0.7)
    return tok, engine, actor


def test_generate_shapes_finish_reasons_and_seeded_repeatability(tmp_path):
    tok, engine, _ = _engine_and_actor(tmp_path)
    prompts = [tok("1 + 2 =\n")["input_ids"], tok("10 - 3 + 4 =\n")["input_ids"]]
    params = SamplingParams(n=3, temperature=1.0, max_tokens=6, seed=11)
    out = engine.generate(prompts, params)
    assert len(out) == 2 and all(len(g) == 3 for g in out)
    for g in out:
        for o in g:
            assert len(o.token_ids) == len(o.logprobs) <= 6
            assert all(lp <= 0 for lp in o.logprobs)
            if o.finish_reason == "stop":
                assert o.token_ids[-1] == tok.eos_token_id and tok.eos_token_id not in o.token_ids[:-1]
            else:
                assert o.finish_reason == "length" and len(o.token_ids) == 6
    again = engine.generate(prompts, params)
    assert [[o.token_ids for o in g] for g in out] == [[o.token_ids for o in g] for g in again]


def test_sampling_logprobs_match_the_actor_recompute(tmp_path):
    """The engine's per-token log-probs (after temperature) equal the actor's forward on the same tokens."""
    tok, engine, actor = _engine_and_actor(tmp_path)
    prompts = [tok("7 + 8 =\n")["input_ids"], tok("12 - 5 - 1 =\n")["input_ids"], tok("3 =\n")["input_ids"]]
    out = engine.generate(prompts, SamplingParams(n=4, temperature=0.7, max_tokens=8, seed=5))
    flat_p = [p for p, g in zip(prompts, out) for _ in g]
    flat_r = [o.token_ids for g in out for o in g]
    batch = TrainBatch.build(
        flat_p, flat_r, torch.zeros(len(flat_r)), torch.ones(len(flat_r)), tok.pad_token_id
    )
    recomputed = actor.compute_log_prob(batch)
    for i, o in enumerate(o for g in out for o in g):
        diff = (recomputed[i, : len(o.logprobs)] - torch.tensor(o.logprobs)).abs().max()
        assert diff < 1e-4, diff
        assert batch.response_mask[i].sum() == len(o.token_ids)


@pytest.mark.parametrize("temperature", [0.7, 0.0])
def test_logprobs_are_taken_step_by_step_on_the_device_bit_for_bit(temperature):
    """The log-probs come from each decoding step's logits on the model's device, one (B, V) step at a time: the
    same values, bit for bit, as the log-softmax over the whole stacked (B, L, V) logits copied to the host (what
    the engine did before: gigabytes of host memory per chunk with a 150k vocabulary on a GPU). The engine does
    not ask transformers to keep every step's logits (`output_logits`, B·L·V·4 bytes: review async-lora m7); the
    test asks for them itself to compute the reference."""
    import copy

    tok = build_tiny_tokenizer()
    model = build_tiny_model(seed=2)
    engine = HFRolloutEngine(model, tok, micro_batch_size=64)
    seen, asked = [], []
    generate = model.generate

    def keep(*a, **k):
        cfg = copy.deepcopy(k["generation_config"])
        asked.append(bool(cfg.output_logits))
        cfg.output_logits = True
        out = generate(*a, **{**k, "generation_config": cfg})
        seen.append(out)
        return out

    model.generate = keep
    prompts = [tok("7 + 8 =\n")["input_ids"], tok("12 - 5 =\n")["input_ids"]]
    out = engine.generate(prompts, SamplingParams(n=3, temperature=temperature, max_tokens=9, seed=4))
    (raw,) = seen
    assert asked == [False]
    gen = raw.sequences[:, raw.sequences.shape[1] - len(raw.logits) :]
    logits = torch.stack(raw.logits, dim=1).float()
    if temperature > 0:
        logits = logits / temperature
    want = torch.log_softmax(logits, dim=-1).gather(-1, gen.unsqueeze(-1)).squeeze(-1)
    for row, o in enumerate(o for g in out for o in g):
        assert o.logprobs == want[row, : len(o.logprobs)].tolist()


def test_update_weights_makes_the_engine_follow_the_actor(tmp_path):
    tok, engine, actor = _engine_and_actor(tmp_path)
    prompts = [tok("5 + 5 =\n")["input_ids"]]
    greedy = SamplingParams(n=1, temperature=0, max_tokens=8)
    with torch.no_grad():
        for p in actor.model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    before = engine.generate(prompts, greedy)[0][0].token_ids
    engine.update_weights(actor.engine_weights())
    after = engine.generate(prompts, greedy)[0][0].token_ids
    ids = torch.tensor([prompts[0]])
    with torch.no_grad():  # greedy decoding of the actor itself, one token at a time
        expect = []
        for _ in range(8):
            nxt = int(actor.model(ids).logits[0, -1].argmax())
            expect.append(nxt)
            if nxt == tok.eos_token_id:
                break
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    assert after == expect
    assert before != after


def test_update_gradient_does_not_depend_on_micro_batch_split(tmp_path):
    """Token-mean over a mini-batch: the parameter update with 1 and 4 micro-batches is the same."""
    tok = _save_tiny(tmp_path, seed=1)
    prompts = [tok(f"{i} + {i} =\n")["input_ids"] for i in range(8)]
    responses = [tok("Answer: " + "9" * (i % 4 + 1))["input_ids"] + [tok.eos_token_id] for i in range(8)]
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.1, -0.1])
    grads = []
    for micro in (8, 2):
        actor = Actor(
            str(tmp_path),
            ActorConfig(ppo_mini_batch_size=8, ppo_micro_batch_size=micro, grad_clip=1e9, lr=0.0),
            AlgorithmConfig(),
        )
        batch = TrainBatch.build(prompts, responses, adv, torch.ones(8), tok.pad_token_id)
        seen = []  # the accumulated gradient as the optimizer step sees it (`update` frees it afterwards)
        actor.optimizer.register_step_pre_hook(
            lambda opt, *_, seen=seen: seen.append(
                torch.cat(
                    [p.grad.flatten() for g in opt.param_groups for p in g["params"] if p.grad is not None]
                )
            )
        )
        actor.update(batch)
        assert len(seen) == 1 and all(p.grad is None for p in actor.model.parameters())
        grads.append(seen[0])
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-5)


def test_train_batch_packing_and_overlong_filtering_mask():
    """Prompt+response right-padded; a zero in `loss_mask` (a truncated response under overlong filtering) takes
    the whole response out of the loss."""
    prompts = [[5, 6, 7], [8]]
    responses = [[1, 2], [3, 4, 9, 10]]
    b = TrainBatch.build(prompts, responses, torch.tensor([1.0, -1.0]), torch.tensor([1.0, 0.0]), pad_id=257)
    assert b.input_ids.tolist() == [[5, 6, 7, 1, 2], [8, 3, 4, 9, 10]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert b.response_mask.tolist() == [[1, 1, 0, 0], [0, 0, 0, 0]]
    b2 = TrainBatch.build(prompts, [[1], [3, 4]], torch.zeros(2), torch.ones(2), pad_id=257)
    assert b2.input_ids.tolist() == [[5, 6, 7, 1], [8, 3, 4, 257]]
    assert b2.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    sub = b2.slice(torch.tensor([1]))
    assert sub.input_ids.tolist() == [[8, 3, 4]] and sub.response_mask.tolist() == [[1, 1]]


def test_train_batch_token_masks_take_single_tokens_out_of_the_loss():
    """A tool's tokens inside a response (`Rollout.loss_mask` 0) leave the loss token by token; a row without a
    token mask trains on all its tokens; overlong filtering still drops a whole row; a mask of the wrong length is
    refused, naming the row."""
    prompts = [[5, 6], [7], [8]]
    responses = [[1, 2, 3, 4], [9, 10], [11, 12, 13]]
    b = TrainBatch.build(
        prompts,
        responses,
        torch.zeros(3),
        torch.tensor([1.0, 1.0, 0.0]),
        pad_id=257,
        token_masks=[[1, 0, 0, 1], None, [1, 0, 1]],
    )
    assert b.response_mask.tolist() == [[1, 0, 0, 1], [1, 1, 0, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="row 1: a token mask of 3 for a response of 2 tokens"):
        TrainBatch.build(
            prompts, responses, torch.zeros(3), torch.ones(3), 257, token_masks=[None, [1, 1, 0], None]
        )


def test_top_k_off_samples_the_whole_vocabulary(tmp_path):
    """top_k <= 0 means no truncation: transformers' default (top_k=50) must not creep in. The model is made almost
    uniform over its 258 tokens with distinct logits (the final norm keeps one hidden dimension, whose embedding
    column is a small ramp), so 512 first tokens cover ~223 distinct ids (258 * (1 - (1 - 1/258)^512)); a top-50
    truncation could show at most 50, and top_k=20 shows at most 20."""
    tok = _save_tiny(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.model.embed_tokens.weight[:, 0] = torch.linspace(
            0.0, 0.01, 258
        )  # tied: the LM head's column too
    engine = HFRolloutEngine(model, tok, micro_batch_size=512)
    prompt = [tok("1 + 2 =\n")["input_ids"]]
    full = engine.generate(prompt, SamplingParams(n=512, max_tokens=1, seed=0, top_k=0))[0]
    assert len({o.token_ids[0] for o in full}) > 150
    assert all(abs(o.logprobs[0] + math.log(258)) < 0.05 for o in full)
    top20 = engine.generate(prompt, SamplingParams(n=512, max_tokens=1, seed=0, top_k=20))[0]
    assert len({o.token_ids[0] for o in top20}) <= 20


def test_unknown_attention_kernel_names_the_setting(tmp_path):
    from dapo_rl.config import ConfigError
    from dapo_rl.models.hf import load_model

    _save_tiny(tmp_path)
    with pytest.raises(ConfigError, match="model.attn_implementation=bogus"):
        load_model(str(tmp_path), attn_implementation="bogus")
    assert load_model(str(tmp_path), attn_implementation="eager").config._attn_implementation == "eager"


def test_the_checkpoints_generation_config_does_not_change_what_is_sampled_but_its_eos_ids_stop(tmp_path):
    """A checkpoint whose generation_config.json sets a repetition penalty, `no_repeat_ngram_size` and two eos ids
    (as Qwen2.5-Instruct ships `repetition_penalty` and `[151645, 151643]`): the engine samples exactly what the
    same weights without that file sample (transformers 5 would otherwise apply the penalty and the n-gram ban to
    every request), and a response ends at the checkpoint's second eos id as at the tokenizer's."""
    import json

    from transformers import GenerationConfig

    plain, tweaked = tmp_path / "plain", tmp_path / "tweaked"
    tok = _save_tiny(plain, seed=3)
    _save_tiny(tweaked, seed=3)
    prompts = [tok("1 + 2 =\n")["input_ids"], tok("10 - 3 + 4 =\n")["input_ids"]]
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=1)
    first = HFRolloutEngine(AutoModelForCausalLM.from_pretrained(plain), tok).generate(prompts, greedy)
    stop_id = first[0][0].token_ids[0]  # what the model says first to prompt 0, made an eos id below
    assert stop_id != tok.eos_token_id
    GenerationConfig(
        do_sample=True,
        repetition_penalty=1.5,
        no_repeat_ngram_size=1,
        eos_token_id=[tok.eos_token_id, stop_id],
    ).save_pretrained(tweaked)
    assert json.loads((tweaked / "generation_config.json").read_text())["repetition_penalty"] == 1.5

    sample = SamplingParams(n=4, temperature=1.0, max_tokens=40, seed=7)
    base = HFRolloutEngine(AutoModelForCausalLM.from_pretrained(plain), tok)
    base.eos_ids.append(stop_id)  # the same stop list, so that only the sampling settings differ
    engine = HFRolloutEngine(AutoModelForCausalLM.from_pretrained(tweaked), tok)
    assert engine.eos_ids == [tok.eos_token_id, stop_id]
    want = base.generate(prompts, sample)
    got = engine.generate(prompts, sample)
    assert [[o.token_ids for o in g] for g in got] == [[o.token_ids for o in g] for g in want]
    assert [[o.logprobs for o in g] for g in got] == [[o.logprobs for o in g] for g in want]
    # some response repeats a token (the checkpoint's n-gram ban, had it applied, forbids that)
    assert any(len(set(o.token_ids)) < len(o.token_ids) for g in got for o in g)

    stopped = engine.generate(prompts[:1], SamplingParams(n=1, temperature=0.0, max_tokens=8))[0][0]
    assert stopped.token_ids == [stop_id] and stopped.finish_reason == "stop"


def _first_occurrence_end(token_ids: list[int], stop: str) -> int | None:
    """With the tiny tokenizer's one token per byte: the token count that ends `stop`'s first occurrence, or None."""
    raw = bytes(t for t in token_ids if t < 256)
    i = raw.find(stop.encode())
    return None if i < 0 else i + len(stop.encode())


def test_stop_strings_end_each_response_at_its_first_one_and_keep_it(tmp_path):
    """`SamplingParams.stop` on the transformers engine: a response whose unconstrained sample contains a stop string
    (read off that sample) ends with the token completing its first occurrence, the stop string kept, with
    finish_reason `stop` and `stop_reason` that string, its tokens and log-probs exactly the unconstrained sample's
    prefix; a response without one is exactly as without `stop`. A stop string made of the prompt's last character
    and the response's first does not stop: only the response's text counts."""
    import re

    tok = build_tiny_tokenizer()
    engine = HFRolloutEngine(build_tiny_model(seed=3), tok, micro_batch_size=64)
    prompts = [tok(f"{a} + {b} =\n")["input_ids"] for a, b in ((1, 2), (30, 4), (9, 9))]
    params = SamplingParams(n=3, temperature=1.0, max_tokens=40, seed=5)
    free = [o for g in engine.generate(prompts, params) for o in g]
    texts = [tok.decode(o.token_ids, skip_special_tokens=True) for o in free]
    stop = next(m for t in texts for m in re.findall(r"[A-Za-z0-9]{2}", t))  # two ASCII characters it sampled
    starts = [t[0] for t in texts if t and t[0].isascii() and t[0].isalnum()]
    straddle = "\n" + starts[0]  # the prompt ends with "\n"
    stops = [stop, straddle, "never sampled"]
    assert all(stops[2] not in t for t in texts)
    params.stop = stops
    criteria = []  # the criterion each micro-batch's generate was given: did it stop rows early, not only cut them?
    plain_generate = engine.model.generate

    def generate(*args, **kwargs):
        criteria.extend(kwargs.get("stopping_criteria") or [])
        return plain_generate(*args, **kwargs)

    engine.model.generate = generate
    got = [o for g in engine.generate(prompts, params) for o in g]
    engine.model.generate = plain_generate
    stopped = {row: n for c in criteria for row, n in getattr(c, "stopped_at", {}).items()}
    cut = 0
    for o, f in zip(got, free):
        assert len(o.logprobs) == len(o.token_ids)
        ends = {s: _first_occurrence_end(f.token_ids, s) for s in stops}
        ends = {s: k for s, k in ends.items() if k is not None}
        if not ends:
            assert o == f  # untouched: same tokens, log-probs, finish reason, no stop reason
            continue
        first = min(ends, key=lambda s: (ends[s], stops.index(s)))
        k = ends[first]
        assert o.token_ids == f.token_ids[:k] and o.logprobs == f.logprobs[:k]
        assert o.finish_reason == "stop" and o.stop_reason == first
        assert tok.decode(o.token_ids).endswith(first)
        cut += 1
    assert 0 < cut < len(got)
    # review of issue 43, m6: the rows that stopped were stopped while generating (the criterion confirmed them at
    # the length they end with), not only cut afterwards
    assert len(stopped) == cut and sorted(stopped.values()) == sorted(
        len(o.token_ids) for o in got if o.finish_reason == "stop" and o.stop_reason
    )
    assert SamplingParams(stop="ab").stop == ["ab"]  # one string is one stop string, as vLLM takes it
    with pytest.raises(ValueError, match="empty string"):
        engine.generate(prompts, SamplingParams(stop=[""]))


def test_each_micro_batch_is_seeded_where_it_starts(tmp_path):
    """The transformers engine seeds the micro-batch starting at prompt a with `request_seed(seed, a, n)`: with one
    prompt a micro-batch, the prompts from a on, sampled alone with that seed, draw exactly what they draw in the
    whole call (as vLLM seeds each request), the first micro-batch keeps the call's seed, and other micro-batches
    draw other samples."""
    from dapo_rl.rollout.seeds import request_seed

    tok = build_tiny_tokenizer()
    engine = HFRolloutEngine(build_tiny_model(seed=3), tok, micro_batch_size=2)
    prompts = [tok(f"{a} + {a} =\n")["input_ids"] for a in range(4)]
    params = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=7)
    whole = engine.generate(prompts, params)
    for a in (0, 1, 3):
        tail = engine.generate(
            prompts[a:], SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=request_seed(7, a, 2))
        )
        assert tail == whole[a:]
    alone = [engine.generate([p], params)[0] for p in prompts]
    assert alone[0] == whole[0] and all(alone[a] != whole[a] for a in (1, 2, 3))
