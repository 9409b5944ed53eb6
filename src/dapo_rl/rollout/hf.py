"""Rollouts through transformers' `generate`: the portable engine that runs on any CPU or GPU."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import torch

from dapo_rl.rollout.base import GenerationAborted, GenerationOutput, RolloutEngine, SamplingParams
from dapo_rl.rollout.seeds import request_seed


class _SampledLogprobs:
    """A logits processor that keeps, per sequence, the log-prob of each sampled token under softmax(raw logits /
    temperature), holding one step's (B, V) log-softmax at a time (review async-lora m7: transformers'
    ``output_logits=True`` keeps every step's (B, V) logits, B·L·V·4 bytes, an out-of-memory at real vocabularies).

    transformers calls it at each step with the scores of the next token, before its own temperature, top-k and top-p
    processors (a processor passed to `generate` comes before those, ``GenerationMixin._get_logits_processor``); the
    token sampled at step i is the last of ``input_ids`` at step i + 1, and the last step's is taken by `finish`.

    Args:
        temperature: the request's temperature (0: greedy, log-probs of the raw softmax).
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.steps: list[torch.Tensor] = []
        self._last: torch.Tensor | None = None

    def _take(self, tokens: torch.Tensor) -> None:
        if self._last is not None:
            self.steps.append(self._last.gather(-1, tokens[:, None]).squeeze(-1))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._take(input_ids[:, -1])
        logits = scores.float() if self.temperature == 0 else scores.float() / self.temperature
        self._last = torch.log_softmax(logits, dim=-1)
        return scores

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """The (B, L) log-probs of `generated` (B, L), the sampled tokens."""
        self._take(generated[:, -1])
        self._last = None
        return torch.stack(self.steps, dim=1)


