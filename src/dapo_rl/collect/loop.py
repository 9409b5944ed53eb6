"""Dynamic sampling's loop (DAPO section 3.2, Eq. 11): generation rounds until the step's batch of groups is kept,
across ranks, with the step's statistics over everything generated."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch

from dapo_rl.algo import kept_group_ids
from dapo_rl.collect.prompt_policy import PromptPolicy, prompt_policy
from dapo_rl.collect.records import PromptGroup
from dapo_rl.collect.sampling import Scorer, sample_and_score
from dapo_rl.config import Config
from dapo_rl.data import EpochSampler, PromptDataset
from dapo_rl.distributed import DistContext, all_gather_objects, all_reduce
from dapo_rl.rollout import SamplingParams
from dapo_rl.rollout.seeds import round_seed


class DynamicSamplingExhausted(RuntimeError):
    """Dynamic sampling hit `algorithm.filter_groups.max_num_gen_batches` before the batch was full."""


def collect_batch(
    engine,
    scorer: Scorer,
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
        scorer: scores and shapes rollouts.
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
    rounds = skipped = prompts = 0
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
        sampled, seconds = sample_and_score(
            engine,
            scorer,
            dataset,
            [indices[p] for p in positions],
            params,
            (ctx.device.type != "cpu" and cfg.reward.num_workers > 0)
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
        round_kept, total_fresh = all_reduce([len(kept) - kept_before, len(kept)], ctx)
        policy.record(len(indices), int(round_kept), outcomes)
        total_kept = len(carried) + int(total_fresh)
        if total_kept >= want:
            break
        if fg.max_num_gen_batches > 0 and rounds >= fg.max_num_gen_batches:
            usable = _usable_partial(total_kept, r.n, ctx.world_size)
            if fg.on_exhausted == "partial" and usable:
                log(
                    f"step {step}: dynamic sampling kept {total_kept}/{want} groups; training on {usable} of them"
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
                "some but not all of these problems."
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
    `fg.metric` varies (all of them when `fg.enable` is false) and the response tokens of those dropped."""
    if not fg.enable or not groups:
        return list(groups), 0
    metric = torch.tensor([v for g in groups for v in g.metric(fg.metric)])
    gidx = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g.rollouts) for g in groups]))
    keep = set(kept_group_ids(metric, gidx).tolist())
    dropped = sum(x.response_length for i, g in enumerate(groups) if i not in keep for x in g.rollouts)
    return [g for i, g in enumerate(groups) if i in keep], dropped


def group_outcomes(groups: list[PromptGroup]) -> list[tuple[int, int, int]]:
    """`(problem index, correct responses, responses)` of each group: what a prompt policy's `record` learns from."""
    return [
        (g.rollouts[0].problem_idx, sum(bool(x.acc) for x in g.rollouts), len(g.rollouts)) for g in groups
    ]


def _share_groups(kept: list[PromptGroup], ctx: DistContext) -> list[PromptGroup]:
    """Every rank's kept groups, in rank order, for the batch's arithmetic: this rank's own complete, the others'
    without response tokens, log-probs and text (`owner` says who holds them; `make_train_batch` fetches the rows
    each rank trains on). One process: `kept` itself."""
    if not ctx.distributed:
        return list(kept)
    light = [light_group(g) for g in kept]
    out = []
    for r, part in enumerate(all_gather_objects(light, ctx)):
        out.extend(replace(g, owner=r) for g in (kept if r == ctx.rank else part))
    return out


def light_group(g: PromptGroup) -> PromptGroup:
    """`g` for another rank's batch arithmetic: its rollouts without response tokens, log-probs and text (prompts
    kept); `make_train_batch` fetches the rows a rank trains on from the group's `owner`."""
    return replace(g, rollouts=[replace(x.light(), prompt_ids=x.prompt_ids) for x in g.rollouts])


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
    """Means over every response generated in the step, on all ranks; a step that generated nothing (its batch all
    carried groups) logs only the counts (`_STEP_COUNTS`), so curves and CAMPO's saturation window see no zeros.

    `filtered_tokens` (this rank's response tokens in groups the filter dropped) and `surplus_tokens` (tokens of
    kept groups dropped for lack of room, the same count on every rank) give `train/gen_tokens_wasted_ratio`: the
    share of the step's generated response tokens that no update sees. `train/token_prob_mean` is the mean sampling probability of the generated
    tokens (`exp` of the engine's log-probs; DAPO Fig. 7's "mean probability"), `train/all_correct_group_ratio`
    and `train/all_wrong_group_ratio` the share of groups whose responses were all right / all wrong (Fig. 3b).
    """
    sums = all_reduce(generated_sums(generated) + [filtered_tokens], ctx)
    longest = all_reduce(
        [max((x.response_length for g in generated for x in g.rollouts), default=0)], ctx, op="max"
    )[0]
    return stats_from_sums(sums, longest, rounds, total_kept, surplus_tokens)


