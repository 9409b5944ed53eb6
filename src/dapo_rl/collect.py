"""Batch collection, as data flows in DESIGN.md: prompts -> engine -> responses -> verifier -> shaping -> groups of n
-> dynamic sampling -> advantages -> this rank's share of the training batch.

Plain functions of an engine, a scorer and a sampler, so that tests drive them with the real tiny model and no
`Trainer`. Under N ranks (SPMD) every rank samples its own share of each generation round's prompts and scores whole
groups locally; only the kept-group count, the statistics and, once per step, the kept groups cross ranks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from dapo_rl.actor import TrainBatch
from dapo_rl.algo import get_adv_estimator, kept_group_ids, overlong_penalty
from dapo_rl.config import Config, FilterGroupsConfig, OverlongBufferConfig, RepetitionPenaltyConfig
from dapo_rl.data import EpochSampler, PromptDataset, Sample
from dapo_rl.distributed import (
    DistContext,
    all_gather_objects,
    all_reduce,
    all_to_all_objects,
    shard_minibatches,
)
from dapo_rl.reward.shaping import repetition_penalty
from dapo_rl.rollout import SamplingParams
from dapo_rl.rollout.seeds import round_seed


class DynamicSamplingExhausted(RuntimeError):
    """Dynamic sampling hit `algorithm.filter_groups.max_num_gen_batches` before the batch was full."""


@dataclass
class Rollout:
    """One sampled response to one prompt, and what the verifier and the shaping made of it.

    Attributes:
        sample: the dataset row (prompt messages, ground truth, data source, uid).
        problem_idx: index of the prompt in its dataset.
        sample_idx: which of the prompt's n responses this is (0..n-1).
        prompt_ids: prompt token ids (after the chat template).
        response_ids: response token ids, eos included when the model stopped.
        logprobs: the engine's sampling log-prob of each response token (`len(response_ids)` floats).
        finish_reason: `stop` (eos) or `length` (truncated at `max_tokens`).
        text: the decoded response (special tokens skipped).
        score: the verifier's score (DAPO's +-1 scale).
        acc: the verifier's correctness.
        pred: the extracted final answer.
        status: `ok`, `error` (the verifier raised) or `timeout` (it was killed).
        reward: the shaped score the advantages use: `score` + overlong penalty (Eq. 13) + repetition penalty.
        response_length: tokens in the response (kept when a record is read back without its token ids).
        vote: the answer this response votes for in maj@k: the first answer of its problem that the verifier judges
            equivalent to `pred` (`dapo_rl.evaluate.pool_equivalent_answers`); empty: `pred` itself.
    """

    sample: Sample
    problem_idx: int
    sample_idx: int
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"
    text: str = ""
    score: float = 0.0
    acc: bool = False
    pred: str = ""
    status: str = "ok"
    reward: float = 0.0
    response_length: int = -1
    vote: str = ""

    def __post_init__(self):
        if self.response_length < 0:
            self.response_length = len(self.response_ids)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def to_record(self, dataset: str) -> dict:
        """The JSON line `dapo eval` writes to generations.jsonl."""
        return {
            "dataset": dataset,
            "problem_idx": self.problem_idx,
            "sample_idx": self.sample_idx,
            "prompt": self.sample.prompt[-1]["content"],
            "response": self.text,
            "pred": self.pred,
            "acc": self.acc,
            "score": self.score,
            "ground_truth": self.sample.ground_truth,
            "response_length": self.response_length,
            "finish_reason": self.finish_reason,
            "vote": self.vote,
        }

    def light(self) -> Rollout:
        """A copy without token ids, log-probs and text: what metrics read, cheap to send to another rank."""
        return replace(self, prompt_ids=[], response_ids=[], logprobs=[], text="")

    @staticmethod
    def from_record(r: dict) -> Rollout:
        """A rollout read back from a generations.jsonl line (no token ids)."""
        sample = Sample(
            f"{r['dataset']}:{r['problem_idx']}",
            "",
            [{"role": "user", "content": r["prompt"]}],
            r["ground_truth"],
        )
        return Rollout(
            sample,
            int(r["problem_idx"]),
            int(r["sample_idx"]),
            finish_reason=r["finish_reason"],
            text=r["response"],
            score=float(r["score"]),
            acc=bool(r["acc"]),
            pred=str(r["pred"]),
            reward=float(r["score"]),
            response_length=int(r["response_length"]),
            vote=str(r.get("vote", "")),
        )


@dataclass
class PromptGroup:
    """The n rollouts of one prompt, with the place it was drawn: `(generation round, position in the round)`.

    Sorting kept groups by `key` gives the order one process would have kept them in, whatever the rank count.
    """

    key: tuple[int, int]
    rollouts: list[Rollout]
    owner: int = -1
    """Under several ranks, the rank that sampled the group and holds its response tokens and log-probs; the other
    ranks hold a copy without them (`Rollout.light` keeping the prompt), enough for the batch's arithmetic, and
    `make_train_batch` fetches only the rows a rank trains on. -1: every rollout is complete here."""

    def metric(self, name: str) -> list[float]:
        """`acc` (0/1) or the shaped `score` of each rollout."""
        return [float(r.acc) if name == "acc" else r.reward for r in self.rollouts]


@dataclass
class Scorer:
    """Decodes responses, scores them through the reward pool, and shapes the scores.

    Attributes:
        tokenizer: decodes token ids (special tokens skipped); None when every rollout comes with its text.
        pool: `dapo_rl.reward.pool.RewardPool`.
        max_response_length: L_max of Eq. 13 (tokens).
        overlong: the overlong buffer (Eq. 13), or None for none.
        repetition: MiroMind-M1's repetition penalty, or None for none.
        log: where the first verifier error of the run is reported (once; later ones only count in
            `reward/error_rate`), or None.
    """

    tokenizer: object
    pool: object
    max_response_length: int = 0
    overlong: OverlongBufferConfig | None = None
    repetition: RepetitionPenaltyConfig | None = None
    log: Callable[[str], None] | None = None
    _reported: bool = False
    seconds: float = 0.0
    """Wall-clock seconds spent in the reward pool so far (`time/score_s` is its growth over a step)."""

    def __call__(self, rollouts: Sequence[Rollout]) -> None:
        """Fill `text`, `score`, `acc`, `pred`, `status` and `reward` of each rollout, in one pool call."""
        if not rollouts:
            return
        # a served model's responses arrive as text (no token ids); the others are decoded here
        coded = [r.response_ids for r in rollouts if r.response_ids]
        decoded = iter(self.tokenizer.batch_decode(coded, skip_special_tokens=True) if coded else [])
        texts = [next(decoded) if r.response_ids else r.text for r in rollouts]
        items = [
            (r.sample.data_source, t, r.sample.ground_truth, r.sample.extra_info)
            for r, t in zip(rollouts, texts)
        ]
        t0 = time.perf_counter()
        results = self.pool.score(items)
        self.seconds += time.perf_counter() - t0
        for r, t, res in zip(rollouts, texts, results):
            r.text, r.score, r.acc, r.pred = (
                t,
                float(res["score"]),
                bool(res["acc"]),
                str(res.get("pred", "")),
            )
            r.status = "timeout" if res.get("timeout") else "error" if "error" in res else "ok"
            r.reward = r.score
            if r.status == "error" and self.log is not None and not self._reported:
                self._reported = True
                self.log(
                    f"reward: a response could not be scored and counts as wrong ({res['error']}); further errors "
                    "are only counted in reward/error_rate"
                )
        if self.overlong is not None and self.overlong.enable:
            pen = overlong_penalty(
                torch.tensor([r.response_length for r in rollouts]),
                self.max_response_length,
                self.overlong.len,
                self.overlong.penalty_factor,
            )
            for r, p in zip(rollouts, pen.tolist()):
                r.reward += p
        rp = self.repetition
        if rp is not None and rp.enable:
            for r in rollouts:
                r.reward += repetition_penalty(
                    r.response_ids, rp.factor, rp.min_repeats, rp.max_period, rp.min_tokens
                )


def sample_groups(
    engine, dataset: PromptDataset, indices: Sequence[int], params: SamplingParams
) -> list[list[Rollout]]:
    """Sample `params.n` responses for each prompt `dataset[i]`, i in `indices` (unscored `Rollout`s). An engine
    with `generate_chat` (a served model) is given the chat messages instead of token ids."""
    if hasattr(engine, "generate_chat"):
        return _rollouts(
            dataset, indices, engine.generate_chat([dataset.samples[i].prompt for i in indices], params)
        )
    return _rollouts(dataset, indices, engine.generate([dataset.prompt_ids[i] for i in indices], params))


def _rollouts(dataset: PromptDataset, indices: Sequence[int], outputs) -> list[list[Rollout]]:
    return [
        [
            Rollout(
                dataset.samples[i],
                i,
                j,
                dataset.prompt_ids[i],
                o.token_ids,
                o.logprobs,
                o.finish_reason,
                text=o.text or "",
                response_length=o.num_tokens if o.text is not None and o.num_tokens is not None else -1,
            )
            for j, o in enumerate(outs)
        ]
        for i, outs in zip(indices, outputs)
    ]


def sample_and_score(
    engine,
    scorer: Scorer,
    dataset: PromptDataset,
    indices: Sequence[int],
    params: SamplingParams,
    overlap: bool = True,
) -> tuple[list[list[Rollout]], float]:
    """`sample_groups` then `scorer`, overlapped where the engine yields its round in chunks (`generate_chunks`):
    chunk k is scored in a background thread while chunk k+1 is sampled. Same rollouts, same rewards, in the same
    order as without overlap; `scorer.seconds` then counts scoring time that ran alongside generation.

    Returns:
        `(groups, generate_seconds)`: the scored groups and the wall time spent inside the engine.
    """
    chunks = getattr(engine, "generate_chunks", None)
    if not overlap or chunks is None:
        t0 = time.perf_counter()
        sampled = sample_groups(engine, dataset, indices, params)
        gen_s = time.perf_counter() - t0
        scorer([x for g in sampled for x in g])
        return sampled, gen_s
    from concurrent.futures import ThreadPoolExecutor

    sampled: list[list[Rollout]] = []
    gen_s = 0.0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dapo-score") as pool:
        futures = []
        stream = chunks([dataset.prompt_ids[i] for i in indices], params)
        while True:
            t0 = time.perf_counter()
            outs = next(stream, None)
            gen_s += time.perf_counter() - t0
            if outs is None:
                break
            part = _rollouts(dataset, indices[len(sampled) : len(sampled) + len(outs)], outs)
            sampled.extend(part)
            futures.append(pool.submit(scorer, [x for g in part for x in g]))
        for f in futures:
            f.result()
    return sampled, gen_s


@dataclass
class SamplingState:
    """What dynamic sampling keeps from one step to the next (the zero-waste options of
    `algorithm.filter_groups`); the same on every rank.

    Attributes:
        carry: kept groups beyond the last batch (`carry_surplus`), trained on next step or dropped.
        kept_rate: running share of sampled prompts whose group was kept (`adaptive_gen_batch`); None before the
            first round.
        skip: prompt index -> how many more of its draws to skip (`skip_solved`, `skip_unsolved`).
        streak: prompt index -> its groups in a row that were all correct or all wrong (`skip_backoff`).
    """

    carry: list[PromptGroup] = field(default_factory=list)
    kept_rate: float | None = None
    skip: dict[int, int] = field(default_factory=dict)
    streak: dict[int, int] = field(default_factory=dict)

    def state_dict(self) -> dict:
        """JSON-safe state for a checkpoint; carried groups are not saved (a resumed run starts without them)."""
        return {
            "kept_rate": self.kept_rate,
            "skip": {str(k): v for k, v in sorted(self.skip.items())},
            "streak": {str(k): v for k, v in sorted(self.streak.items())},
        }

    def load_state_dict(self, state: dict) -> None:
        self.carry = []
        self.kept_rate = state.get("kept_rate")
        self.skip = {int(k): int(v) for k, v in (state.get("skip") or {}).items()}
        self.streak = {int(k): int(v) for k, v in (state.get("streak") or {}).items()}

    def record(self, outcomes: list[tuple[int, int, int]], fg: FilterGroupsConfig) -> None:
        """Note each sampled prompt's group outcome for the skips (`FilterGroupsConfig.skip_solved`,
        `skip_unsolved`, `skip_backoff`).

        Args:
            outcomes: `(prompt index, correct responses, responses)` per sampled group, in sampling order.
            fg: the skip settings.
        """
        for i, correct, n in outcomes:
            solved = True if correct == n else False if correct == 0 else None
            if solved is None:  # a kept group clears the prompt's record
                self.streak.pop(i, None)
                continue
            base = fg.skip_solved if solved else fg.skip_unsolved
            if base == 0:
                self.streak.pop(i, None)
                continue
            run = self.streak.get(i, 0) + 1
            self.streak[i] = run
            self.skip[i] = base * min(2 ** (run - 1), SKIP_BACKOFF_CAP) if fg.skip_backoff else base


SKIP_BACKOFF_CAP = 64
"""The most a prompt's skip grows under `skip_backoff` (times `skip_solved` / `skip_unsolved`)."""

