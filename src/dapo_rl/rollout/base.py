"""The rollout-engine protocol: the seam where transformers, vLLM or a Ray-backed group of engines plug in."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class SamplingParams:
    """How responses are sampled (vLLM's names).

    Attributes:
        n: responses per prompt.
        temperature: softmax temperature; 0 means greedy.
        top_p: nucleus mass in (0, 1].
        top_k: keep the k most likely tokens; -1 disables.
        max_tokens: the most response tokens (L_max), eos included.
        seed: sampling seed for this call (None: the engine's running generator).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    seed: int | None = None


class GenerationAborted(Exception):
    """A `generate` stopped early because its engine's `abort_event` was set (asynchronous training aborts the round
    in flight for a checkpoint, a validation or a stop); its partial results are discarded and the event cleared."""


@dataclass
class GenerationOutput:
    """One sampled response.

    Attributes:
        token_ids: response token ids, the eos token included when the model stopped.
        logprobs: per-token log-probability under the sampling distribution after temperature (len ==
            len(token_ids)), float; vLLM's after top-k/top-p too (its `processed_logprobs`), the transformers
            engine's before them (see `dapo_rl.algo.rollout_correction.truncated_sampling_bias`).
        finish_reason: `stop` (eos emitted) or `length` (hit `max_tokens`: truncated).
        text: the decoded response when the engine returns text, not token ids (a served model,
            `OpenAIChatEngine`); None: decode `token_ids`.
        num_tokens: the response's length in tokens when `token_ids` is empty (a served model's count).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str | None = None
    num_tokens: int | None = None


class RolloutEngine(Protocol):
    """What the trainer needs from an inference engine."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[GenerationOutput]]:
        """Sample `params.n` responses for each prompt; returns one list of n outputs per prompt, in order."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new policy weights (HF parameter names, one tensor at a time) before the next `generate`; wakes a
        sleeping engine. The iterator must be consumed to its end (under FSDP2 it is a collective)."""
        ...

    def sleep(self) -> None:
        """Free what the engine can while the actor trains (vLLM's sleep mode on GPUs; a no-op elsewhere)."""
        ...
