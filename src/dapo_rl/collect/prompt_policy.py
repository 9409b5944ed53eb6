"""Which prompts each generation round of dynamic sampling samples, and how many: the prompt-sampling policy.

One small interface, `PromptPolicy`, so that a new policy is one class:

- `round_size(need, gen_batch_size, world_size)`: how many prompts the next round draws;
- `draw(sampler, k)`: which, from the run's epoch order (`dapo_rl.data.EpochSampler`);
- `record(drawn, kept, outcomes)`: what the round gave (every rank calls it with the same values);
- `state_dict()` / `load_state_dict(state)`: what a checkpoint keeps (`trainer_state["dynamic_sampling"]`; the
  epoch sampler's own position is saved beside it, under `"sampler"`).

`PromptPolicy` itself is DAPO's: the epoch's next prompts, `data.gen_batch_size` a round (or sized by the running
kept-rate with `adaptive_gen_batch`). `SkipPolicy` adds `skip_solved` / `skip_unsolved` / `skip_backoff`.
`prompt_policy` builds the one `algorithm.filter_groups` asks for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from dapo_rl.config import FilterGroupsConfig
from dapo_rl.data import EpochSampler

KEPT_RATE_MOMENTUM = 0.7
"""Weight of the previous estimate in the running kept-rate (`adaptive_gen_batch`)."""

SKIP_BACKOFF_CAP = 64
"""The most a prompt's skip grows under `skip_backoff` (times `skip_solved` / `skip_unsolved`)."""


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


class PromptPolicy:
    """DAPO's prompt sampling, and the interface of every other: each round the next prompts of the epoch's order.

    It keeps the running kept-rate (logged as `train/kept_rate` in every run); with `adaptive` (`adaptive_gen_batch`)
    each round's size follows from it (`round_size`).

    Attributes:
        adaptive: size rounds from the kept-rate instead of `data.gen_batch_size` each.
        kept_rate: running share of drawn prompts whose group was kept (weight `KEPT_RATE_MOMENTUM` on the previous
            estimate); None before the first round.
    """

    needs_outcomes: ClassVar[bool] = False
    """Whether `record` wants every sampled group's outcome, which costs a gather across ranks after each round."""

    def __init__(self, adaptive: bool = False):
        self.adaptive = adaptive
        self.kept_rate: float | None = None

    def round_size(self, need: int, gen_batch_size: int, world_size: int = 1) -> int:
        """Prompts the next round draws, `need` groups still missing; the same on every rank."""
        if not self.adaptive:
            return gen_batch_size
        return round_size(need, self.kept_rate, gen_batch_size, world_size)

    def draw(self, sampler: EpochSampler, k: int) -> tuple[list[int], int]:
        """The round's `k` prompt indices (every rank draws the same and takes its share).

        Returns:
            `(indices, passed_over)`: the drawn indices and how many draws were skipped for them
            (`train/skipped_prompts`).
        """
        return sampler.next(k), 0

    def record(self, drawn: int, kept: int, outcomes: Sequence[tuple[int, int, int]] = ()) -> None:
        """Note what a round gave, on every rank alike.

        Args:
            drawn: prompts the round drew (all ranks), less those whose group the sandbox voided (their outcome
                is the sandbox's, `dapo_rl.collect.loop.is_void`).
            kept: groups of the round that dynamic sampling kept (all ranks).
            outcomes: with `needs_outcomes`, `(prompt index, correct responses, responses)` of every group sampled in
                the round on all ranks but the void ones, in rank order; otherwise empty.
        """
        if drawn:
            rate = kept / drawn
            self.kept_rate = (
                rate
                if self.kept_rate is None
                else KEPT_RATE_MOMENTUM * self.kept_rate + (1 - KEPT_RATE_MOMENTUM) * rate
            )

    def state_dict(self) -> dict:
        """JSON-safe state for a checkpoint."""
        return {"kept_rate": self.kept_rate}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict`'s state; keys it does not know (another policy's, or a removed option's in an older
        checkpoint) are ignored."""
        self.kept_rate = state.get("kept_rate")


class SkipPolicy(PromptPolicy):
    """Zero-waste skips (`skip_solved`, `skip_unsolved`, `skip_backoff`): a prompt whose group came out all correct
    (all wrong) is passed over on its next `skip_solved` (`skip_unsolved`) draws, then sampled again; with `backoff`
    the skip doubles with each further such group in a row (at most `SKIP_BACKOFF_CAP` times it), and a kept group
    clears the prompt's record.

    Attributes:
        skip: prompt index -> how many more of its draws to pass over.
        streak: prompt index -> its groups in a row that were all correct or all wrong.
    """

    needs_outcomes: ClassVar[bool] = True

    def __init__(
        self, skip_solved: int = 0, skip_unsolved: int = 0, backoff: bool = False, adaptive: bool = False
    ):
        super().__init__(adaptive)
        self.skip_solved, self.skip_unsolved, self.backoff = skip_solved, skip_unsolved, backoff
        self.skip: dict[int, int] = {}
        self.streak: dict[int, int] = {}

    def draw(self, sampler: EpochSampler, k: int) -> tuple[list[int], int]:
        """The next `k` prompt indices, passing over prompts with skips left (each pass uses one up).

        At most one epoch's worth of prompts is looked at; if that leaves fewer than `k` (nearly every prompt
        solved), the round is topped up with the next draws regardless of their skips (re-checked early).
        """
        if not self.skip:
            return sampler.next(k), 0
        out: list[int] = []
        looked = skipped = 0
        while len(out) < k and looked < sampler.size:
            for i in sampler.next(min(k - len(out), sampler.size - looked)):
                looked += 1
                left = self.skip.get(i, 0)
                if left > 0:
                    skipped += 1
                    if left > 1:
                        self.skip[i] = left - 1
                    else:
                        del self.skip[i]
                else:
                    out.append(i)
        if len(out) < k:
            out.extend(sampler.next(k - len(out)))
        return out, skipped

    def record(self, drawn: int, kept: int, outcomes: Sequence[tuple[int, int, int]] = ()) -> None:
        super().record(drawn, kept, outcomes)
        for i, correct, n in outcomes:
            solved = True if correct == n else False if correct == 0 else None
            if solved is None:  # a kept group clears the prompt's record
                self.streak.pop(i, None)
                continue
            base = self.skip_solved if solved else self.skip_unsolved
            if base == 0:
                self.streak.pop(i, None)
                continue
            run = self.streak.get(i, 0) + 1
            self.streak[i] = run
            self.skip[i] = base * min(2 ** (run - 1), SKIP_BACKOFF_CAP) if self.backoff else base

    def state_dict(self) -> dict:
        return super().state_dict() | {
            "skip": {str(k): v for k, v in sorted(self.skip.items())},
            "streak": {str(k): v for k, v in sorted(self.streak.items())},
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.skip = {int(k): int(v) for k, v in (state.get("skip") or {}).items()}
        self.streak = {int(k): int(v) for k, v in (state.get("streak") or {}).items()}


def prompt_policy(fg: FilterGroupsConfig) -> PromptPolicy:
    """The prompt-sampling policy `algorithm.filter_groups` asks for: `SkipPolicy` when dynamic sampling is on
    with `skip_solved` or `skip_unsolved` > 0, else `PromptPolicy` (adaptive rounds only with dynamic sampling on).
    """
    adaptive = fg.enable and fg.adaptive_gen_batch
    if fg.enable and (fg.skip_solved > 0 or fg.skip_unsolved > 0):
        return SkipPolicy(fg.skip_solved, fg.skip_unsolved, fg.skip_backoff, adaptive)
    return PromptPolicy(adaptive)
