"""Token-budget micro-batches (`actor.use_dynamic_bsz`) and the padding-free forward, on the real tiny model."""

import pytest
import torch

from dapo_rl.actor import Actor, TrainBatch
from dapo_rl.config import ActorConfig, AlgorithmConfig, ConfigError
from dapo_rl.distributed.balance import token_budget_bins
from dapo_rl.models.tiny import save_tiny_checkpoint


def test_padded_bins_are_runs_of_similar_lengths_within_the_budget():
    # longest first: 9 alone (2 x 9 > 10), then 5 and 3 (2 x 5 = 10), then 2
    assert token_budget_bins([5, 3, 9, 2], 10, padded=True) == [[2], [0, 1], [3]]
    # a row longer than the budget still gets a bin of its own
    assert token_budget_bins([50, 3], 10, padded=True) == [[0], [1]]
    assert token_budget_bins([], 10, padded=True) == []


def test_packed_bins_are_the_fewest_that_fit_balanced():
    # 19 tokens, budget 10: two bins, 9 | 5 + 3 + 2 (LPT)
    assert token_budget_bins([5, 3, 9, 2], 10, padded=False) == [[2], [0, 1, 3]]
    # LPT overflows a bin at 2 bins (6 + 4 + 4 = 14 > 12 ... tries 3)
    bins = token_budget_bins([6, 6, 4, 4, 4], 12, padded=False)
    assert all(sum([6, 6, 4, 4, 4][i] for i in b) <= 12 for b in bins) and len(bins) == 3


def test_num_bins_halves_the_widest_bin():
    assert token_budget_bins([5, 3, 9, 2], 10, padded=True, num_bins=4) == [[2], [0], [1], [3]]
    # not enough rows to reach the count: as many as there can be
    assert token_budget_bins([5, 3], 100, padded=True, num_bins=5) == [[0], [1]]
    with pytest.raises(ValueError, match="budget"):
        token_budget_bins([1], 0, padded=True)


# --------------------------------------------------------------------------------------------- real model
def _setup(tmp_path):
    tok = save_tiny_checkpoint(tmp_path, seed=5)
    g = torch.Generator().manual_seed(0)
    prompts, responses = [], []
    for i in range(10):  # a DAPO-like spread: prompts 4-12 tokens, responses 1-60 tokens
        p = torch.randint(0, 250, (4 + (i * 3) % 9,), generator=g).tolist()
        r = torch.randint(0, 250, (1 + (i * 37) % 60,), generator=g).tolist()
        prompts.append(p)
        responses.append(r)
    adv = torch.linspace(-1, 1, 10)
    return TrainBatch.build(prompts, responses, adv, torch.ones(10), tok.pad_token_id)


def _actor(path, attn_implementation=None, **cfg):
    base = {"lr": 0.0, "grad_clip": 1e9, "ppo_micro_batch_size": 64}
    return Actor(
        str(path),
        ActorConfig(**(base | cfg)),
        AlgorithmConfig(),
        temperature=0.9,
        attn_implementation=attn_implementation,
    )


def test_packed_forward_equals_the_padded_one(tmp_path):
    batch = _setup(tmp_path)
    padded = _actor(tmp_path, use_remove_padding=False).compute_log_prob(batch)
    packed = _actor(tmp_path, use_remove_padding=True).compute_log_prob(batch)
    budget = _actor(
        tmp_path, use_remove_padding=True, use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=80
    )
    by_budget = budget.compute_log_prob(batch)
    mask = batch.response_mask.bool()
    assert (padded[~mask] == 0).all() and (packed[~mask] == 0).all()
    assert (packed - padded).abs().max() < 1e-5
    assert (by_budget - padded).abs().max() < 1e-5
    # the no-grad pass really ran in several packed micro-batches, each within the budget
    bins = budget.micro_batches(batch, torch.arange(10), 80)
    lens = batch.attention_mask.sum(1)
    assert len(bins) > 1 and all(int(lens[idx].sum()) <= 80 or len(idx) == 1 for idx, _ in bins)


