"""Batch collection without a Trainer: the real tiny model through the transformers engine, a real reward pool and
the real sampler; dynamic sampling, the training batch and its split over ranks."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from dapo_rl.collect import DynamicSamplingExhausted, Scorer, collect_batch, make_train_batch
from dapo_rl.config import load_config
from dapo_rl.data import EpochSampler, PromptDataset, reasoning_gym_samples
from dapo_rl.distributed import DistContext
from dapo_rl.models.tiny import build_tiny_model, build_tiny_tokenizer
from dapo_rl.reward.pool import RewardPool
from dapo_rl.rollout import HFRolloutEngine


def first_byte_parity(data_source, solution_str, ground_truth, extra_info=None):
    """A verifier with a known rate: right when the response's first character has an even code (about half of a
    random model's answers), so groups of 4 often disagree."""
    return 1.0 if solution_str and ord(solution_str[0]) % 2 == 0 else -1.0


def always_wrong(data_source, solution_str, ground_truth, extra_info=None):
    return -1.0


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tok = build_tiny_tokenizer()
    build_tiny_model(seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    engine = HFRolloutEngine(AutoModelForCausalLM.from_pretrained(path), tok, micro_batch_size=64)
    samples = reasoning_gym_samples("chain_sum", 64, 0, {"min_terms": 2, "max_terms": 2}, True)
    return tok, engine, PromptDataset(samples, tok, 64, "chain_sum")


def _cfg(verifier: str, *extra: str):
    return load_config(
        None,
        [
            f"reward.name={__name__}:{verifier}",
            "data.train_batch_size=4",
            "data.gen_batch_size=8",
            "data.max_response_length=6",
            "algorithm.overlong_buffer.len=2",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=2",
            *extra,
        ],
    )


def test_dynamic_sampling_keeps_groups_whose_accuracy_varies(parts):
    tok, engine, ds = parts
    cfg = _cfg("first_byte_parity")
    sampler = EpochSampler(len(ds), seed=0)
    with RewardPool(cfg.reward.name, num_workers=0) as pool:
        scorer = Scorer(tok, pool, 6, cfg.algorithm.overlong_buffer)
        groups, stats = collect_batch(engine, scorer, sampler, ds, cfg, step=1)
    rounds = stats["train/num_gen_batches"]
    assert len(groups) == 4 == stats["train/kept_groups"]
    assert sampler.pos == 8 * rounds  # one draw of gen_batch_size prompts per round
    assert [g.key for g in groups] == sorted(g.key for g in groups)  # the order one process keeps them in
    for g in groups:
        accs = [r.acc for r in g.rollouts]
        assert len(accs) == 4 and 0 < sum(accs) < 4  # Eq. 11: neither all right nor all wrong
        for r in g.rollouts:
            assert r.acc == (ord(r.text[0]) % 2 == 0) and r.score == (1.0 if r.acc else -1.0)
            assert len(r.logprobs) == r.response_length == len(r.response_ids) <= 6
            # Eq. 13 with L_max 6, L_cache 2: -1 at 6 tokens, -0.5 at 5, 0 up to 4
            assert r.reward == pytest.approx(r.score + {6: -1.0, 5: -0.5}.get(r.response_length, 0.0))
    assert 0 < stats["train/filter_pass_ratio"] <= 1 and stats["reward/error_rate"] == 0.0


def test_train_batch_advantages_and_the_split_over_two_ranks(parts):
    tok, engine, ds = parts
    cfg = _cfg("first_byte_parity")
    with RewardPool(cfg.reward.name, num_workers=0) as pool:
        groups, _ = collect_batch(
            engine, Scorer(tok, pool, 6), EpochSampler(len(ds), seed=1), ds, cfg, step=1
        )
    one = make_train_batch(groups, cfg, tok.pad_token_id, step=1)
    assert len(one) == 16 and one.minibatch.tolist() == [0] * 8 + [1] * 8  # 2 groups x 4 per optimizer step
    for g in range(4):  # GRPO: each group's advantages are centred and scaled to unit std
        a = one.advantages[4 * g : 4 * g + 4]
        assert float(a.sum()) == pytest.approx(0.0, abs=1e-5) and float(a.std()) == pytest.approx(
            1.0, abs=1e-4
        )
    halves = [
        make_train_batch(groups, cfg, tok.pad_token_id, 1, DistContext(rank=r, world_size=2)) for r in (0, 1)
    ]
    assert [len(h) for h in halves] == [8, 8] and all(
        h.minibatch.tolist() == [0] * 4 + [1] * 4 for h in halves
    )
    got = sorted(float(a) for h in halves for a in h.advantages)
    assert got == pytest.approx(sorted(float(a) for a in one.advantages))
    assert sum(float(h.response_mask.sum()) for h in halves) == float(one.response_mask.sum())


def test_nothing_to_keep_stops_with_the_message_or_trains_on_a_partial_batch(parts):
    tok, engine, ds = parts
    with RewardPool(f"{__name__}:always_wrong", num_workers=0) as pool:
        scorer = Scorer(tok, pool, 6)
        cfg = _cfg("always_wrong", "algorithm.filter_groups.max_num_gen_batches=2")
        with pytest.raises(
            DynamicSamplingExhausted, match="kept 0 of the 4 prompt groups a step needs after 2"
        ):
            collect_batch(engine, scorer, EpochSampler(len(ds)), ds, cfg, step=1)
        cfg = _cfg("always_wrong", "algorithm.filter_groups.enable=false")
        groups, stats = collect_batch(engine, scorer, EpochSampler(len(ds)), ds, cfg, step=1)
    assert len(groups) == 4 and stats["train/acc_mean"] == 0.0 and stats["train/num_gen_batches"] == 1
    batch = make_train_batch(groups, cfg, tok.pad_token_id, step=1)
    assert torch.equal(batch.advantages, torch.zeros(16))  # all-equal groups carry no signal


@pytest.mark.parametrize("workers", [0, 1])
def test_scoring_overlapped_with_generation_gives_the_same_batch(parts, workers):
    """With a micro-batch of 8 sequences the engine yields a round of 8 prompts x 4 in 4 chunks; each is scored in
    a thread while the next is sampled. Same rollouts, rewards and kept groups as scoring after the round."""
    tok, _, ds = parts
    engine = HFRolloutEngine(parts[1].model, tok, micro_batch_size=8)
    runs = []
    for overlap in (False, True):
        # a generous time limit: the scoring process shares the cores with generation here
        cfg = _cfg("first_byte_parity", f"reward.overlap={str(overlap).lower()}", "reward.timeout_s=120")
        with RewardPool(cfg.reward.name, num_workers=workers, timeout_s=cfg.reward.timeout_s) as pool:
            scorer = Scorer(tok, pool, 6, cfg.algorithm.overlong_buffer)
            groups, stats = collect_batch(engine, scorer, EpochSampler(len(ds), seed=0), ds, cfg, step=1)
        runs.append(
            ([(g.key, [(r.response_ids, r.reward, r.acc) for r in g.rollouts]) for g in groups], stats)
        )
        assert scorer.seconds > 0 and stats["time/generate_s"] > 0
    (plain, s0), (overlapped, s1) = runs
    assert plain == overlapped and len(plain) == 4
    assert {k: v for k, v in s0.items() if not k.startswith("time/")} == {
        k: v for k, v in s1.items() if not k.startswith("time/")
    }
    chunks = list(engine.generate_chunks([ds.prompt_ids[i] for i in range(8)], _sampling()))
    assert len(chunks) == 4 and all(len(c) == 2 for c in chunks)


def _sampling():
    from dapo_rl.rollout import SamplingParams

    return SamplingParams(n=4, temperature=1.0, max_tokens=6, seed=3)