class _StopOnEvent:
    """A stopping criterion that ends every sequence once `event` is set (`HFRolloutEngine.abort_event`)."""

    def __init__(self, event):
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        return torch.full(
            (input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device
        )


def first_stop(text: str, stops: list[str]) -> str | None:
    """The stop string whose first occurrence in `text` ends earliest (ties: the first in `stops`), or None; vLLM's
    choice (`vllm/v1/engine/detokenizer.py`, `check_stop_strings`)."""
    best, best_end = None, len(text) + 1
    for s in stops:
        i = text.find(s)
        if i >= 0 and i + len(s) < best_end:
            best, best_end = s, i + len(s)
    return best


class _StopOnStrings:
    """A stopping criterion that ends each sequence, on its own, once its response's decoded text contains one of
    `stops` (the rest of the batch goes on; transformers fills a finished row with padding).

    transformers' `StopStringCriteria` proposes (tensor operations over each row's last tokens, no decoding; it
    returns one flag per row), reading the response alone and only its last `maximum_token_len` columns (what it
    reads itself, `stopping_criteria.py`): the prompt is sliced off, and special tokens (eos, padding) are replaced by
    an id it clamps to its "no match" entry, so a stop string neither straddles the prompt nor matches a special
    token's name. Each step costs O(batch x the longest stop string's tokens), not O(batch x response). A proposed row is confirmed by decoding its response (`skip_special_tokens`, as the scorer
    and vLLM decode) and looking for the stop strings there, so the stop is exactly the text's; that decode runs only
    on the steps where a row was proposed.

    Args:
        matcher: a `StopStringCriteria` for `stops`, or None where the tokenizer cannot build one (then nothing stops
            early; `HFRolloutEngine` still cuts each response at its first stop string).
        tokenizer: decodes a proposed row.
        stops: the stop strings.
        width: the prompt columns of the batch (left padded): the response starts there.
        special: the token ids that never take part in a stop string (1-D tensor).
    """

    # above every vocabulary: StopStringCriteria clamps it to its entry that matches nothing
    _NO_MATCH = 2**31 - 1

    def __init__(self, matcher, tokenizer, stops: list[str], width: int, special: torch.Tensor):
        self.matcher, self.tokenizer, self.stops = matcher, tokenizer, stops
        self.width, self.special = width, special
        self.stopped_at: dict[int, int] = {}
        """Row -> the response's length in tokens when its stop string was confirmed."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        if self.special.device != input_ids.device:  # once: not a host copy each step
            self.special = self.special.to(input_ids.device)
        tail = input_ids[:, max(self.width, input_ids.shape[1] - self.matcher.maximum_token_len) :]
        hit = self.matcher(tail.masked_fill(torch.isin(tail, self.special), self._NO_MATCH), scores)
        if not bool(hit.any()):
            return hit
        gen = input_ids[:, self.width :]  # a proposed row is confirmed on its whole response
        for row in hit.nonzero().flatten().tolist():
            text = self.tokenizer.decode(gen[row].tolist(), skip_special_tokens=True)
            if row in self.stopped_at or first_stop(text, self.stops) is None:
                hit[row] = False
            else:
                self.stopped_at[row] = gen.shape[1]
        return hit


def _check_abort(event) -> None:
    """Raise `GenerationAborted` (clearing `event`) when `event` is set."""
    if event is not None and event.is_set():
        event.clear()
        raise GenerationAborted("generation aborted")


class HFRolloutEngine(RolloutEngine):
    """Sampling with `model.generate` on the engine's own copy of the policy, on that model's device.

    It samples exactly the distribution it reports: softmax(logits / temperature), cut only by the request's
    top-k/top-p. The checkpoint's `generation_config.json` is set aside when the engine is built (transformers 5
    fills every generation field a request leaves unset from it, so a checkpoint's `repetition_penalty`, `min_p`,
    `no_repeat_ngram_size` and the like would reshape what is sampled while the log-probs stay the plain softmax's);
    only its eos ids are kept: a response stops at the tokenizer's eos or at any eos id of the checkpoint, as vLLM
    stops (its `generation_config` eos ids join the stop tokens).

    Args:
        model: a transformers causal LM the engine owns (the factory loads one for it; the trainer pushes new
            weights with `update_weights`, as it would to a separate inference engine). Its `generation_config`
            is replaced by a default `GenerationConfig()`.
        tokenizer: provides `eos_token_id` and `pad_token_id`; decodes responses for `SamplingParams.stop`.
        micro_batch_size: sequences (prompts x n) generated together; bounds memory.
        lora: the actor's `LoraConfig` when the engine applies the actor's adapters unmerged (`actor.lora.merge=
            false`): the model is wrapped by PEFT as the actor's is (`dapo_rl.lora.wrap_engine_model`), and
            `update_weights` takes the adapters alone (review async-lora M2). None: a plain model.

    Raises:
        ValueError: the tokenizer has no eos token.
        ConfigError: `lora` names modules the model lacks or ties (`dapo_rl.lora.wrap_model`).
    """

    def __init__(self, model, tokenizer, micro_batch_size: int = 512, lora=None):
        from transformers import GenerationConfig

        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token: responses could never stop")
        self.model = model.eval()
        self.eos_id = int(tokenizer.eos_token_id)
        ckpt_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if ckpt_eos is None:
            ckpt_eos = []
        elif isinstance(ckpt_eos, int):
            ckpt_eos = [ckpt_eos]
        self.eos_ids: list[int] = [self.eos_id] + sorted({int(e) for e in ckpt_eos} - {self.eos_id})
        """Token ids that end a response: the tokenizer's eos first, then the checkpoint's other eos ids."""
        self.model.generation_config = GenerationConfig()  # nothing inherited but what each request sets
        self.pad_id = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        self.micro_batch_size = micro_batch_size
        self.tokenizer = tokenizer
        self._special = torch.tensor(
            sorted({*tokenizer.all_special_ids, *self.eos_ids, self.pad_id}), dtype=torch.long
        )
        self._stop_matchers: dict[tuple[str, ...], object] = {}
        """transformers' `StopStringCriteria` of each `stop` list asked (None: refused), the last 8."""
        self.abort_event = None
        """An `Event` (threading or multiprocessing) whose setting stops the `generate` in flight with
        `GenerationAborted` (the asynchronous engine process sets it up); None: never aborted."""
        self.peft = None
        """The PEFT model the engine samples when it holds adapters (then `self.model` is it too)."""
        if lora is not None and lora.rank > 0:
            from dapo_rl.lora import wrap_engine_model

            self.model = self.peft = wrap_engine_model(self.model, lora)

    def sleep(self) -> None:
        """Nothing to free: the transformers engine holds only its weights."""

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy new weights into the engine's model in place: Hugging Face names of the model's weights, or, on an
        engine built with `lora`, the adapters alone under PEFT's file names (`Actor.engine_adapters`), all of them.

        Raises:
            ValueError: adapters pushed to an engine built without `lora`, or a push that does not name exactly the
                engine's adapters (`dapo_rl.lora.load_adapter_weights`).
        """
        from dapo_rl.lora import hf_name, is_adapter_name, load_adapter_weights

        it = iter(named_tensors)
        first = next(it, None)
        if first is None:
            return
        stream = itertools.chain([first], it)
        if is_adapter_name(first[0]):
            if self.peft is None:
                raise ValueError("LoRA adapters pushed to a transformers engine built without actor.lora")
            load_adapter_weights(self.peft, stream)
            return
        base = self.model if self.peft is None else self.peft.get_base_model()
        params = {hf_name(n): p for n, p in base.named_parameters() if not is_adapter_name(n)}
        params.update({hf_name(n): b for n, b in base.named_buffers()})
        for name, tensor in stream:
            if name in params:
                params[name].copy_(tensor)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[GenerationOutput]]:
        """Sample `params.n` responses per prompt.

        Args:
            prompts: token ids of each prompt (no padding).
            params: sampling parameters; `temperature == 0` is greedy.

        Returns:
            For each prompt, `n` `GenerationOutput`s whose log-probs are those of the temperature-scaled
            distribution before top-k/top-p (vLLM's `processed_logprobs` are after them: with top-k/top-p the
            two differ, `dapo_rl.algo.rollout_correction.truncated_sampling_bias`). Raises `GenerationAborted`
            when `abort_event` is set during the call.

        With `params.stop`, a response ends with the token that completes the first stop string to appear in its
        decoded text (`skip_special_tokens`; the prompt's text does not count): that row stops generating (the
        others go on), and its output is cut after that token, with `finish_reason` `stop` and that `stop_reason`.
        Without it, no decoding happens during generation.

        Raises:
            ValueError: an empty stop string (as vLLM).
        """
        return [group for chunk in self.generate_chunks(prompts, params) for group in chunk]

    def generate_chunks(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> Iterator[list[list[GenerationOutput]]]:
        """`generate`, one micro-batch (`micro_batch_size // n` prompts) at a time: each chunk's groups are
        yielded as soon as they are sampled, so the caller can score them while the next chunk is generated. The
        concatenated chunks are exactly `generate`'s result.

        With a seed, the chunk whose first prompt is prompt `a` of the call is sampled from torch's generator seeded
        with `request_seed(params.seed, a, n)` (`dapo_rl.rollout.seeds`; `params.seed` itself for the first chunk):
        what a chunk draws depends on where it starts, not on the chunks sampled before it, so the prompts split
        over several engines at chunk boundaries draw exactly what one engine draws (`RemoteEngines.generate`;
        every boundary when `micro_batch_size <= n`, one prompt a chunk, as vLLM seeds each request)."""
        from transformers import GenerationConfig

        greedy = params.temperature == 0
        gen_cfg = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            # explicit "off" values: None would fall back to transformers' defaults (top_k=50), which truncates
            # the sampling distribution that the log-probs below (full softmax) claim to describe
            top_p=None if greedy else min(params.top_p, 1.0),
            top_k=None if greedy else max(params.top_k, 0),
            max_new_tokens=params.max_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
        )
        stops = list(params.stop or [])
        if any(not s for s in stops):
            raise ValueError("stop cannot contain an empty string")
        matcher = self._stop_matcher(stops) if stops else None
        n = params.n
        per_chunk = max(1, self.micro_batch_size // n)
        device = next(self.model.parameters()).device
        for start in range(0, len(prompts), per_chunk):
            if params.seed is not None:
                torch.manual_seed(request_seed(params.seed, start, n))
            results: list[list[GenerationOutput]] = []
            chunk = prompts[start : start + per_chunk]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, p in enumerate(chunk):  # left padding
                ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
                mask[i, width - len(p) :] = 1
            ids = ids.repeat_interleave(n, dim=0).to(device)
            mask = mask.repeat_interleave(n, dim=0).to(device)
            # each step's sampled-token log-prob, taken on the model's device as it is sampled: never a (B, L, V)
            # stack of logits, nor a copy of one in host memory
            keep = _SampledLogprobs(0.0 if greedy else params.temperature)
            abort = self.abort_event
            criteria = [_StopOnEvent(abort)] if abort is not None else []
            on_stop = None
            if matcher is not None:
                on_stop = _StopOnStrings(matcher, self.tokenizer, stops, width, self._special)
                criteria.append(on_stop)
            _check_abort(abort)
            with torch.no_grad():  # not around the yield: grad mode is thread state the caller would inherit
                out = self.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    generation_config=gen_cfg,
                    logits_processor=[keep],
                    stopping_criteria=criteria or None,
                )
            _check_abort(abort)
            gen_dev = out.sequences[:, width:]
            logp = keep.finish(gen_dev).cpu()  # (B, L)
            gen = gen_dev.cpu()
            del out, gen_dev
            is_eos = torch.isin(gen, torch.tensor(self.eos_ids))
            any_eos = is_eos.any(dim=1)
            first_eos = torch.where(
                any_eos, is_eos.int().argmax(dim=1), torch.full_like(any_eos, gen.shape[1], dtype=torch.long)
            )
            for i in range(len(chunk)):
                group = []
                for j in range(n):
                    row = i * n + j
                    stop = bool(any_eos[row])
                    length = int(first_eos[row]) + 1 if stop else gen.shape[1]
                    reason = None
                    if stops:  # a stopped row's padding may read as eos: its own length comes first
                        if on_stop is not None and row in on_stop.stopped_at:
                            length = on_stop.stopped_at[row]
                        cut = self._cut_at_stop(gen[row, :length].tolist(), stops)
                        if cut is not None:
                            (length, reason), stop = cut, True
                    group.append(
                        GenerationOutput(
                            token_ids=gen[row, :length].tolist(),
                            logprobs=logp[row, :length].tolist(),
                            finish_reason="stop" if stop else "length",
                            stop_reason=reason,
                        )
                    )
                results.append(group)
            yield results

    def _stop_matcher(self, stops: list[str]):
        """transformers' `StopStringCriteria` for `stops` (built once per list: it scans the vocabulary), or None
        where it refuses the tokenizer or a string (responses are then cut after generation, with no early stop)."""
        key = tuple(stops)
        if key not in self._stop_matchers:
            from transformers import StopStringCriteria

            try:
                self._stop_matchers[key] = StopStringCriteria(self.tokenizer, stops)
            except Exception:  # noqa: BLE001 (no tokens spell a string, or a tokenizer it cannot read: cut after)
                self._stop_matchers[key] = None
            if len(self._stop_matchers) > 8:
                self._stop_matchers.pop(next(iter(self._stop_matchers)))
        return self._stop_matchers[key]

    def _cut_at_stop(self, ids: list[int], stops: list[str]) -> tuple[int, str] | None:
        """`(k, s)`: the shortest prefix `ids[:k]` whose decoded text contains a stop string, and the one that ends
        first there (`first_stop`); None when the whole response contains none. A binary search over prefix lengths:
        a longer prefix's text extends a shorter one's."""

        def found(k: int) -> str | None:
            return first_stop(self.tokenizer.decode(ids[:k], skip_special_tokens=True), stops)

        whole = found(len(ids))
        if whole is None:
            return None
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if found(mid) is None:
                lo = mid + 1
            else:
                hi = mid
        return hi, whole if hi == len(ids) else found(hi)