def _grads(path, batch, attn_implementation=None, **cfg):
    """The accumulated gradient as the (one) optimizer step sees it: `update` frees the gradients afterwards."""
    actor = _actor(path, attn_implementation, **cfg)
    named = list(actor.model.named_parameters())
    seen = []
    actor.optimizer.register_step_pre_hook(
        lambda *_: seen.append({n: p.grad.clone() for n, p in named if p.grad is not None})
    )
    actor.update(batch)
    assert len(seen) == 1 and all(p.grad is None for _, p in named)
    return seen[0]


@pytest.mark.parametrize(
    "cfg",
    [
        {"ppo_micro_batch_size": 1},
        {"ppo_micro_batch_size": 3},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 70},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 70, "use_remove_padding": True},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 1, "use_remove_padding": True},
    ],
)
def test_the_gradient_does_not_depend_on_the_split(tmp_path, cfg):
    batch = _setup(tmp_path)
    ref = _grads(tmp_path, batch, ppo_micro_batch_size=64)  # one forward over all ten rows
    got = _grads(tmp_path, _setup(tmp_path), **cfg)
    assert ref.keys() == got.keys() and len(ref) > 10
    for name in ref:
        scale = ref[name].abs().max().clamp(min=1e-8)
        assert ((got[name] - ref[name]).abs().max() / scale) < 1e-4, name


def test_padded_budget_bins_bound_the_padded_tokens(tmp_path):
    batch = _setup(tmp_path)
    actor = _actor(tmp_path, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=100, use_remove_padding=False)
    lens = batch.attention_mask.sum(1)
    bins = actor.micro_batches(batch, torch.arange(10), 100)
    assert sorted(int(i) for idx, _ in bins for i in idx) == list(range(10))
    for idx, dummy in bins:
        assert not dummy and (len(idx) * int(lens[idx].max()) <= 100 or len(idx) == 1)


def test_eager_and_sdpa_attention_give_the_same_log_probs_and_gradient(tmp_path):
    """`model.attn_implementation` (auto picks eager on a CPU where it is faster) changes the kernel, not the values:
    padded rows of 5-72 tokens, fp32."""
    batch = _setup(tmp_path)
    sdpa = _actor(tmp_path, "sdpa")
    eager = _actor(tmp_path, "eager")
    assert (
        sdpa.model.config._attn_implementation == "sdpa"
        and eager.model.config._attn_implementation == "eager"
    )
    assert (eager.compute_log_prob(batch) - sdpa.compute_log_prob(batch)).abs().max() < 1e-5
    ref = _grads(tmp_path, batch, "sdpa", ppo_micro_batch_size=3)
    got = _grads(tmp_path, _setup(tmp_path), "eager", ppo_micro_batch_size=3)
    for name in ref:
        scale = ref[name].abs().max().clamp(min=1e-8)
        assert ((got[name] - ref[name]).abs().max() / scale) < 1e-4, name


