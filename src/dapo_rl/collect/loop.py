"""Dynamic sampling's loop (DAPO section 3.2, Eq. 11): generation rounds until the step's batch of groups is kept,
across ranks, with the step's statistics over everything generated."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch

from dapo_rl.algo import kept_group_ids
from dapo_rl.collect.prompt_policy import PromptPolicy, prompt_policy
from dapo_rl.collect.stats import GenerationSums
from dapo_rl.config import Config
from dapo_rl.data import EpochSampler, PromptDataset
from dapo_rl.distributed import DistContext, all_gather_objects, all_reduce
from dapo_rl.episode import Episode, PromptGroup
from dapo_rl.rollout import SamplingParams
from dapo_rl.rollout.seeds import round_seed


class DynamicSamplingExhausted(RuntimeError):
    """Dynamic sampling hit `algorithm.filter_groups.max_num_gen_batches` before the batch was full."""


def collect_batch(
    engine,
    episode: Episode,
    sampler: EpochSampler,
    dataset: PromptDataset,
    cfg: Config,
    step: int,
    ctx: DistContext | None = None,
    log: Callable[[str], None] = print,
    policy: PromptPolicy | None = None,
    carry: list[PromptGroup] | None = None,
) -> tuple[list[PromptGroup], dict]:
    """Dynamic sampling (DAPO section 3.2, Eq. 11): generation rounds of `data.gen_batch_size` prompts, keeping the
    groups whose metric varies, until `data.train_batch_size` groups are kept over all ranks.

    Every rank draws the same round from the (replicated) sampler through the prompt-sampling `policy` and takes
    every `world_size`-th prompt of it; the kept count is all-reduced after each round, so all ranks stop after the
    same round. The kept groups are then gathered and ordered by `(round, position)`, which is the order one process
    would keep them in, and the first `train_batch_size` are the batch (the same list on every rank).

    Zero-waste options (`algorithm.filter_groups`): `carry_surplus` puts the kept groups beyond the batch first into
    the next step's batch (key `(0, i)`; a carried group not used then is dropped); `skip_solved` / `skip_unsolved`
    (`skip_backoff`) and `adaptive_gen_batch` are the `policy`'s (`dapo_rl.collect.prompt_policy`).

    Args:
        engine: rollout engine (`generate`).
        episode: samples, scores and shapes each round's trajectories (`dapo_rl.episode.build_episode`).
        sampler: the training prompts' epoch order (advanced by each round's draws).
        dataset: the training prompts.
        cfg: the run's configuration.
        step: the RL step (the sampling seeds).
        ctx: this rank (None: one process).
        log: where a partial-batch note goes.
        policy: which prompts each round draws, and how many; it learns from each round (None: a fresh
            `prompt_policy(cfg.algorithm.filter_groups)`).
        carry: with `carry_surplus`, the kept groups carried from the previous step; replaced, in place, by this
            step's surplus to carry (None: none).

    Returns:
        `(groups, stats)`: the training batch's groups (all ranks') and statistics over every response generated
        this step on all ranks (all rounds), not only the kept ones; `time/generate_s` is this rank's time in the
        engine. `train/gen_tokens_wasted_ratio` is the share of this step's generated response tokens that no
        update will see: groups dropped by the filter (`..._filtered_ratio`) and kept groups dropped as surplus
        (`..._surplus_ratio`; with `carry_surplus`, carried groups that found no room either).

    Raises:
        DynamicSamplingExhausted: `max_num_gen_batches` rounds did not fill the batch and `on_exhausted` is `error`
            (on every rank alike).
    """
    ctx = ctx or DistContext()
    fg = cfg.algorithm.filter_groups
    policy = policy if policy is not None else prompt_policy(fg)
    carry = carry if carry is not None else []
    r = cfg.rollout
    want = cfg.data.train_batch_size
    carried = [replace(g, key=(0, i)) for i, g in enumerate(carry)] if fg.carry_surplus else []
    carry.clear()
    kept: list[PromptGroup] = []
    generated: list[PromptGroup] = []
    filtered_tokens = 0
    rounds = skipped = prompts = void_groups = 0
    generate_s = 0.0
    total_kept = len(carried)
    while total_kept < want:
        rounds += 1
        size = policy.round_size(want - total_kept, cfg.data.gen_batch_size, ctx.world_size)
        indices, passed = policy.draw(sampler, size)
        skipped += passed
        prompts += len(indices)
        positions = list(range(ctx.rank, len(indices), ctx.world_size))
        params = round_params(cfg, round_seed(cfg.trainer.seed, step, rounds, ctx.rank))
        sampled, seconds = episode.sample(
            engine,
            dataset,
            [indices[p] for p in positions],
            params,
            overlap=(ctx.device.type != "cpu" and cfg.reward.num_workers > 0)
            if cfg.reward.overlap is None
            else cfg.reward.overlap,
        )
        generate_s += seconds
        groups = [PromptGroup((rounds, p), g) for p, g in zip(positions, sampled)]
        generated.extend(groups)
        kept_before = len(kept)
        round_kept, round_filtered = filter_groups(groups, fg)
        kept.extend(round_kept)
        filtered_tokens += round_filtered
        outcomes: list[tuple[int, int, int]] = []
        if policy.needs_outcomes:
            # a collective: a rank that drew no prompt this round (gen_batch_size < world size) joins with nothing
            outcomes = [o for part in all_gather_objects(group_outcomes(groups), ctx) for o in part]
        round_void = sum(map(is_void, groups))
        void_groups += round_void
        round_kept, total_fresh, total_void, round_void = all_reduce(
            [len(kept) - kept_before, len(kept), void_groups, round_void], ctx
        )
        policy.record(len(indices) - int(round_void), int(round_kept), outcomes)
        total_kept = len(carried) + int(total_fresh)
        if total_kept >= want:
            break
        if fg.max_num_gen_batches > 0 and rounds >= fg.max_num_gen_batches:
            usable = _usable_partial(total_kept, r.n, ctx.world_size)
            if fg.on_exhausted == "partial" and usable:
                log(
                    f"step {step}: dynamic sampling kept {total_kept}/{want} groups; training on {usable} of them."
                    + void_hint(int(total_void))
                )
                want = usable
                break
            raise DynamicSamplingExhausted(
                f"dynamic sampling kept {total_kept} of the {want} prompt groups a step needs after {rounds} "
                f"generation rounds of {cfg.data.gen_batch_size} prompts (algorithm.filter_groups."
                f"max_num_gen_batches={fg.max_num_gen_batches}): the other groups' {r.n} responses were "
                "all right or all wrong, so they carry no learning signal. Raise algorithm.filter_groups."
                "max_num_gen_batches (0 = unlimited) or data.gen_batch_size, set algorithm.filter_groups."
                "on_exhausted=partial, disable algorithm.filter_groups.enable, or start from a model that solves "
                "some but not all of these problems." + void_hint(int(total_void))
            )
    fresh = sorted(_share_groups(kept, ctx), key=lambda g: g.key)
    pool = carried + fresh
    batch, surplus = pool[:want], pool[want:]
    if fg.carry_surplus:
        carry.extend(g for g in surplus if g.key[0] > 0)  # fresh surplus: next step; stale surplus: dropped
        surplus = [g for g in surplus if g.key[0] == 0]
    surplus_tokens = sum(x.response_length for g in surplus for x in g.rollouts)
    stats = _step_stats(generated, rounds, total_kept - len(carried), ctx, filtered_tokens, surplus_tokens)
    stats |= {
        "train/kept_groups": len(batch),
        "train/carried_groups": sum(g.key[0] == 0 for g in batch),
        "train/gen_prompts": prompts,
        "train/skipped_prompts": skipped,
    }
    if policy.kept_rate is not None:
        stats["train/kept_rate"] = policy.kept_rate
    return batch, stats | {"time/generate_s": generate_s}


def round_params(cfg: Config, seed: int) -> SamplingParams:
    """The sampling parameters of one training round: `rollout.n`, its temperature, top-p and top-k, at most
    `data.max_response_length` tokens, and the round's `seed`."""
    r = cfg.rollout
    return SamplingParams(
        n=r.n,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_tokens=cfg.data.max_response_length,
        seed=seed,
    )