KEPT_RATE_MOMENTUM = 0.7
"""Weight of the previous estimate in the running kept-rate (`adaptive_gen_batch`)."""


def round_size(need: int, kept_rate: float | None, gen_batch_size: int, world_size: int = 1) -> int:
    """Prompts for the next generation round under `adaptive_gen_batch`: enough that `kept_rate` of them fill the
    `need` groups still missing, between a quarter of `gen_batch_size` (small rounds keep the engine's batch too
    small to be efficient) and `gen_batch_size`, and at least `world_size`. `kept_rate` None: `gen_batch_size`.

    Example: need 32, kept-rate 0.45 -> ceil(71.1) = 72, capped at 64; need 3 -> 7, raised to 16 (64 / 4).
    """
    if kept_rate is None:
        return gen_batch_size
    size = math.ceil(need / max(kept_rate, 0.02))
    return min(max(size, math.ceil(gen_batch_size / 4), world_size), gen_batch_size)


def draw_prompts(sampler: EpochSampler, k: int, skip: dict[int, int] | None) -> tuple[list[int], int]:
    """The next `k` prompt indices, passing over prompts with skips left (`skip_solved`, `skip_unsolved`; each pass
    uses one up).

    At most one epoch's worth of prompts is looked at; if that leaves fewer than `k` (nearly every prompt solved),
    the round is topped up with the next draws regardless of their skips (re-checked early).

    Returns:
        `(indices, skipped)`: the drawn indices and how many draws were skipped.
    """
    if not skip:
        return sampler.next(k), 0
    out: list[int] = []
    looked = skipped = 0
    while len(out) < k and looked < sampler.size:
        for i in sampler.next(min(k - len(out), sampler.size - looked)):
            looked += 1
            left = skip.get(i, 0)
            if left > 0:
                skipped += 1
                if left > 1:
                    skip[i] = left - 1
                else:
                    del skip[i]
            else:
                out.append(i)
    if len(out) < k:
        out.extend(sampler.next(k - len(out)))
    return out, skipped


