"""The single-turn episode (DAPO's): one generation round, prompts -> engine -> responses -> verifier -> shaping, as
unscored and then scored `Rollout`s grouped by prompt (`SingleTurn`, built by `dapo_rl.episode.build_episode`).
Training, validation and `dapo eval` sample and score through it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass

import torch

from dapo_rl.algo import overlong_penalty
from dapo_rl.config import OverlongBufferConfig, RepetitionPenaltyConfig
from dapo_rl.data import PromptDataset
from dapo_rl.episode.base import Episode, register_episode
from dapo_rl.episode.records import Rollout
from dapo_rl.reward.shaping import repetition_penalty
from dapo_rl.rollout import SamplingParams


@dataclass
class Scorer:
    """Decodes responses, scores them through the reward pool, and shapes the scores.

    Attributes:
        tokenizer: decodes token ids (special tokens skipped); None when every rollout comes with its text.
        pool: `dapo_rl.reward.pool.RewardPool`.
        overlong: the overlong buffer (Eq. 13), or None for none.
        repetition: MiroMind-M1's repetition penalty, or None for none.
        log: where the first verifier error of the run is reported (once; later ones only count in
            `reward/error_rate`), or None.
        model_only: see the field.
    """

    tokenizer: object
    pool: object
    _: KW_ONLY
    overlong: OverlongBufferConfig | None = None
    repetition: RepetitionPenaltyConfig | None = None
    log: Callable[[str], None] | None = None
    model_only: bool = False
    """The verifier reads only the tokens the model sampled (`Rollout.model_ids`: a tool's output left out, as a
    tool episode needs); `text` still holds the whole response. False: the whole response."""
    _reported: bool = False
    seconds: float = 0.0
    """Wall-clock seconds spent in the reward pool so far (`time/score_s` is its growth over a step)."""

    def __call__(self, rollouts: Sequence[Rollout], max_tokens: int = 0) -> None:
        """Fill `text`, `score`, `acc`, `pred`, `status` and `reward` of each rollout, in one pool call.

        Args:
            rollouts: one round's responses (or a chunk of it).
            max_tokens: the round's response limit (`SamplingParams.max_tokens`), L_max of the overlong penalty
                (Eq. 13): under CAMPO the current stage's.

        Raises:
            ValueError: the overlong buffer is on and `max_tokens` is not given.
        """
        shaped = self.overlong is not None and self.overlong.enable
        if shaped and max_tokens <= 0:  # before the pool call, not after it
            raise ValueError("the overlong penalty needs the round's max_tokens (L_max of Eq. 13)")
        if not rollouts:
            return
        # a served model's responses arrive as text (no token ids); the others are decoded here. With `model_only`
        # the verifier reads the model's own tokens (a tool's output left out) and `text` keeps the whole response.
        only = self.model_only
        coded = [r.model_ids() if only else r.response_ids for r in rollouts if r.response_ids]
        decoded = iter(self.tokenizer.batch_decode(coded, skip_special_tokens=True) if coded else [])
        texts = [next(decoded) if r.response_ids else r.text for r in rollouts]
        mixed = [r.response_ids for r in rollouts if only and r.response_ids]
        whole = iter(self.tokenizer.batch_decode(mixed, skip_special_tokens=True) if mixed else [])
        items = [
            (r.sample.data_source, t, r.sample.ground_truth, r.sample.extra_info)
            for r, t in zip(rollouts, texts)
        ]
        t0 = time.perf_counter()
        results = self.pool.score(items)
        self.seconds += time.perf_counter() - t0
        for r, t, res in zip(rollouts, texts, results):
            r.text, r.score, r.acc, r.pred = (
                next(whole) if only and r.response_ids else t,
                float(res["score"]),
                bool(res["acc"]),
                str(res.get("pred", "")),
            )
            r.status = (
                "timeout"
                if res.get("timeout")
                else "error"
                if "error" in res
                else "refused"
                if res.get("refused")
                else "ok"
            )
            code = res.get("code")
            if isinstance(code, dict):  # the code reward's outcome and recognised hack attempts
                r.code, r.code_hacks = str(code.get("outcome", "")), [str(h) for h in code.get("hacks", [])]
            r.reward = r.score
            if r.status == "error" and self.log is not None and not self._reported:
                self._reported = True
                self.log(
                    f"reward: a response could not be scored and counts as wrong ({res['error']}); further errors "
                    "are counted, not printed (training: reward/error_rate; dapo eval: error_rate)"
                )
        if shaped:
            pen = overlong_penalty(
                torch.tensor([r.model_length for r in rollouts]),
                max_tokens,
                self.overlong.len,
                self.overlong.penalty_factor,
            )
            for r, p in zip(rollouts, pen.tolist()):
                r.reward += p
        rp = self.repetition
        if rp is not None and rp.enable:
            for r in rollouts:
                r.reward += repetition_penalty(
                    r.model_ids() if self.model_only else r.response_ids,
                    rp.factor,
                    rp.min_repeats,
                    rp.max_period,
                    rp.min_tokens,
                )


def sample_groups(
    engine, dataset: PromptDataset, indices: Sequence[int], params: SamplingParams
) -> list[list[Rollout]]:
    """Sample `params.n` responses for each prompt `dataset[i]`, i in `indices` (unscored `Rollout`s). An engine
    that `takes_chat` (a served model) is given the chat messages instead of token ids."""
    if engine.takes_chat:
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
    """`sample_groups` then `scorer`, overlapped (`overlap`, an engine of token ids) through `generate_chunks`:
    chunk k is scored in a background thread while chunk k+1 is sampled (an engine that yields its round whole
    scores it in that thread once it is sampled). Same rollouts, same rewards, in the same order as without overlap;
    `scorer.seconds` then counts scoring time that ran alongside generation.

    Returns:
        `(groups, generate_seconds)`: the scored groups and the wall time spent inside the engine.
    """
    if not overlap or engine.takes_chat:
        t0 = time.perf_counter()
        sampled = sample_groups(engine, dataset, indices, params)
        gen_s = time.perf_counter() - t0
        scorer([x for g in sampled for x in g], params.max_tokens)
        return sampled, gen_s
    from concurrent.futures import ThreadPoolExecutor

    sampled: list[list[Rollout]] = []
    gen_s = 0.0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dapo-score") as pool:
        futures = []
        stream = engine.generate_chunks([dataset.prompt_ids[i] for i in indices], params)
        while True:
            t0 = time.perf_counter()
            outs = next(stream, None)
            gen_s += time.perf_counter() - t0
            if outs is None:
                break
            part = _rollouts(dataset, indices[len(sampled) : len(sampled) + len(outs)], outs)
            sampled.extend(part)
            futures.append(pool.submit(scorer, [x for g in part for x in g], params.max_tokens))
        for f in futures:
            f.result()
    return sampled, gen_s


@register_episode
@dataclass
class SingleTurn(Episode):
    """DAPO's episode: one response per sample, scored by the verifier, shaped (overlong penalty, repetition
    penalty); every response token is the model's (`Rollout.loss_mask` None).

    Attributes:
        scorer: the verifier (through its reward pool) and the shaping.
        owns_pool: `close` closes the reward pool (False for `unshaped`'s view of a pool another episode owns).
    """

    name = "single_turn"
    scorer: Scorer
    owns_pool: bool = True

    @classmethod
    def build(cls, cfg, tokenizer, pool, log: Callable[[str], None] | None = None) -> SingleTurn:
        """The episode of a run's config: its reward pool, `algorithm.overlong_buffer` and
        `reward.repetition_penalty` (`build_episode`)."""
        return cls(
            Scorer(
                tokenizer,
                pool,
                overlong=cfg.algorithm.overlong_buffer,
                repetition=cfg.reward.repetition_penalty,
                log=log,
            )
        )

    def sample(self, engine, dataset, indices, params, *, overlap: bool = False):
        return sample_and_score(engine, self.scorer, dataset, indices, params, overlap)

    def unshaped(self) -> SingleTurn:
        return SingleTurn(
            Scorer(self.scorer.tokenizer, self.scorer.pool, log=self.scorer.log), owns_pool=False
        )

    @property
    def pool(self):
        return self.scorer.pool

    @property
    def seconds(self) -> float:
        return self.scorer.seconds

    def close(self) -> None:
        if self.owns_pool:
            self.scorer.pool.close()