def filter_groups(groups: list[PromptGroup], fg) -> tuple[list[PromptGroup], int]:
    """Dynamic sampling's filter over one round's groups (DAPO Eq. 11): `(kept, filtered_tokens)`, the groups whose
    `fg.metric` varies (all of them when `fg.enable` is false) and the response tokens of those dropped. A group
    with a `void` trajectory (the sandbox failed under a tool call) is dropped whatever `fg` says: its outcome is
    the sandbox's, not the policy's."""
    void = [g for g in groups if is_void(g)]
    if void:
        groups = [g for g in groups if g not in void]
    dropped_void = sum(x.response_length for g in void for x in g.rollouts)
    if not fg.enable or not groups:
        return list(groups), dropped_void
    metric = torch.tensor([v for g in groups for v in g.metric(fg.metric)])
    gidx = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g.rollouts) for g in groups]))
    keep = set(kept_group_ids(metric, gidx).tolist())
    dropped = sum(x.response_length for i, g in enumerate(groups) if i not in keep for x in g.rollouts)
    return [g for i, g in enumerate(groups) if i in keep], dropped + dropped_void


def group_outcomes(groups: list[PromptGroup]) -> list[tuple[int, int, int]]:
    """`(problem index, correct responses, responses)` of each group: what a prompt policy's `record` learns from.
    A void group (the sandbox failed under a tool call, `filter_groups`) is left out: its outcome says nothing
    about the prompt."""
    return [
        (g.rollouts[0].problem_idx, sum(bool(x.acc) for x in g.rollouts), len(g.rollouts))
        for g in groups
        if not is_void(g)
    ]


