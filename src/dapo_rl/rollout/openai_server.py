"""A served model as an evaluation engine: any OpenAI-compatible chat-completions server (`vllm serve`, SGLang,
TGI, a hosted API), through the `openai` client, as DAPO's own AIME evaluation samples (vLLM behind Ray Serve, chat
API). `dapo eval --engine openai --base-url URL --model NAME`.

The server applies its own chat template and tokenizer, so this engine works on chat messages rather than token ids
(`generate_chat`); responses come back as text, with their token count from the returned log-probs. The `openai`
client retries connection errors, 408/409/429 and 5xx answers with exponential backoff (`max_retries`).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from dapo_rl.config import ConfigError
from dapo_rl.rollout.base import GenerationOutput, RolloutEngine, SamplingParams
from dapo_rl.rollout.seeds import request_seed


class OpenAIChatEngine(RolloutEngine):
    """Chat completions from an OpenAI-compatible server, `concurrency` requests at a time.

    Args:
        base_url: the server's API root (`http://127.0.0.1:8000/v1`).
        model: the served model's name (`/v1/models`).
        api_key: the key (None: `OPENAI_API_KEY`, else `EMPTY`, which vLLM accepts).
        concurrency: requests in flight at once (one request per prompt, `n` samples each).
        max_retries: the client's retries per request (exponential backoff).
        timeout_s: seconds per request.

    It takes chat messages (`takes_chat`, `generate_chat`), not token ids.

    Raises:
        ConfigError: the `openai` package is missing.
    """

    takes_chat = True

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        concurrency: int = 8,
        max_retries: int = 4,
        timeout_s: float = 600.0,
    ):
        try:
            import openai
        except ImportError as e:
            raise ConfigError(
                f"--engine openai needs the openai package ({e}): pip install 'dapo-rl[openai]'"
            ) from e
        self.base_url, self.model, self.concurrency = base_url, model, concurrency
        self.client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
            max_retries=max_retries,
            timeout=timeout_s,
        )

    def check(self) -> None:
        """Ask the server which models it serves, before any work.

        Raises:
            ConfigError: no server answers at `base_url` (after the client's retries), or it does not serve `model`
                (the served names listed).
        """
        import openai

        try:
            served = [m.id for m in self.client.models.list()]
        except openai.APIConnectionError as e:
            raise ConfigError(f"--base-url {self.base_url}: no server answers ({e}); is it running?") from e
        except openai.APIError as e:
            raise ConfigError(
                f"--base-url {self.base_url}: the server refused to list its models ({e})"
            ) from e
        if self.model not in served:
            raise ConfigError(
                f"--model {self.model}: the server at {self.base_url} serves {', '.join(served)}"
            )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[GenerationOutput]]:
        """Refused: the server applies its own chat template and tokenizer, so it is given chat messages
        (`generate_chat`), never token ids.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("OpenAIChatEngine takes chat messages: call generate_chat")

    def generate_chat(
        self, conversations: list[list[dict]], params: SamplingParams
    ) -> list[list[GenerationOutput]]:
        """Sample `params.n` responses to each conversation (one request each, `concurrency` at a time).

        Request i carries seed `params.seed + i * n` (`dapo_rl.rollout.seeds.request_seed`; None: unseeded), so a rerun
        with the same seeds asks for the same samples (servers such as vLLM honour per-request seeds and seed sample j
        with `seed + j`: no two samples share a seed). Each output's `token_ids` is empty; `text` is the
        response, `num_tokens` its length in the server's tokens (the returned log-probs; without them, the usage
        count of a one-sample request), `finish_reason` `length` when the server cut it at `max_tokens`.

        `params.stop` goes in the request's `stop`, with vLLM's `include_stop_str_in_output` (a server without that
        extension may leave the stop string out of the text, as OpenAI's API does); `stop_reason` is the choice's
        `stop_reason` where the server returns one (vLLM's server does), else None.

        Raises:
            ConfigError: a request failed after the retries (server down, or an error answer); the message names
                the request and what the server said.
        """
        with ThreadPoolExecutor(max(1, self.concurrency)) as pool:
            futures = [pool.submit(self._one, conv, params, i) for i, conv in enumerate(conversations)]
            return [f.result() for f in futures]

    def _one(self, messages: list[dict], params: SamplingParams, i: int) -> list[GenerationOutput]:
        import openai

        extra = {"top_k": params.top_k} if params.top_k > 0 else {}  # vLLM's extension of the API
        stop = {}
        if params.stop:  # the stop string stays in the text (vLLM's extension; OpenAI's API leaves it out)
            stop = {"stop": list(params.stop)}
            extra["include_stop_str_in_output"] = True
        try:
            resp = self.client.chat.completions.create(
                model=self.model,
                messages=messages,
                n=params.n,
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=params.max_tokens,
                seed=request_seed(params.seed, i, params.n),
                logprobs=True,
                extra_body=extra or None,
                **stop,
            )
        except openai.APIError as e:
            raise ConfigError(
                f"--base-url {self.base_url}: request for prompt {i} of this chunk failed after retries "
                f"({type(e).__name__}: {e}); finished problems are kept, rerun the same command to resume"
            ) from e
        outs = []
        for ch in sorted(resp.choices, key=lambda c: c.index):
            lps = [t.logprob for t in ch.logprobs.content] if ch.logprobs and ch.logprobs.content else []
            count = len(lps) if lps else (resp.usage.completion_tokens if resp.usage and params.n == 1 else 0)
            # vLLM's field: the stop string, a stop token id or None (other servers have none)
            reason = (ch.model_extra or {}).get("stop_reason")
            outs.append(
                GenerationOutput(
                    token_ids=[],
                    logprobs=lps,
                    finish_reason="length" if ch.finish_reason == "length" else "stop",
                    text=ch.message.content or "",
                    num_tokens=count,
                    stop_reason=reason if isinstance(reason, str) and reason in (params.stop or ()) else None,
                )
            )
        return outs

    def update_weights(self, named_tensors) -> None:
        """Refused: a served model's weights belong to its server, so this engine can evaluate but not train.

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("a served model's weights are the server's: OpenAIChatEngine evaluates only")

    def sleep(self) -> None:
        """Nothing to free: the model lives in the server."""
