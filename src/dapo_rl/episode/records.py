"""The records that flow through batch collection: one sampled response (`Rollout`) and the n responses of one
prompt (`PromptGroup`).

A response's tokens are not all the model's: a multi-turn episode appends a tool's output to it, tokens the model did
not sample. `Rollout.loss_mask` marks them (0), and this is the one place that decides what counts them:

- every response token, the model's and a tool's, fills the context that `data.max_response_length` bounds: a
  trajectory ends truncated when they reach it, and `Rollout.response_length`, `tool/context_length_mean` and the
  generated-token counts and ratios (`train/gen_tokens*`, the sequences the update computes) count them all;
- only the model's tokens (mask 1) are what the model wrote: `Rollout.model_length` counts them, and the overlong
  penalty (DAPO Eq. 13, L_max = `data.max_response_length`), `train/response_length_*` and `dapo eval`'s
  `response_length_mean` read it, so a tool's long output neither costs the model reward nor reads as the model
  growing verbose (verl's agent loop counts the tool's tokens in both);
- only the model's tokens have a sampling probability and enter the loss: `train/token_prob_mean`
  (`dapo_rl.collect.stats.GenerationSums`) and the actor's `response_mask` (`TrainBatch.build`), hence the loss's
  token mean (Eq. 12), the entropy and the clip fractions, skip the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import ClassVar

from dapo_rl.data import Sample


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
        status: `ok`, `error` (the verifier raised), `timeout` (it was killed) or `refused` (the answer was outside
            its task's answer grammar, `dapo_rl.reward.answer_grammar`); `unknown` for a generations.jsonl line
            written before the field (`from_record`).
        reward: the shaped score the advantages use: `score` + overlong penalty (Eq. 13) + repetition penalty.
        response_length: tokens in the response (kept when a record is read back without its token ids).
        model_length: the response tokens the model sampled (`loss_mask` 1; `response_length` without a mask).
        vote: the answer this response votes for in maj@k: the first answer of its problem that the verifier judges
            equivalent to `pred` (`dapo_rl.evaluate.pool_equivalent_answers`); empty: `pred` itself.
        loss_mask: per response token, 1 where the model sampled it, 0 where something else wrote it (a tool's output
            in a multi-turn episode; its `logprobs` entry is 0); None: every token is the model's (a single turn).
            See the module's docstring for what counts masked tokens.
        tool_calls: a tool episode's calls, one status each (`dapo_rl.episode.tool.TOOL_STATUSES`), in order; None:
            no tool (a single-turn episode).
        tool_truncated: calls whose output was cut (the sandbox's output cap or `max_output_tokens`).
        tool_turns: a tool episode's model turns (the runs of `loss_mask` 1); 0: no tool.
        void_turn: a tool episode's trajectory with a void turn (SimpleTIR, arXiv 2509.02479: a turn with neither a
            complete code block nor a final answer): a `malformed` call, or a last turn that closed no call and
            holds no final answer ("Answer:" line or box, `dapo_rl.reward.extract.extract_final_answer`), as when
            it was cut at the length limit. A closed call (over the budget, or with no room left to run) is not
            void. Counted in `tool/void_turn_ratio`; they train as any other (SimpleTIR's filter of them did not
            help here: docs/tools.md).
        code: the code reward's outcome (`dapo_rl.reward.code.CODE_OUTCOMES`: ``pass``, ``wrong``,
            ``compile_error``, ...); empty: not scored by the code reward.
        code_hacks: the recognised hack attempts in it (`dapo_rl.reward.code.HACKS`), each failing it.
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
    loss_mask: list[int] | None = None
    tool_calls: list[str] | None = None
    tool_truncated: int = 0
    tool_turns: int = 0
    model_length: int = -1
    void_turn: bool = False
    code: str = ""
    code_hacks: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.response_length < 0:
            self.response_length = len(self.response_ids)
        if self.model_length < 0:
            self.model_length = self.response_length if self.loss_mask is None else sum(self.loss_mask)

    def model_ids(self) -> list[int]:
        """The response tokens the model sampled (`loss_mask` 1), in order: what the verifier reads."""
        if self.loss_mask is None:
            return self.response_ids
        return [t for t, m in zip(self.response_ids, self.loss_mask) if m]

    @property
    def void(self) -> bool:
        """The outcome says nothing about the policy: the sandbox failed under one of its tool calls, or under
        the code reward's programs (not the program's fault). Its group does not train
        (`dapo_rl.collect.loop.filter_groups`)."""
        return self.code == "sandbox_error" or (bool(self.tool_calls) and "sandbox_error" in self.tool_calls)

    def sampled_logprobs(self) -> list[float]:
        """The log-probs of the tokens the model sampled (`loss_mask` 1), in order."""
        if self.loss_mask is None:
            return self.logprobs
        return [lp for lp, m in zip(self.logprobs, self.loss_mask) if m]

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def to_record(self, dataset: str) -> dict:
        """The JSON line `dapo eval` writes to generations.jsonl (`tool_calls` only from a tool episode)."""
        tool = (
            {}
            if self.tool_calls is None
            else {"tool_calls": self.tool_calls, "model_length": self.model_length}
        )
        if self.code:
            tool |= {"code": self.code, "code_hacks": list(self.code_hacks)}
        return tool | {
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
            "status": self.status,
        }

    TOKEN_FIELDS: ClassVar[tuple[str, ...]] = ("response_ids", "logprobs", "loss_mask")
    """The per-token fields: what `light` drops and `tokens` sends to the rank that trains on the row."""

    LEGACY_STATE: ClassVar[tuple[str, ...]] = (
        "problem_idx", "sample_idx", "response_ids", "logprobs", "finish_reason", "text", "score", "acc", "pred",
        "status", "reward", "loss_mask",
    )  # fmt: skip
    """The positional state an asynchronous run's checkpoint held before `state` (2026-12): 11 or 12 values."""

    def light(self) -> Rollout:
        """A copy without token ids, log-probs and text: what metrics read, cheap to send to another rank."""
        return replace(self, prompt_ids=[], response_ids=[], logprobs=[], text="", loss_mask=None)

    def tokens(self) -> tuple:
        """`TOKEN_FIELDS`' values, for `with_tokens` on a light copy held by another rank."""
        return tuple(getattr(self, f) for f in self.TOKEN_FIELDS)

    def with_tokens(self, tokens: tuple) -> Rollout:
        """This (light) record with `tokens`' per-token fields (`tokens()` of the complete one)."""
        return replace(self, **dict(zip(self.TOKEN_FIELDS, tokens)))

    def state(self) -> dict:
        """The record as a checkpoint keeps it: every field but the dataset row and its prompt ids (`from_state`
        takes them from the dataset by `problem_idx`), by name, in types `torch.load(weights_only=True)` reads."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("sample", "prompt_ids")}
        for name in ("response_ids", "logprobs"):
            out[name] = list(out[name])
        return out

    @classmethod
    def from_state(cls, state: dict | list, sample: Sample, prompt_ids: list[int]) -> Rollout:
        """`state()` read back, with the dataset's `sample` and `prompt_ids` for its `problem_idx`; a positional
        list (`LEGACY_STATE`, an older checkpoint) too.

        Raises:
            TypeError: a key that is not a field of the record.
        """
        if isinstance(state, (list, tuple)):
            state = dict(zip(cls.LEGACY_STATE, state))
        return cls(sample=sample, prompt_ids=prompt_ids, **state)

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
            status=str(r.get("status", "unknown")),  # lines written before 2026-12-06 lack it
            tool_calls=r.get("tool_calls"),
            model_length=int(r.get("model_length", r["response_length"])),
            code=str(r.get("code", "")),
            code_hacks=list(r.get("code_hacks", [])),
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
    version: int = -1
    """Asynchronous training: the policy version (optimizer steps taken) whose weights the engine sampled the group
    with; -1: the current policy (the synchronous loop)."""

    def light(self) -> PromptGroup:
        """The group for another rank's batch arithmetic: its rollouts `light`, their prompts kept;
        `make_train_batch` fetches the rows a rank trains on from the group's `owner`."""
        return replace(self, rollouts=[replace(x.light(), prompt_ids=x.prompt_ids) for x in self.rollouts])

    def metric(self, name: str) -> list[float]:
        """`acc` (0/1) or the shaped `score` of each rollout."""
        return [float(r.acc) if name == "acc" else r.reward for r in self.rollouts]