def is_void(group: PromptGroup) -> bool:
    """The group has a `void` trajectory (the sandbox failed under one of its tool calls or code tests)."""
    return any(x.void for x in group.rollouts)


def void_hint(void_groups: int) -> str:
    """What a dynamic-sampling exhaustion message adds when the sandbox voided groups (none: nothing)."""
    if not void_groups:
        return ""
    were = "group was" if void_groups == 1 else "groups were"
    return (
        f" {void_groups} dropped {were} void, whatever the answers: the sandbox failed under a tool call or a "
        "code test (tool/sandbox_error_rate, reward/code_sandbox_error_rate), not the model; check the machine "
        "with `dapo sandbox -c 'print(1)'` or lower episode.tool.num_workers / reward.num_workers."
    )


def _share_groups(kept: list[PromptGroup], ctx: DistContext) -> list[PromptGroup]:
    """Every rank's kept groups, in rank order, for the batch's arithmetic: this rank's own complete, the others'
    without response tokens, log-probs and text (`owner` says who holds them; `make_train_batch` fetches the rows
    each rank trains on). One process: `kept` itself."""
    if not ctx.distributed:
        return list(kept)
    light = [g.light() for g in kept]
    out = []
    for r, part in enumerate(all_gather_objects(light, ctx)):
        out.extend(replace(g, owner=r) for g in (kept if r == ctx.rank else part))
    return out


def _usable_partial(kept: int, n: int, world: int) -> int:
    """The most of `kept` groups whose `kept * n` sequences split evenly over `world` ranks."""
    step = world // math.gcd(n, world)
    return kept - kept % step


def _step_stats(
    generated: list[PromptGroup],
    rounds: int,
    total_kept: int,
    ctx: DistContext,
    filtered_tokens: int = 0,
    surplus_tokens: int = 0,
) -> dict:
    """The step's statistics over every response generated in it, on all ranks (`GenerationSums.stats`).

    `filtered_tokens` is this rank's response tokens in groups the filter dropped, `surplus_tokens` the tokens of
    kept groups dropped for lack of room (the same count on every rank).
    """
    sums = GenerationSums.from_list(all_reduce(GenerationSums.of(generated, filtered_tokens).as_list(), ctx))
    longest = all_reduce(
        [max((x.model_length for g in generated for x in g.rollouts), default=0)], ctx, op="max"
    )[0]
    return sums.stats(longest, rounds, total_kept, surplus_tokens)
