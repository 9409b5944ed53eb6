"""Batch collection without a Trainer: the real tiny model through the transformers engine, a real reward pool and
the real sampler; dynamic sampling, the training batch and its split over ranks."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from dapo_rl.collect import DynamicSamplingExhausted, collect_batch, make_train_batch
from dapo_rl.config import load_config
from dapo_rl.data import EpochSampler, PromptDataset, reasoning_gym_samples
from dapo_rl.distributed import DistContext
from dapo_rl.episode import Scorer, SingleTurn
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


def _episode(tok, pool, overlong=None) -> SingleTurn:
    """The single-turn episode over a pool the test closes (the overlong penalty's L_max: the round's max_tokens)."""
    return SingleTurn(Scorer(tok, pool, overlong=overlong), owns_pool=False)


def test_dynamic_sampling_keeps_groups_whose_accuracy_varies(parts):
    tok, engine, ds = parts
    cfg = _cfg("first_byte_parity")
    sampler = EpochSampler(len(ds), seed=0)
    with RewardPool(cfg.reward.name, num_workers=0) as pool:
        scorer = _episode(tok, pool, cfg.algorithm.overlong_buffer)
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
        groups, _ = collect_batch(engine, _episode(tok, pool), EpochSampler(len(ds), seed=1), ds, cfg, step=1)
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
        scorer = _episode(tok, pool)
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
            scorer = _episode(tok, pool, cfg.algorithm.overlong_buffer)
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


# ---------------------------------------------------------------------------------------- zero-waste sampling
def first_byte_is_digit(data_source, solution_str, ground_truth, extra_info=None):
    """Right when the response starts with a digit (a random byte-level model: about 4% of answers): most groups
    of 4 are all wrong, so dynamic sampling drops most of what it generates."""
    return 1.0 if solution_str[:1].isdigit() else -1.0


def right_with_parity_score(data_source, solution_str, ground_truth, extra_info=None):
    """Always right (score > 0), scored 1.0 or 0.5 by the parity of the first byte."""
    return 1.0 if solution_str and ord(solution_str[0]) % 2 == 0 else 0.5


def test_generation_sums_add_over_rounds_and_read_older_checkpoints(parts):
    """`GenerationSums`: one round's sums by hand, two rounds add field by field, the all-reduce payload and the
    checkpoint state read back, and the positional lists of older checkpoints (14 values before the tool sums; 13
    before `refused`)."""
    from dapo_rl.collect import PromptGroup, Rollout
    from dapo_rl.collect.stats import GenerationSums

    s = parts[2].samples[0]
    a = GenerationSums.of(
        [
            PromptGroup(
                (1, 0),
                [
                    Rollout(s, 0, 0, [1], [5, 6], [0.0, 0.0], "length", acc=True, reward=1.0),
                    Rollout(s, 0, 1, [1], [5], [0.0], acc=False, reward=-1.0, status="refused"),
                ],
            )
        ],
        filtered_tokens=7,
    )
    assert a == GenerationSums(
        responses=2, groups=1, reward=0.0, correct=1, tokens=3, truncated=1, token_prob=3.0, sampled_tokens=3,
        refused=1, filtered_tokens=7, model_tokens=3,
    )  # fmt: skip
    b = a + a
    assert b.tokens == 6 and b.filtered_tokens == 14 and b.token_prob == 6.0
    assert GenerationSums.from_list(b.as_list()) == b and GenerationSums.from_state(b.state()) == b
    assert GenerationSums.from_state(a.as_list()) == a
    assert GenerationSums.from_state(a.as_list()[:14]) == a  # before the tool sums (all 0 here)
    assert GenerationSums.from_state({k: v for k, v in a.state().items() if k != "model_tokens"}) == a
    before_refused = [x for k, x in enumerate(a.as_list()[:14]) if k != 12]
    assert GenerationSums.from_state(before_refused) == GenerationSums(**{**a.state(), "refused": 0.0})
    with pytest.raises(ValueError, match="15 positional sums"):
        GenerationSums.from_state(a.as_list()[:15])
    assert GenerationSums.from_state(a.as_list()[:26]) == a  # before the code sums (all 0 here)
    with pytest.raises(ValueError, match="3 sums for the 33 fields"):
        GenerationSums.from_list([1.0, 2.0, 3.0])


def test_step_statistics_by_hand(parts):
    from dapo_rl.collect import PromptGroup, Rollout
    from dapo_rl.collect.loop import _step_stats

    s = parts[2].samples[0]
    mk = lambda acc, n, lp: Rollout(s, 0, 0, [1], [5] * n, [lp] * n, acc=acc)  # noqa: E731
    groups = [
        PromptGroup((1, 0), [mk(True, 2, 0.0), mk(True, 4, 0.0)]),  # all correct, 6 tokens of probability 1
        PromptGroup((1, 1), [mk(False, 3, -0.5), mk(False, 1, -0.5)]),  # all wrong, 4 tokens of exp(-0.5)
        PromptGroup((1, 2), [mk(True, 5, -1.0), mk(False, 5, -1.0)]),  # mixed, 10 tokens of exp(-1)
    ]
    stats = _step_stats(groups, 1, 1, DistContext(), filtered_tokens=10, surplus_tokens=5)
    assert stats["train/all_correct_group_ratio"] == pytest.approx(1 / 3)
    assert stats["train/all_wrong_group_ratio"] == pytest.approx(1 / 3)
    assert stats["train/gen_samples"] == 6 and stats["train/gen_tokens"] == 20
    assert stats["train/token_prob_mean"] == pytest.approx(
        (6 + 4 * 0.6065307 + 10 * 0.3678794) / 20, rel=1e-6
    )
    assert stats["train/gen_tokens_filtered_ratio"] == 0.5  # 10 / 20
    assert stats["train/gen_tokens_surplus_ratio"] == 0.25  # 5 / 20
    assert stats["train/gen_tokens_wasted_ratio"] == 0.75 and stats["train/gen_tokens_wasted"] == 15
    # a step trained only on carried groups samples nothing; dropping stale ones is all waste, not 300x waste
    assert _step_stats([], 0, 0, DistContext(), 0, 300)["train/gen_tokens_wasted_ratio"] == 1.0
    # a tool's tokens (loss mask 0, log-prob 0 there) fill the response but were not sampled: the generated
    # tokens and the context length count them; the response lengths and the sampling probability do not
    tool = Rollout(s, 0, 0, [1], [5, 6, 7, 8], [-0.5, 0.0, 0.0, -0.5], acc=True, loss_mask=[1, 0, 0, 1])
    stats = _step_stats([PromptGroup((1, 0), [tool, mk(False, 2, -1.0)])], 1, 1, DistContext(), 0, 0)
    assert stats["train/gen_tokens"] == 6 and stats["train/response_length_mean"] == 2.0
    assert stats["train/response_length_max"] == 2
    assert stats["train/token_prob_mean"] == pytest.approx((2 * 0.6065307 + 2 * 0.3678794) / 4, rel=1e-6)


def test_round_size_and_skipping_solved_prompts():
    from dapo_rl.collect import PromptPolicy, SkipPolicy, round_size

    assert round_size(32, None, 64) == 64  # no estimate yet: the configured round
    assert round_size(32, 0.45, 64) == 64  # ceil(32 / 0.45) = 72, capped
    assert round_size(20, 0.5, 64) == 40
    assert round_size(3, 0.45, 64) == 16  # ceil(6.7) = 7, raised to a quarter of 64
    assert round_size(3, 0.45, 64, world_size=32) == 32
    adaptive = PromptPolicy(adaptive=True)
    assert adaptive.round_size(3, 64) == 64  # no estimate yet
    adaptive.record(drawn=8, kept=4)
    adaptive.record(drawn=10, kept=0)  # 0.7 * 0.5 + 0.3 * 0 = 0.35
    assert adaptive.kept_rate == pytest.approx(0.35) and adaptive.round_size(20, 64) == 58  # ceil(57.1)
    assert PromptPolicy().round_size(3, 64) == 64  # not adaptive: the configured round
    sampler, policy = EpochSampler(10, shuffle=False), SkipPolicy(skip_solved=1)
    policy.skip = {1: 1, 2: 2}
    assert policy.draw(sampler, 4) == ([0, 3, 4, 5], 2)
    assert policy.skip == {2: 1}  # 1 used its only skip; 2 has one left
    assert policy.draw(sampler, 4) == ([6, 7, 8, 9], 0)
    assert policy.draw(sampler, 3) == ([0, 1, 3], 1) and policy.skip == {}  # epoch 2: 2 skipped a last time
    policy.skip = {i: 5 for i in range(10)}
    got, passed = policy.draw(EpochSampler(10, shuffle=False), 3)
    assert passed == 10 and got == [0, 1, 2]  # all solved: one epoch looked at, then re-checked early
    assert PromptPolicy().draw(EpochSampler(10, shuffle=False), 2) == ([0, 1], 0)


def test_carried_groups_fill_the_next_batch_first_and_waste_is_counted(parts):
    tok, engine, ds = parts
    with RewardPool(f"{__name__}:first_byte_parity", num_workers=0) as pool:
        scorer = _episode(tok, pool)
        cfg = _cfg("first_byte_parity", "data.gen_batch_size=16")  # ~8 groups kept per round, 4 wanted
        plain, stats = collect_batch(engine, scorer, EpochSampler(len(ds), seed=3), ds, cfg, step=1)
        kept_round = round(stats["train/filter_pass_ratio"] * 16)
        assert kept_round > 4  # surplus exists, and is discarded without carry_surplus
        gen = stats["train/gen_tokens"]
        assert stats["train/gen_tokens_wasted_ratio"] == pytest.approx(
            1 - sum(x.response_length for g in plain for x in g.rollouts) / gen
        )
        cfg = _cfg(
            "first_byte_parity", "data.gen_batch_size=16", "algorithm.filter_groups.carry_surplus=true"
        )
        carry, sampler = [], EpochSampler(len(ds), seed=3)
        first, s1 = collect_batch(engine, scorer, sampler, ds, cfg, step=1, carry=carry)
        assert [g.key for g in first] == [g.key for g in plain]  # the same rounds, the same batch
        assert len(carry) == kept_round - 4 and s1["train/gen_tokens_surplus_ratio"] == 0.0
        carried = [g.rollouts[0].problem_idx for g in carry]
        second, s2 = collect_batch(engine, scorer, sampler, ds, cfg, step=2, carry=carry)
    n_carried = min(len(carried), 4)
    assert [g.rollouts[0].problem_idx for g in second[:n_carried]] == carried[:n_carried]
    assert [g.key for g in second[:n_carried]] == [(0, i) for i in range(n_carried)]
    assert s2["train/carried_groups"] == n_carried
    batch = make_train_batch(second, cfg, tok.pad_token_id, step=2)
    assert batch.stale.tolist() == [True] * 4 * n_carried + [False] * 4 * (4 - n_carried)
    if len(carried) >= 4:  # the batch was full of carried groups: no round was needed
        assert s2["train/num_gen_batches"] == 0 and s2["train/gen_samples"] == 0


def test_a_step_that_generated_nothing_logs_counts_not_zero_means():
    """Carried groups filled the batch: no accuracy, length or truncation share of 0 (the curves would dip and
    CAMPO's saturation window would average the zeros); the counts say 0."""
    from dapo_rl.collect.loop import _step_stats
    from dapo_rl.distributed import DistContext

    assert _step_stats([], 0, 0, DistContext()) == {
        "train/num_gen_batches": 0,
        "train/gen_samples": 0,
        "train/gen_tokens": 0,
        "train/gen_tokens_wasted": 0,
        "train/gen_tokens_wasted_ratio": 0.0,
    }


def test_skip_solved_and_adaptive_rounds_in_collect_batch(parts):
    tok, engine, ds = parts
    from dapo_rl.collect import SkipPolicy, prompt_policy

    cfg = _cfg(
        "first_byte_is_digit",
        "data.gen_batch_size=16",
        "algorithm.filter_groups.adaptive_gen_batch=true",
        "algorithm.filter_groups.on_exhausted=partial",
        "algorithm.filter_groups.max_num_gen_batches=3",
    )
    policy = prompt_policy(cfg.algorithm.filter_groups)
    policy.kept_rate = 0.5
    with RewardPool(f"{__name__}:first_byte_is_digit", num_workers=0) as pool:
        sampler = EpochSampler(len(ds), seed=0)
        _, stats = collect_batch(engine, _episode(tok, pool), sampler, ds, cfg, step=1, policy=policy)
    # round 1: ceil(4 / 0.5) = 8 prompts; the running rate then falls, so later rounds grow toward 16
    assert stats["train/gen_prompts"] == sampler.pos >= 8
    assert stats["train/kept_rate"] < 0.5
    # every answer is right (acc), with scores that differ (the filter on `score` keeps the groups): every prompt
    # of the round is solved, skipped on its next 2 draws
    solved_cfg = _cfg(
        "right_with_parity_score",
        "algorithm.filter_groups.skip_solved=2",
        "algorithm.filter_groups.metric=score",
    )
    policy, sampler = prompt_policy(solved_cfg.algorithm.filter_groups), EpochSampler(len(ds), shuffle=False)
    assert isinstance(policy, SkipPolicy)
    with RewardPool(f"{__name__}:right_with_parity_score", num_workers=0) as pool:
        scorer = _episode(tok, pool)
        collect_batch(engine, scorer, sampler, ds, solved_cfg, step=1, policy=policy)
        assert policy.skip == {i: 2 for i in range(8)}
        sampler.pos = 0  # the same prompts come up again: passed over once each, the next 8 sampled instead
        _, stats = collect_batch(engine, scorer, sampler, ds, solved_cfg, step=2, policy=policy)
    assert stats["train/skipped_prompts"] == 8 and sampler.pos == 16
    assert policy.skip == {i: 1 for i in range(8)} | {i: 2 for i in range(8, 16)}
    restored = prompt_policy(solved_cfg.algorithm.filter_groups)
    restored.load_state_dict(policy.state_dict())
    assert (restored.skip, restored.kept_rate) == (policy.skip, policy.kept_rate)


def test_skip_unsolved_and_backoff_by_hand():
    from dapo_rl.collect import SkipPolicy
    from dapo_rl.collect.prompt_policy import SKIP_BACKOFF_CAP

    policy = SkipPolicy(skip_solved=2, skip_unsolved=3)
    policy.record(3, 1, [(5, 8, 8), (6, 0, 8), (7, 4, 8)])
    assert policy.skip == {5: 2, 6: 3} and policy.streak == {5: 1, 6: 1}  # 7: mixed, kept, no skip
    assert policy.kept_rate == pytest.approx(1 / 3)
    policy.record(2, 0, [(5, 8, 8), (6, 0, 8)])  # no backoff: the same skips again
    assert policy.skip == {5: 2, 6: 3} and policy.streak == {5: 2, 6: 2}
    policy.backoff = True
    policy.record(
        2, 1, [(5, 0, 8), (6, 3, 8)]
    )  # 5's third zero-variance group in a row (now all wrong): 3 * 2**2
    assert policy.skip[5] == 12 and policy.streak == {
        5: 3
    }  # 6 mixed: its record cleared (its pending skip stays)
    policy.record(1, 0, [(6, 8, 8)])
    assert policy.skip[6] == 2 and policy.streak[6] == 1
    for _ in range(12):
        policy.record(1, 0, [(5, 8, 8)])
    assert policy.streak[5] == 15 and policy.skip[5] == 2 * SKIP_BACKOFF_CAP == 128
    solved_only = SkipPolicy(skip_solved=2)
    solved_only.record(1, 0, [(9, 0, 8)])  # skip_unsolved off: all-wrong is not noted
    assert solved_only.skip == {} and solved_only.streak == {}
    restored = SkipPolicy(skip_solved=2, skip_unsolved=3, backoff=True)
    restored.load_state_dict(policy.state_dict())
    assert (restored.skip, restored.streak, restored.kept_rate) == (
        policy.skip,
        policy.streak,
        policy.kept_rate,
    )


def test_skip_unsolved_in_collect_batch(parts):
    tok, engine, ds = parts
    from dapo_rl.collect import prompt_policy

    cfg = _cfg(
        "always_wrong",
        "algorithm.filter_groups.skip_unsolved=1",
        "algorithm.filter_groups.skip_backoff=true",
        "algorithm.filter_groups.on_exhausted=partial",
        "algorithm.filter_groups.max_num_gen_batches=2",
    )
    policy, sampler = prompt_policy(cfg.algorithm.filter_groups), EpochSampler(len(ds), shuffle=False)
    with RewardPool(f"{__name__}:always_wrong", num_workers=0) as pool:
        scorer = _episode(tok, pool)
        with pytest.raises(DynamicSamplingExhausted):  # nothing kept: not even a partial batch
            collect_batch(engine, scorer, sampler, ds, cfg, step=1, policy=policy)
        assert policy.skip == {i: 1 for i in range(16)} and policy.streak == {i: 1 for i in range(16)}
        sampler.pos = 0  # prompts 0-15 come up again: each passed over once, 16-31 sampled in their place
        with pytest.raises(DynamicSamplingExhausted):
            collect_batch(engine, scorer, sampler, ds, cfg, step=2, policy=policy)
    assert sampler.pos == 32 and policy.skip == {i: 1 for i in range(16, 32)}
    sampler.pos = 0
    indices, skipped = policy.draw(sampler, 8)  # 0-15 were passed over once: their skips are used up
    assert indices == list(range(8)) and skipped == 0


def test_a_sampling_state_saved_with_the_removed_options_fields_still_loads():
    """A checkpoint of dapo-rl before 2026-12-03 saved `SamplingState`, with `prioritize`'s and `history_baseline`'s
    fields (`last`, `first_unanimous`, `first_drawn`, `previous`) too: the prompt policies load it and drop those."""
    from dapo_rl.collect import PromptPolicy, SkipPolicy

    old = {
        "kept_rate": 0.4,
        "skip": {"3": 2},
        "streak": {"3": 1},
        "last": {"3": [8, 8, 5], "7": [4, 8, 6]},
        "first_unanimous": 0.45,
        "first_drawn": 12,
        "previous": {"3": [[5, [1.0] * 8, [1.0] * 8]]},
    }
    skips = SkipPolicy(skip_solved=4, skip_unsolved=4, backoff=True)
    skips.load_state_dict(old)
    assert (skips.kept_rate, skips.skip, skips.streak) == (0.4, {3: 2}, {3: 1})
    assert skips.state_dict() == {"kept_rate": 0.4, "skip": {"3": 2}, "streak": {"3": 1}}
    plain = PromptPolicy()
    plain.load_state_dict(old)
    assert plain.state_dict() == {"kept_rate": 0.4}