def collect_batch(
    engine,
    scorer: Scorer,
    sampler: EpochSampler,
    dataset: PromptDataset,
    cfg: Config,
    step: int,
    ctx: DistContext | None = None,
    log: Callable[[str], None] = print,
    state: SamplingState | None = None,
) -> tuple[list[PromptGroup], dict]:
    """Dynamic sampling (DAPO section 3.2, Eq. 11): generation rounds of `data.gen_batch_size` prompts, keeping the
    groups whose metric varies, until `data.train_batch_size` groups are kept over all ranks.

    Every rank draws the same round from the (replicated) sampler and takes every `world_size`-th prompt of it; the
    kept count is all-reduced after each round, so all ranks stop after the same round. The kept groups are then
    gathered and ordered by `(round, position)`, which is the order one process would keep them in, and the first
    `train_batch_size` are the batch (the same list on every rank).

    Zero-waste options (`algorithm.filter_groups`, state in `state`): `carry_surplus` puts the kept groups beyond
    the batch first into the next step's batch (key `(0, i)`; a carried group not used then is dropped);
    `skip_solved` / `skip_unsolved` pass over prompts whose last group was all correct / all wrong (`skip_backoff`:
    longer after each such group in a row); `adaptive_gen_batch` sizes each round from the running kept-rate (`round_size`).

    Args:
        engine: rollout engine (`generate`).
        scorer: scores and shapes rollouts.
        sampler: the training-prompt sampler (advanced by each round's prompts).
        dataset: the training prompts.
        cfg: the run's configuration.
        step: the RL step (the sampling seeds).
        ctx: this rank (None: one process).
        log: where a partial-batch note goes.
        state: dynamic sampling's state between steps (None: a fresh one, no carry).

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
    state = state if state is not None else SamplingState()
    fg = cfg.algorithm.filter_groups
    r = cfg.rollout
    want = cfg.data.train_batch_size
    carried = [replace(g, key=(0, i)) for i, g in enumerate(state.carry)] if fg.carry_surplus else []
    state.carry = []
    kept: list[PromptGroup] = []
    generated: list[PromptGroup] = []
    filtered_tokens = 0
    rounds = skipped = prompts = 0
    generate_s = 0.0
    total_kept = len(carried)
    skipping = fg.skip_solved > 0 or fg.skip_unsolved > 0
    while total_kept < want:
        rounds += 1
        size = cfg.data.gen_batch_size
        if fg.enable and fg.adaptive_gen_batch:
            size = round_size(want - total_kept, state.kept_rate, size, ctx.world_size)
        indices, passed = draw_prompts(sampler, size, state.skip if skipping else None)
        skipped += passed
        prompts += len(indices)
        positions = list(range(ctx.rank, len(indices), ctx.world_size))
        params = SamplingParams(
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_tokens=cfg.data.max_response_length,
            seed=round_seed(cfg.trainer.seed, step, rounds, ctx.rank),
        )
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
        if fg.enable:
            keep: set[int] = set()
            if groups:
                metric = torch.tensor([v for g in groups for v in g.metric(fg.metric)])
                gidx = torch.repeat_interleave(
                    torch.arange(len(groups)), torch.tensor([len(g.rollouts) for g in groups])
                )
                keep = set(kept_group_ids(metric, gidx).tolist())
            kept.extend(g for i, g in enumerate(groups) if i in keep)
            filtered_tokens += sum(
                x.response_length for i, g in enumerate(groups) if i not in keep for x in g.rollouts
            )
        else:
            kept.extend(groups)
        if fg.enable and skipping:
            # a collective: a rank that drew no prompt this round (gen_batch_size < world size) joins with nothing
            outcomes = [
                (g.rollouts[0].problem_idx, sum(bool(x.acc) for x in g.rollouts), len(g.rollouts))
                for g in groups
            ]
            state.record([o for part in all_gather_objects(outcomes, ctx) for o in part], fg)
        round_kept, total_fresh = all_reduce([len(kept) - kept_before, len(kept)], ctx)
        if indices:
            rate = round_kept / len(indices)
            state.kept_rate = (
                rate
                if state.kept_rate is None
                else KEPT_RATE_MOMENTUM * state.kept_rate + (1 - KEPT_RATE_MOMENTUM) * rate
            )
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
        state.carry = [g for g in surplus if g.key[0] > 0]  # fresh surplus: next step; stale surplus: dropped
        surplus = [g for g in surplus if g.key[0] == 0]
    surplus_tokens = sum(x.response_length for g in surplus for x in g.rollouts)
    stats = _step_stats(generated, rounds, total_kept - len(carried), ctx, filtered_tokens, surplus_tokens)
    stats |= {
        "train/kept_groups": len(batch),
        "train/carried_groups": sum(g.key[0] == 0 for g in batch),
        "train/gen_prompts": prompts,
        "train/skipped_prompts": skipped,
    }
    if state.kept_rate is not None:
        stats["train/kept_rate"] = state.kept_rate
    return batch, stats | {"time/generate_s": generate_s}


def _share_groups(kept: list[PromptGroup], ctx: DistContext) -> list[PromptGroup]:
    """Every rank's kept groups, in rank order, for the batch's arithmetic: this rank's own complete, the others'
    without response tokens, log-probs and text (`owner` says who holds them; `make_train_batch` fetches the rows
    each rank trains on). One process: `kept` itself."""
    if not ctx.distributed:
        return list(kept)
    light = [
        replace(g, rollouts=[replace(x.light(), prompt_ids=x.prompt_ids) for x in g.rollouts]) for g in kept
    ]
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
    """Means over every response generated in the step, on all ranks; a step that generated nothing (its batch all
    carried groups) logs only the counts (`_STEP_COUNTS`), so curves and CAMPO's saturation window see no zeros.

    `filtered_tokens` (this rank's response tokens in groups the filter dropped) and `surplus_tokens` (tokens of
    kept groups dropped for lack of room, the same count on every rank) give `train/gen_tokens_wasted_ratio`: the
    share of the step's generated response tokens that no update sees. `train/token_prob_mean` is the mean sampling probability of the generated
    tokens (`exp` of the engine's log-probs; DAPO Fig. 7's "mean probability"), `train/all_correct_group_ratio`
    and `train/all_wrong_group_ratio` the share of groups whose responses were all right / all wrong (Fig. 3b).
    """
    rs = [x for g in generated for x in g.rollouts]
    lps = [lp for x in rs for lp in x.logprobs]
    sums = all_reduce(
        [
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
            filtered_tokens,
        ],
        ctx,
    )
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
        filtered,
    ) = sums
    longest = all_reduce([max((x.response_length for x in rs), default=0)], ctx, op="max")[0]
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


def _fetch_rows(
    groups: list[PromptGroup],
    rollouts: list[Rollout],
    lengths: list[int],
    rows: list[int],
    order,
    minibatch_size: int,
    ctx: DistContext,
) -> list[Rollout]:
    """The rollouts of this rank's `rows` (indices into the batch's flattened rollouts), complete: rows another
    rank sampled (`PromptGroup.owner`) come from it through one object all-to-all, in which every rank sends each
    other rank only the rows that rank trains on (each rank works out every rank's rows with the same
    `shard_minibatches` call as `make_train_batch`, over its flattened `rollouts` and their `lengths`)."""
    owners = [g.owner for g in groups for _ in g.rollouts]
    if not ctx.distributed or all(o < 0 for o in owners):
        return [rollouts[i] for i in rows]
    send: list[list[tuple[int, list[int], list[float]]]] = [[] for _ in range(ctx.world_size)]
    for r in range(ctx.world_size):
        if r == ctx.rank:
            continue
        theirs, _ = shard_minibatches(lengths, minibatch_size, ctx.world_size, r, order)
        send[r] = [
            (i, rollouts[i].response_ids, rollouts[i].logprobs) for i in theirs if owners[i] == ctx.rank
        ]
    got = {i: (ids, lps) for part in all_to_all_objects(send, ctx) for i, ids, lps in part}
    out = []
    for i in rows:
        x = rollouts[i]
        if owners[i] != ctx.rank:
            ids, lps = got[i]
            x = replace(x, response_ids=ids, logprobs=lps)
        out.append(x)
    return out


def make_train_batch(
    groups: list[PromptGroup], cfg: Config, pad_id: int, step: int, ctx: DistContext | None = None
) -> TrainBatch:
    """Advantages of the shaped scores (`algorithm.adv_estimator`, per group) and this rank's rows of the batch.

    The batch (optionally shuffled by a per-step seeded permutation, the same on every rank) is cut into
    mini-batches of `actor.ppo_mini_batch_size` groups' worth of sequences, as one process would cut it, and each
    mini-batch is split evenly over the ranks, balanced by token count (`shard_minibatches`).

    Args:
        groups: the step's kept groups (all ranks', in order).
        cfg: the run's configuration.
        pad_id: the tokenizer's pad id.
        step: the RL step (the shuffle's seed).
        ctx: this rank (None: one process).
    """
    ctx = ctx or DistContext()
    rollouts = [x for g in groups for x in g.rollouts]
    scores = torch.tensor([x.reward for x in rollouts])
    gidx = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g.rollouts) for g in groups]))
    estimator = get_adv_estimator(cfg.algorithm.adv_estimator)
    adv = estimator(scores, gidx, norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo)
    truncated = torch.tensor([x.truncated for x in rollouts])
    loss_mask = ~truncated if cfg.algorithm.overlong_filtering else torch.ones_like(truncated)
    order = None
    if cfg.actor.shuffle:
        order = torch.randperm(
            len(rollouts), generator=torch.Generator().manual_seed(cfg.trainer.seed + step)
        )
    lengths = [len(x.prompt_ids) + x.response_length for x in rollouts]
    mini = cfg.actor.ppo_mini_batch_size * cfg.rollout.n
    rows, minibatch = shard_minibatches(lengths, mini, ctx.world_size, ctx.rank, order)
    mine = _fetch_rows(groups, rollouts, lengths, rows, order, mini, ctx)
    stale = [g.key[0] == 0 for g in groups for _ in g.rollouts]  # carried from the previous step
    return TrainBatch.build(
        [x.prompt_ids for x in mine],
        [x.response_ids for x in mine],
        adv[rows],
        loss_mask[rows].float(),
        pad_id,
        rollout_logprobs=[x.logprobs for x in mine],
        minibatch=minibatch,
        stale=[stale[i] for i in rows] if any(stale) else None,
    )