def _grouped(tmp_path):
    """GRPO-shaped rows: 3 prompts x 4 responses and one prompt alone, shuffled; prompts 4-12 tokens, responses
    1-40."""
    tok = save_tiny_checkpoint(tmp_path, seed=5)
    g = torch.Generator().manual_seed(1)
    heads = [torch.randint(0, 250, (k,), generator=g).tolist() for k in (4, 12, 7, 9)]
    rows = [(heads[i // 4] if i < 12 else heads[3]) for i in range(13)]
    responses = [torch.randint(0, 250, (1 + (i * 17) % 40,), generator=g).tolist() for i in range(13)]
    order = torch.randperm(13, generator=g).tolist()
    adv = torch.linspace(-1, 1, 13)
    return TrainBatch.build(
        [rows[i] for i in order], [responses[i] for i in order], adv, torch.ones(13), tok.pad_token_id
    )


@pytest.mark.parametrize("micro", [64, 5])
def test_shared_prefix_gives_the_full_forwards_log_probs_and_gradient(tmp_path, micro):
    batch = _grouped(tmp_path)
    full = _actor(tmp_path, shared_prefix=False, ppo_micro_batch_size=micro)
    shared = _actor(tmp_path, shared_prefix=True, ppo_micro_batch_size=micro)
    assert shared.shared_prefix and not full.shared_prefix
    want, got = full.compute_log_prob(batch), shared.compute_log_prob(batch)
    assert (want[~batch.response_mask.bool()] == 0).all() and (got[~batch.response_mask.bool()] == 0).all()
    assert (got - want).abs().max() < 1e-5
    ref = _grads(tmp_path, batch, shared_prefix=False, ppo_micro_batch_size=micro)
    new = _grads(tmp_path, _grouped(tmp_path), shared_prefix=True, ppo_micro_batch_size=micro)
    assert ref.keys() == new.keys() and len(ref) > 10
    for name in ref:
        scale = ref[name].abs().max().clamp(min=1e-8)
        assert ((new[name] - ref[name]).abs().max() / scale) < 1e-4, name


def test_shared_prefix_is_on_by_default_only_where_it_applies(tmp_path):
    save_tiny_checkpoint(tmp_path, seed=5)
    assert _actor(tmp_path).shared_prefix  # padded forward, one process
    assert not _actor(tmp_path, use_remove_padding=True).shared_prefix
    assert not _actor(tmp_path, gradient_checkpointing=True).shared_prefix
    with pytest.raises(ConfigError, match="actor.shared_prefix=true needs the padded forward"):
        _actor(tmp_path, shared_prefix=True, use_remove_padding=True)
    # the two-pass forward only where repeated prompts save >= 10% of the tokens: not for ten distinct prompts
    actor = _actor(tmp_path)
    grouped, distinct = _grouped(tmp_path), _setup(tmp_path)
    assert actor._prefix_pays(grouped, actor._distinct_prompts(grouped)[0])
    assert not actor._prefix_pays(distinct, actor._distinct_prompts(distinct)[0])


@pytest.mark.parametrize("remove_padding", [False, True])
def test_the_backward_keeps_only_the_fp32_logits_of_the_response_positions(tmp_path, remove_padding):
    """What autograd saves in the forward past the LM head: one fp32 (B, T, V) copy (logits / temperature, for the
    log-softmax's backward), never the bf16 logits the head computed (the padded forward's `gather` kept those,
    5.8 GiB at the 32B recipe; indexing keeps only their size)."""
    batch = _setup(tmp_path)
    actor = _actor(tmp_path, use_remove_padding=remove_padding, autocast_dtype="bfloat16")
    vocab = actor.model.config.vocab_size
    saved = []

    def pack(t):
        if (
            t.dim() >= 2 and t.shape[-1] == vocab and t.numel() > vocab * vocab
        ):  # logits, not the head's weight
            saved.append((t.dtype, tuple(t.shape), t.untyped_storage().data_ptr()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        actor.forward(batch)
    t = batch.response_mask.shape[1]
    # saved twice (the label's gather and logsumexp), one tensor
    assert {s[:2] for s in saved} == {(torch.float32, (10, t, vocab))} and len({s[2] for s in saved}) == 1


def test_old_log_probs_are_computed_without_dropout_after_an_update(tmp_path):
    """A checkpoint with attention dropout 0.5: `update` leaves the model in train mode, and the next
    `compute_log_prob` (pi_old) still gives the deterministic eval-mode values (lr 0: the weights are unchanged)."""
    from dapo_rl.models.tiny import build_tiny_model, build_tiny_tokenizer

    model = build_tiny_model(seed=5)
    model.config.attention_dropout = 0.5
    model.save_pretrained(tmp_path)
    build_tiny_tokenizer().save_pretrained(tmp_path)
    batch = _setup(tmp_path / "unused")
    actor = _actor(tmp_path, attn_implementation="eager")
    before = actor.compute_log_prob(batch)
    actor.update(batch)
    assert actor.model.training
    assert torch.equal(actor.compute_log_prob(batch), before)
    actor.model.train()  # what the old code computed: dropout on, another value each call
    with torch.no_grad():
        noisy = actor.forward(batch)[0]
    assert (noisy - before).abs().max() > 1e-3
