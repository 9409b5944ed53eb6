"""The rollout-engine base class: the seam where transformers, vLLM, a served model or a Ray-backed group of engines
plug in. Every engine subclasses `RolloutEngine`; what an engine does not need keeps the documented default, so
callers call every method on every engine and never probe for one."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

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
        stop: strings that end a response once its text contains one (vLLM's `stop`, matched in the decoded response,
            special tokens skipped): the response ends with the token that completes the first one to appear, that
            token included, so the stop string stays in the response (vLLM's `include_stop_str_in_output=True`: a
            tool loop needs the closing tag). None or empty: responses end at eos or `max_tokens` only. One string
            is taken as a list of one, as vLLM takes it. The transformers engine decodes the response alone, vLLM
            with the prompt before it: with a SentencePiece tokenizer whose decoder drops a leading space, a stop
            string starting with a space can match at a response's very first token in vLLM and not in hf.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    seed: int | None = None
    stop: list[str] | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):  # not one stop string per character
            self.stop = [self.stop]


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
        finish_reason: `stop` (eos emitted, or a stop string reached) or `length` (hit `max_tokens`: truncated).
        text: the decoded response when the engine returns text, not token ids (a served model,
            `OpenAIChatEngine`); None: decode `token_ids`.
        num_tokens: the response's length in tokens when `token_ids` is empty (a served model's count).
        stop_reason: the string of `SamplingParams.stop` that ended the response (finish_reason `stop`); None when
            it ended at eos or at `max_tokens`.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str | None = None
    num_tokens: int | None = None
    stop_reason: str | None = None


class RolloutEngine(ABC):
    """What the trainer, the asynchronous producer and the evaluation need from an inference engine.

    A subclass implements `generate`; everything else has a default that suits an engine with nothing to do there
    (each method says which engines override it). An engine that takes chat messages instead of token ids (a served
    model) sets `takes_chat` and implements `generate_chat` (`OpenAIChatEngine`).
    """

    takes_chat: bool = False
    """The engine samples from chat messages (`generate_chat`), not from token ids: the server applies the chat
    template and the tokenizer (`OpenAIChatEngine`)."""

    collective: bool = False
    """Every rank of a group must call `generate` together, with an empty prompt list when it has nothing to sample
    (vLLM under a tensor-parallel group overrides it)."""

    @abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[GenerationOutput]]:
        """Sample `params.n` responses for each prompt; returns one list of n outputs per prompt, in order.

        Prompt i of the call draws from `dapo_rl.rollout.seeds.request_seed(params.seed, i, params.n)` (vLLM and a
        served model seed each request so; the transformers engine seeds each micro-batch with its first prompt's),
        so prompts split over several engines draw what one engine draws (`RemoteEngines.generate`). `params.stop`
        ends a response as `SamplingParams` says, with `stop_reason` set."""

    def generate_chat(
        self, conversations: list[list[dict]], params: SamplingParams
    ) -> list[list[GenerationOutput]]:
        """Sample `params.n` responses for each conversation (a list of `{"role", "content"}` messages), for an engine
        with `takes_chat`; outputs carry `text` and `num_tokens` and no token ids.

        Raises:
            NotImplementedError: the engine takes token ids (`generate`).
        """
        raise NotImplementedError(f"{type(self).__name__} takes token ids: call generate")

    def generate_chunks(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> Iterator[list[list[GenerationOutput]]]:
        """`generate` in consecutive parts, each yielded as soon as it is sampled (the caller scores one part while
        the next is generated, `reward.overlap`); the parts together are exactly `generate`'s result. Default: the
        whole round as one part (the transformers and vLLM engines yield micro-batches)."""
        yield self.generate(prompts, params)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new policy weights (HF parameter names, one tensor at a time) before the next `generate`; wakes a
        sleeping engine. The iterator must be consumed to its end (under FSDP2 it is a collective). Default:
        refused, for an engine that can evaluate but not train.

        Raises:
            NotImplementedError: the engine takes no weights.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot take new weights: it can evaluate, not train"
        )

    def check_weight_names(self, names: Iterable[str]) -> None:  # noqa: B027 (a no-op default, on purpose)
        """Check, before the first push, that the names `update_weights` will receive fill the engine's parameters
        one to one. Default: nothing to check (the transformers engine matches names as it copies; vLLM and the
        engine processes override it).

        Raises:
            ValueError: names the engine cannot take, listed.
        """

    def sleep(self) -> None:  # noqa: B027 (a no-op default, on purpose)
        """Free what the engine can while the actor trains (vLLM's sleep mode on GPUs). Default: nothing to free."""

    def close(self) -> None:  # noqa: B027 (a no-op default, on purpose)
        """Release the engine (vLLM's teardown, the engine processes). Idempotent. Default: nothing to release."""

    def abort(self) -> None:  # noqa: B027 (a no-op default, on purpose)
        """Stop the `generate` in flight, from another thread: it raises `GenerationAborted` (the engine processes,
        `RemoteEngine`). Default: nothing to stop (the round finishes)."""

    def clear_abort(self) -> None:  # noqa: B027 (a no-op default, on purpose)
        """Withdraw an `abort` the engine has not acted on yet. Default: nothing to withdraw."""

    @property
    def engines(self) -> list[RolloutEngine]:
        """The engine's members that sample on their own, for a caller that must reach each one (the weight-sync
        probe): `RemoteEngines`' processes; default `[self]`."""
        return [self]