def generated_sums(generated: list[PromptGroup]) -> list[float]:
    """The additive statistics of generated groups that `stats_from_sums` turns into a step's means: responses,
    groups, reward, correct, tokens, truncated, verifier errors and timeouts, all-correct and all-wrong groups, the
    sum of sampling probabilities and their count (the model's tokens only, `Rollout.loss_mask`), refused answers.
    Sums of several rounds add up element-wise."""
    rs = [x for g in generated for x in g.rollouts]
    lps = [lp for x in rs for lp in x.sampled_logprobs()]
    return [
        len(rs),
        len(generated),
        sum(x.reward for x in rs),
        sum(float(x.acc) for x in rs),
        sum(x.response_length for x in rs),
        sum(x.truncated for x in rs),
        sum(x.status == "error" for x in rs),
        sum(x.status == "timeout" for x in rs),
        sum(all(x.acc for x in g.rollouts) for g in generated),
        sum(not any(x.acc for x in g.rollouts) for g in generated),
        float(torch.tensor(lps, dtype=torch.float64).exp().sum()) if lps else 0.0,
        len(lps),
        sum(x.status == "refused" for x in rs),
    ]


def stats_from_sums(
    sums: list[float], longest: int, rounds: int, total_kept: int, surplus_tokens: int = 0
) -> dict:
    """A step's statistics (`_step_stats`) from `generated_sums` + [filtered tokens] over all its rounds and ranks,
    the longest response, the rounds, the groups kept and the surplus tokens dropped."""
    (
        n,
        groups,
        reward,
        acc,
        length,
        truncated,
        errors,
        timeouts,
        all_right,
        all_wrong,
        prob,
        n_lp,
        refused,
        filtered,
    ) = sums
    out = {
        "train/reward_mean": reward / max(n, 1.0),
        "train/acc_mean": acc / max(n, 1.0),
        "train/response_length_mean": length / max(n, 1.0),
        "train/response_length_max": longest,
        "train/response_clip_ratio": truncated / max(n, 1.0),
        "train/num_gen_batches": rounds,
        "train/filter_pass_ratio": total_kept / max(groups, 1.0),
        "train/all_correct_group_ratio": all_right / max(groups, 1.0),
        "train/all_wrong_group_ratio": all_wrong / max(groups, 1.0),
        "train/gen_samples": int(n),
        "train/gen_tokens": int(length),
        "train/gen_tokens_wasted": int(filtered + surplus_tokens),
        "train/gen_tokens_wasted_ratio": (filtered + surplus_tokens)
        / max(length, filtered + surplus_tokens, 1.0),
        "train/gen_tokens_filtered_ratio": filtered / max(length, 1.0),
        "train/gen_tokens_surplus_ratio": surplus_tokens / max(length, 1.0),
        "reward/error_rate": errors / max(n, 1.0),
        "reward/timeout_rate": timeouts / max(n, 1.0),
        "reward/refused_rate": refused / max(n, 1.0),
    }
    if n_lp:
        out["train/token_prob_mean"] = prob / n_lp
    if not n:  # nothing generated (carried groups filled the batch): no means to log, rather than zeros
        out = {k: v for k, v in out.items() if k in _STEP_COUNTS}
    return out


_STEP_COUNTS = (
    "train/num_gen_batches",
    "train/gen_samples",
    "train/gen_tokens",
    "train/gen_tokens_wasted",
    "train/gen_tokens_wasted_ratio",
)
"""The keys of `_step_stats` that a step which generated nothing still logs: its counts (0) and the waste share
(1 when it dropped carried groups for lack of room, else 0); its means are left out."""
