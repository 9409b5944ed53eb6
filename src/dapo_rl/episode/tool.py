"""Tool-integrated episodes (ReTool, arXiv 2504.11536): the model writes Python, a sandbox runs it, the output comes
back into the context, and the model goes on, for at most `episode.tool.max_calls` calls. The call and its output
are written in ReTool's tags (`ToolFormat`) or in the model's chat-template format (`dapo_rl.episode.chat_tools`).

One round is turn-synchronous over the live trajectories: turn 0 samples `n` responses per prompt in one
`generate`; every later turn samples each live trajectory once more (`n` 1) from its prompt and everything so far.
The engine stops a turn at the call's closing tag (`SamplingParams.stop`, the tag kept); the code between the last
opening tag and it is run in the sandbox (`dapo_rl.sandbox.ProgramRunner`, all the round's calls of a turn
together); the output, wrapped in the output tags and cut to `max_output_tokens`, is appended as token ids with loss
mask 0 and log-prob 0. Token in, token out: the engine's next input is exactly the prompt ids, the model's sampled
ids and the tool's ids (never a decode and re-encode of the model's tokens, which changes them: huggingface/trl
#5224, verl #6719).

The verifier reads the model's own text (its tokens, the tool's left out: `Rollout.model_ids`). Every token, the
model's and the tool's, fills the context `max_tokens` (`data.max_response_length`) bounds; the overlong penalty
counts the model's tokens only (`dapo_rl.episode.records`). A malformed call (a closing tag with no code, an empty block, a call past the budget)
gets an error message as its output, never a crash; a syntax error is the program's own error. A call the sandbox
itself failed on (`sandbox_error`, not the program's fault) leaves its trajectory `void`: its group does not train
(`dapo_rl.collect.loop.filter_groups`) and it is counted apart (`tool/sandbox_error_rate`), so an overloaded sandbox
does not teach the model that tools fail (SandboxFusion #67, verl #3478).

`Rollout.void_turn` marks SimpleTIR's void turns (`tool/void_turn_ratio`). Its filter of such trajectories and
ReTool's shaping of wrong answers by their calls were measured on tiny_python_tool and did not help (docs/tools.md,
"Shaping and filtering"); they are not options.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from dapo_rl.data.solutions import RETOOL_TAGS, tool_output_text
from dapo_rl.episode.base import Episode, register_episode
from dapo_rl.episode.records import Rollout
from dapo_rl.episode.single_turn import Scorer
from dapo_rl.reward.extract import extract_final_answer
from dapo_rl.rollout.seeds import turn_seed

TOOL_STATUSES = ("ok", "error", "timeout", "killed", "sandbox_error", "malformed", "over_budget")
"""What one call came to (`Rollout.tool_calls`): the sandbox's statuses (`dapo_rl.sandbox.ProgramResult.status`),
`malformed` (no code between the tags, or an empty block: not run) and `over_budget` (a call after `max_calls`: not
run)."""

CUT_MARK = "\n...\n"
"""What stands where the middle of a long output was cut."""

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_+-]*[ \t]*\n?(.*?)\n?[ \t]*```\s*$", re.S)


@dataclass(frozen=True)
class ToolFormat:
    """The tags of a call and of its output (ReTool's by default).

    Attributes:
        call_start: opens the code (`<code>`); a fenced block inside it (```python ... ```) is unwrapped.
        call_end: closes it; the engine stops there.
        output_start: opens the tool's output (`<interpreter>`).
        output_end: closes it.
    """

    call_start: str = RETOOL_TAGS[0]
    call_end: str = RETOOL_TAGS[1]
    output_start: str = RETOOL_TAGS[2]
    output_end: str = RETOOL_TAGS[3]
    output_head: str | None = None
    """The text before an output (None: `tool_output_text`'s, from `output_start`); a chat template's
    (`dapo_rl.episode.chat_tools.chat_tool_format`) closes the model's turn and opens the tool's."""
    output_tail: str | None = None
    """The text after an output (None: `tool_output_text`'s, from `output_end`)."""
    json_calls: bool = False
    """The call is Hermes-style JSON naming the tool (`dapo_rl.episode.chat_tools.parse_call`), not bare code."""

    def around_output(self) -> tuple[str, str]:
        """`(head, tail)`: the texts the episode appends before and after a call's output."""
        if self.output_head is not None and self.output_tail is not None:
            return self.output_head, self.output_tail
        head, tail = tool_output_text("\0", self.output_start, self.output_end).split("\0")
        return head, tail


def tag_ids(tokenizer, fmt: ToolFormat) -> tuple[list[int], list[int], list[int]]:
    """Token ids of the texts the episode appends around a call's output (`ToolFormat.around_output`) and of the cut
    marker (`CUT_MARK`), each encoded alone, as the episode appends them."""
    head, tail = fmt.around_output()
    return tuple(tokenizer(x, add_special_tokens=False)["input_ids"] for x in (head, tail, CUT_MARK))


def extract_code(turn_text: str, fmt: ToolFormat) -> str | None:
    """The program of a turn that ended at `fmt.call_end`: the text between the last `call_start` and the closing
    tag, a Markdown fence unwrapped. Never evaluated here: the sandbox runs it.

    Returns:
        The code, or None when there is no `call_start` before the closing tag or nothing but blanks between them.
    """
    body, _, _ = turn_text.rpartition(fmt.call_end)
    if fmt.call_start not in body:
        return None
    code = body.rpartition(fmt.call_start)[2]
    if fmt.json_calls:
        from dapo_rl.episode.chat_tools import parse_call

        code = parse_call(code)
        if code is None:
            return None
    m = _FENCE.match(code)
    if m:
        code = m.group(1)
    return code if code.strip() else None


def render_output(status: str, stdout: str, stderr: str, detail: str, limits_s: float, max_calls: int) -> str:
    """What the model reads back for one call (before the output tags): the program's stdout, and on failure the last
    line of its traceback or why it stopped (ReTool returns the interpreter's output or its error)."""
    if status == "ok":
        return stdout if stdout.strip() else "(no output)"
    if status == "error":
        last = [line for line in stderr.strip().splitlines() if line.strip()]
        error = last[-1] if last else f"error ({detail or 'no message'})"
        return f"{stdout.rstrip()}\n{error}" if stdout.strip() else error
    if status == "timeout":
        return f"TimeoutError: the program ran past {limits_s:g} s"
    if status == "killed":
        return f"the program was killed ({detail or 'a resource limit'})"
    if status == "malformed":
        return "error: no code between the tags"
    if status == "over_budget":
        return f"error: the tool-call budget ({max_calls} calls) is used up"
    return "error: the sandbox failed; this call did not run"


@dataclass
class _Trajectory:
    """One trajectory under construction."""

    index: int
    """Position in the round: prompt `index // n`, sample `index % n`."""
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    finish_reason: str = "stop"
    calls: list[str] = field(default_factory=list)
    truncated_outputs: int = 0
    turns: int = 0
    """The model's turns so far."""
    turn_ids: list[int] = field(default_factory=list)
    """The model's tokens of its latest turn."""
    wants_call: bool = False
    closed_call: bool = False
    """The latest turn ended at the call's closing tag (run or not)."""
    void_turn: bool = False
    """A turn so far had a malformed call (SimpleTIR's void turn; the last turn is judged at the end)."""

    def add_model(self, out, room: int, fmt: ToolFormat) -> None:
        ids, lps, finish = list(out.token_ids), list(out.logprobs), out.finish_reason
        if len(ids) > room:  # one generate serves turns of different room: cut to this one's
            ids, lps, finish = ids[:room], lps[:room], "length"
        self.response_ids += ids
        self.logprobs += lps
        self.loss_mask += [1] * len(ids)
        self.turn_ids = ids
        self.turns += 1
        self.finish_reason = finish
        self.wants_call = self.closed_call = (
            finish == "stop" and out.stop_reason == fmt.call_end and len(ids) == len(out.token_ids)
        )

    def add_tool(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)


@register_episode
@dataclass
class ToolEpisode(Episode):
    """Multi-turn rollouts with a Python tool (module docstring).

    Attributes:
        scorer: the verifier (through its reward pool) and the shaping; it reads the model's own tokens.
        runner: runs the programs (`dapo_rl.sandbox.ProgramRunner`: `run(programs) -> results` with `status`,
            `stdout`, `stderr`, `truncated`, `detail`).
        tokenizer: encodes the tool's output (and decodes each turn to find its code).
        fmt: the tags.
        max_calls: tool calls per trajectory; a call past them is answered `over_budget` and ends it.
        max_output_tokens: the most tokens of one call's output (tags included); longer is cut (counted in
            `tool/truncated_rate`).
        timeout_s: the sandbox's wall-clock limit per call (named in the timeout message).
        owns_pool: `close` closes the reward pool and the runner (False for `unshaped`'s view).
    """

    name = "tool"
    scorer: Scorer
    runner: object
    tokenizer: object
    fmt: ToolFormat = ToolFormat()
    max_calls: int = 4
    max_output_tokens: int = 256
    timeout_s: float = 10.0
    owns_pool: bool = True
    tool_seconds: float = 0.0
    """Wall-clock seconds spent in the sandbox so far."""

    @classmethod
    def build(cls, cfg, tokenizer, pool, log: Callable[[str], None] | None = None) -> ToolEpisode:
        """The episode of a run's config: `episode.tool.*`, the reward pool, `algorithm.overlong_buffer` and
        `reward.repetition_penalty` (`build_episode`).

        Raises:
            ValueError: no tokenizer (a served model: its text cannot be continued token by token);
                `ChatTemplateError` (a ValueError) with `format=chat_template`, a chat template that cannot run the
                tool (`dapo_rl.episode.chat_tools.chat_tool_format`); a `max_output_tokens` no larger than the texts
                around an output and the cut mark.
        """
        from dapo_rl.sandbox import ProgramLimits, ProgramRunner

        if tokenizer is None:
            raise ValueError(
                "episode.name=tool needs the model's tokenizer (a served model is not supported)"
            )
        t = cfg.episode.tool
        # the format is read before the sandbox starts: a template it refuses leaves nothing running
        if t.format == "chat_template":
            from dapo_rl.episode.chat_tools import chat_tool_format

            fmt = chat_tool_format(tokenizer)
        else:
            fmt = ToolFormat(t.call_start, t.call_end, t.output_start, t.output_end)
        room = sum(map(len, tag_ids(tokenizer, fmt)))
        if t.max_output_tokens <= room:
            raise ValueError(
                f"episode.tool.max_output_tokens={t.max_output_tokens} leaves no room for a program's output: the "
                f"texts around it and the cut mark take {room} tokens with this format and tokenizer; raise it above "
                f"{room}"
            )
        runner = ProgramRunner(
            t.num_workers,
            ProgramLimits(wall_s=t.timeout_s, cpu_s=t.timeout_s, memory_bytes=t.memory_mib << 20),
        )
        if runner.missing and log is not None:
            log(f"episode.tool: the sandbox runs without {'; '.join(runner.missing)}")
        scorer = Scorer(
            tokenizer,
            pool,
            overlong=cfg.algorithm.overlong_buffer,
            repetition=cfg.reward.repetition_penalty,
            log=log,
            model_only=True,
        )
        return cls(scorer, runner, tokenizer, fmt, t.max_calls, t.max_output_tokens, t.timeout_s)

    # ------------------------------------------------------------------------------------------------ the loop
    def sample(self, engine, dataset, indices: Sequence[int], params, *, overlap: bool = False):
        """`Episode.sample` over multi-turn trajectories (module docstring); `overlap` is not used (a turn's calls
        wait for the turn anyway)."""
        if engine.takes_chat:
            raise ValueError(
                "episode.name=tool samples token ids; a chat engine (a served model) cannot continue them"
            )
        n, budget = params.n, params.max_tokens
        stop = [*(params.stop or []), self.fmt.call_end]
        trajs = [_Trajectory(k) for k in range(len(indices) * n)]
        t0 = time.perf_counter()
        outs = engine.generate([dataset.prompt_ids[i] for i in indices], replace(params, stop=stop))
        gen_s = time.perf_counter() - t0
        for k, group in enumerate(outs):
            for j, o in enumerate(group):
                trajs[k * n + j].add_model(o, budget, self.fmt)
        live = [t for t in trajs if t.wants_call]
        turn = 0
        while live:
            turn += 1
            self._answer_calls(live, budget)
            live = [t for t in live if t.wants_call and len(t.response_ids) < budget]
            if not live:
                break
            rooms = [budget - len(t.response_ids) for t in live]
            t0 = time.perf_counter()
            outs = engine.generate(
                [dataset.prompt_ids[indices[t.index // n]] + t.response_ids for t in live],
                replace(params, n=1, max_tokens=max(rooms), seed=turn_seed(params.seed, turn), stop=stop),
            )
            gen_s += time.perf_counter() - t0
            for t, room, [o] in zip(live, rooms, outs):
                t.add_model(o, room, self.fmt)
            live = [t for t in live if t.wants_call]
        for t in trajs:  # SimpleTIR's void last turn: no call closed and no final answer ("Answer:" or a box)
            if not t.closed_call:
                last = self.tokenizer.decode(t.turn_ids, skip_special_tokens=True)
                t.void_turn |= extract_final_answer(last) is None
        groups = [
            [self._rollout(dataset, indices[t.index // n], t, n, budget) for t in trajs[k * n : (k + 1) * n]]
            for k in range(len(indices))
        ]
        self.scorer([r for g in groups for r in g], budget)
        return groups, gen_s

    def _answer_calls(self, live: list[_Trajectory], budget: int) -> None:
        """Run the calls the live trajectories end with and append each output; a trajectory that cannot go on
        (over its budget of calls or tokens) stops wanting a call. A call without room left for an output (its
        tags) is not run: the trajectory ends there, truncated (verl's agent loop stops at the response budget
        before parsing a call)."""
        tags = len(self._tags[0]) + len(self._tags[1])
        for t in live:
            if budget - len(t.response_ids) <= tags:
                t.wants_call, t.finish_reason = False, "length"
        live = [t for t in live if t.wants_call]
        codes: list[str | None] = []
        for t in live:
            if len(t.calls) >= self.max_calls:
                codes.append(None)
                t.calls.append("over_budget")
            else:
                code = extract_code(self.tokenizer.decode(t.turn_ids, skip_special_tokens=True), self.fmt)
                codes.append(code)
                t.calls.append("malformed" if code is None else "")
                t.void_turn |= code is None
        to_run = [c for c in codes if c is not None]
        t0 = time.perf_counter()
        results = iter(self.runner.run(to_run) if to_run else [])
        self.tool_seconds += time.perf_counter() - t0
        for t, code in zip(live, codes):
            if code is None:
                text = render_output(t.calls[-1], "", "", "", self.timeout_s, self.max_calls)
                if self.fmt.json_calls and t.calls[-1] == "malformed":
                    from dapo_rl.episode.chat_tools import MALFORMED_CALL

                    text = MALFORMED_CALL
                truncated = False
            else:
                res = next(results)
                t.calls[-1] = res.status
                text = render_output(
                    res.status, res.stdout, res.stderr, res.detail, self.timeout_s, self.max_calls
                )
                truncated = res.truncated
            ids, cut = self._output_ids(text, budget - len(t.response_ids))
            t.truncated_outputs += truncated or cut
            t.add_tool(ids)
            if t.calls[-1] == "over_budget":
                t.wants_call = False

    @cached_property
    def _tags(self) -> tuple[list[int], list[int], list[int]]:
        """`tag_ids` of this episode's format, encoded once."""
        return tag_ids(self.tokenizer, self.fmt)

    def _output_ids(self, text: str, room: int) -> tuple[list[int], bool]:
        """The token ids of one call's output, tags included, at most `max_output_tokens` (and `room`, which
        `_answer_calls` leaves larger than the tags). A longer body loses its middle (`CUT_MARK` in its place), so
        that both its start and its end (the error line, the final result) stay; text in the output that spells a
        special token (`<|endoftext|>`, a chat template's turn markers) is encoded as text. Returns `(ids, cut)`."""
        head, tail, mark = self._tags
        # a program that prints "<|endoftext|>" or "<|im_end|>" gets those characters back, never the special tokens
        body = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        keep = min(self.max_output_tokens, room) - len(head) - len(tail)
        if len(body) <= keep:
            return head + body + tail, False
        if keep <= len(mark):
            return head + tail, True
        first = (keep - len(mark)) // 2
        last = keep - len(mark) - first
        return head + body[:first] + mark + body[len(body) - last :] + tail, True

    @staticmethod
    def _rollout(dataset, i: int, t: _Trajectory, n: int, budget: int) -> Rollout:
        """The finished trajectory as a record: truncated (`length`) when its last turn was, or its tokens (a tool
        output's included) filled the budget."""
        full = t.finish_reason == "length" or len(t.response_ids) >= budget
        return Rollout(
            dataset.samples[i],
            i,
            t.index % n,
            dataset.prompt_ids[i],
            t.response_ids,
            t.logprobs,
            "length" if full else "stop",
            loss_mask=t.loss_mask,
            tool_calls=t.calls,
            tool_truncated=t.truncated_outputs,
            tool_turns=t.turns,
            void_turn=t.void_turn,
        )

    # ------------------------------------------------------------------------------------------------ the rest
    def unshaped(self) -> ToolEpisode:
        scorer = Scorer(self.scorer.tokenizer, self.scorer.pool, log=self.scorer.log, model_only=True)
        return replace(self, scorer=scorer, owns_pool=False, tool_seconds=0.0)

    @property
    def pool(self):
        return self.scorer.pool

    @property
    def seconds(self) -> float:
        """The verifier's seconds and the sandbox's (`time/score_s` counts both)."""
        return self.scorer.seconds + self.tool_seconds

    def close(self) -> None:
        if self.owns_pool:
            self.runner.close()
            self.scorer.pool.close()
