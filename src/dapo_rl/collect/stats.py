"""A step's generation statistics: additive sums over the rounds (and ranks) that sampled it, then the step's means.

`GenerationSums.of(groups)` sums one round; sums of several rounds add (`+`), sums of several ranks all-reduce
(`as_list`/`from_list`), and an asynchronous run's checkpoint keeps them by name (`state`/`from_state`).
`GenerationSums.stats` turns them into the logged `train/*` and `reward/*` values ([docs/metrics.md](../../../docs/
metrics.md)).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch

from dapo_rl.episode.records import PromptGroup

PRE_CODE_FIELDS = 26
"""`GenerationSums` fields before the code reward's (2026-12-07): an `as_list` of that length reads with them 0."""


@dataclass
class GenerationSums:
    """What the responses generated for a step add up to (floats, so that ranks all-reduce them in one tensor).

    Attributes:
        responses: responses sampled.
        groups: prompt groups sampled.
        reward: sum of the shaped rewards.
        correct: responses the verifier judged correct.
        tokens: response tokens, a tool's included (`dapo_rl.episode.records`).
        truncated: responses cut at `max_tokens`.
        errors: verifier errors (timeouts excluded).
        timeouts: answers the verifier did not settle in time.
        all_correct_groups: groups whose responses were all correct.
        all_wrong_groups: groups whose responses were all wrong.
        token_prob: sum of the sampling probabilities (`exp` of the engine's log-probs) of the model's tokens.
        sampled_tokens: the model's tokens (`Rollout.loss_mask` 1): `token_prob`'s count.
        refused: answers outside their task's grammar (`dapo_rl.reward.answer_grammar`).
        filtered_tokens: response tokens in groups dynamic sampling dropped (all right or all wrong).
        tool_trajectories: responses of a tool episode (`Rollout.tool_calls` not None); the `tool/*` statistics'
            count.
        tool_used: those that made at least one call.
        tool_calls: calls made, `over_budget` and `malformed` ones included.
        tool_code_errors: calls whose program raised or exited non-zero (`error`), or were `malformed`.
        tool_sandbox_errors: calls the sandbox itself failed on (`sandbox_error`: the trajectory does not train).
        tool_timeouts: calls past their wall-clock or CPU time (`timeout`, `killed`).
        tool_truncated: calls whose output was cut.
        tool_void: responses with a `sandbox_error` call (`Rollout.void`).
        tool_turns: the model's turns in a tool episode's responses.
        tool_malformed: calls with no code between the tags (or, in the chat format, no readable call): `malformed`.
        tool_void_turns: responses with a void turn (SimpleTIR's: a malformed call, or a last turn with neither a
            call nor an answer; `Rollout.void_turn`).
        code_responses: responses the code reward scored (`Rollout.code` set); the `reward/code_*` rates' count.
        code_compile_errors, code_runtime_errors, code_timeouts, code_sandbox_errors, code_no_code: those with that
            outcome (`dapo_rl.reward.code.CODE_OUTCOMES`; a sandbox error voids the response).
        code_hacks: those with a recognised hack attempt (`Rollout.code_hacks`).
    """

    responses: float = 0.0
    groups: float = 0.0
    reward: float = 0.0
    correct: float = 0.0
    tokens: float = 0.0
    truncated: float = 0.0
    errors: float = 0.0
    timeouts: float = 0.0
    all_correct_groups: float = 0.0
    all_wrong_groups: float = 0.0
    token_prob: float = 0.0
    sampled_tokens: float = 0.0
    refused: float = 0.0
    filtered_tokens: float = 0.0
    tool_trajectories: float = 0.0
    tool_used: float = 0.0
    tool_calls: float = 0.0
    tool_code_errors: float = 0.0
    tool_sandbox_errors: float = 0.0
    tool_timeouts: float = 0.0
    tool_truncated: float = 0.0
    tool_void: float = 0.0
    tool_turns: float = 0.0
    model_tokens: float = 0.0
    """The model's own response tokens (`Rollout.model_length`); `tokens` counts a tool's too. (`sampled_tokens`
    counts the same tokens where the engine returns log-probs; a served model's responses come without.)"""
    tool_malformed: float = 0.0
    tool_void_turns: float = 0.0
    code_responses: float = 0.0
    code_compile_errors: float = 0.0
    code_runtime_errors: float = 0.0
    code_timeouts: float = 0.0
    code_sandbox_errors: float = 0.0
    code_no_code: float = 0.0
    code_hacks: float = 0.0

    @classmethod
    def of(cls, generated: list[PromptGroup], filtered_tokens: int = 0) -> GenerationSums:
        """The sums of one round's (or one rank's) `generated` groups, with the tokens the filter dropped."""
        rs = [x for g in generated for x in g.rollouts]
        lps = [lp for x in rs for lp in x.sampled_logprobs()]
        calls = [c for x in rs for c in x.tool_calls or ()]
        return cls(
            responses=len(rs),
            groups=len(generated),
            reward=sum(x.reward for x in rs),
            correct=sum(float(x.acc) for x in rs),
            tokens=sum(x.response_length for x in rs),
            truncated=sum(x.truncated for x in rs),
            errors=sum(x.status == "error" for x in rs),
            timeouts=sum(x.status == "timeout" for x in rs),
            all_correct_groups=sum(all(x.acc for x in g.rollouts) for g in generated),
            all_wrong_groups=sum(not any(x.acc for x in g.rollouts) for g in generated),
            token_prob=float(torch.tensor(lps, dtype=torch.float64).exp().sum()) if lps else 0.0,
            sampled_tokens=len(lps),
            refused=sum(x.status == "refused" for x in rs),
            filtered_tokens=filtered_tokens,
            tool_trajectories=sum(x.tool_calls is not None for x in rs),
            tool_used=sum(bool(x.tool_calls) for x in rs),
            tool_calls=len(calls),
            tool_code_errors=sum(c in ("error", "malformed") for c in calls),
            tool_sandbox_errors=calls.count("sandbox_error"),
            tool_timeouts=sum(c in ("timeout", "killed") for c in calls),
            tool_truncated=sum(x.tool_truncated for x in rs),
            tool_void=sum(x.void for x in rs),
            tool_turns=sum(x.tool_turns for x in rs),
            tool_malformed=calls.count("malformed"),
            tool_void_turns=sum(x.void_turn for x in rs),
            model_tokens=sum(x.model_length for x in rs),
            code_responses=sum(bool(x.code) for x in rs),
            code_compile_errors=sum(x.code == "compile_error" for x in rs),
            code_runtime_errors=sum(x.code == "runtime_error" for x in rs),
            code_timeouts=sum(x.code == "timeout" for x in rs),
            code_sandbox_errors=sum(x.code == "sandbox_error" for x in rs),
            code_no_code=sum(x.code == "no_code" for x in rs),
            code_hacks=sum(bool(x.code_hacks) for x in rs),
        )

    def __add__(self, other: GenerationSums) -> GenerationSums:
        return GenerationSums(*(a + b for a, b in zip(self.as_list(), other.as_list())))

    def as_list(self) -> list[float]:
        """The sums in field order (an all-reduce's payload)."""
        return [float(getattr(self, f.name)) for f in fields(self)]

    @classmethod
    def from_list(cls, values: list[float]) -> GenerationSums:
        """`as_list` read back.

        Raises:
            ValueError: not one value per field.
        """
        if len(values) != len(fields(cls)):
            raise ValueError(f"{len(values)} sums for the {len(fields(cls))} fields of GenerationSums")
        return cls(*map(float, values))

    def state(self) -> dict[str, float]:
        """The sums by name, for a checkpoint."""
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict | list) -> GenerationSums:
        """`state` read back (a checkpoint from before the `tool_*` sums lacks them: 0; from before `model_tokens`,
        see the code); a positional list too
        (`as_list`'s, or an older checkpoint's: 26 values from before the code sums, 14 from before the tool sums,
        13 from before `refused`).

        Raises:
            ValueError: a positional list of another length.
        """
        if isinstance(state, dict):
            # before `model_tokens`: the model's tokens are the sampled ones (a tool run's), else all of them
            before = (
                state.get("sampled_tokens") if state.get("tool_trajectories") else state.get("tokens", 0.0)
            )
            return cls(**({"model_tokens": before} | state))
        values = list(state)
        if len(values) == len(fields(cls)):
            return cls.from_list(values)
        if len(values) == PRE_CODE_FIELDS:  # before the code reward's sums (appended last): 0
            return cls.from_list(values + [0.0] * (len(fields(cls)) - PRE_CODE_FIELDS))
        if len(values) == 13:  # before `refused`: it stood just before the filtered tokens
            values = [*values[:-1], 0.0, values[-1]]
        if len(values) != 14:
            raise ValueError(
                f"{len(values)} positional sums: a checkpoint's list holds 13, 14 or {len(fields(cls))}"
            )
        out = cls(*map(float, values))  # before the tool sums: 0
        out.model_tokens = out.tokens
        return out

    def stats(self, longest: int, rounds: int, total_kept: int, surplus_tokens: int = 0) -> dict:
        """The step's logged statistics, given the model's longest response (`Rollout.model_length`), the rounds, the groups kept and the tokens of
        kept groups dropped for lack of room (`surplus_tokens`). A step that generated nothing (its batch all
        carried groups) logs only the counts (`STEP_COUNTS`), so curves and CAMPO's saturation window see no zeros.

        `train/token_prob_mean` is the mean sampling probability of the model's tokens (DAPO Fig. 7's "mean
        probability"); `train/all_correct_group_ratio` / `train/all_wrong_group_ratio` the share of groups whose
        responses were all right / all wrong (Fig. 3b); `train/gen_tokens_wasted_ratio` the share of the step's
        generated response tokens that no update sees."""
        n, length = self.responses, self.tokens
        wasted = self.filtered_tokens + surplus_tokens
        out = {
            "train/reward_mean": self.reward / max(n, 1.0),
            "train/acc_mean": self.correct / max(n, 1.0),
            "train/response_length_mean": self.model_tokens / max(n, 1.0),
            "train/response_length_max": longest,
            "train/response_clip_ratio": self.truncated / max(n, 1.0),
            "train/num_gen_batches": rounds,
            "train/filter_pass_ratio": total_kept / max(self.groups, 1.0),
            "train/all_correct_group_ratio": self.all_correct_groups / max(self.groups, 1.0),
            "train/all_wrong_group_ratio": self.all_wrong_groups / max(self.groups, 1.0),
            "train/gen_samples": int(n),
            "train/gen_tokens": int(length),
            "train/gen_tokens_wasted": int(wasted),
            "train/gen_tokens_wasted_ratio": wasted / max(length, wasted, 1.0),
            "train/gen_tokens_filtered_ratio": self.filtered_tokens / max(length, 1.0),
            "train/gen_tokens_surplus_ratio": surplus_tokens / max(length, 1.0),
            "reward/error_rate": self.errors / max(n, 1.0),
            "reward/timeout_rate": self.timeouts / max(n, 1.0),
            "reward/refused_rate": self.refused / max(n, 1.0),
        }
        if self.sampled_tokens:
            out["train/token_prob_mean"] = self.token_prob / self.sampled_tokens
        if self.tool_trajectories:
            out |= self.tool_stats()
        if self.code_responses:
            out |= self.code_stats()
        if not n:
            out = {k: v for k, v in out.items() if k in STEP_COUNTS}
        return out

    def tool_stats(self) -> dict:
        """The `tool/*` statistics of a tool episode's responses (docs/metrics.md): calls and turns per trajectory
        (the model's turns), the share that called the tool, and per call the rates of code errors,
        sandbox errors, timeouts, cut outputs and malformed calls (also counted in `tool/code_error_rate`);
        `tool/void_ratio` the share of responses the sandbox voided (they do not train), `tool/void_turn_ratio` the
        share with a void turn in SimpleTIR's sense (`Rollout.void_turn`)."""
        t, c = self.tool_trajectories, max(self.tool_calls, 1.0)
        return {
            "tool/calls_per_trajectory": self.tool_calls / t,
            "tool/turns_mean": self.tool_turns / t,
            "tool/context_length_mean": self.tokens / t,
            "tool/used_ratio": self.tool_used / t,
            "tool/code_error_rate": self.tool_code_errors / c,
            "tool/sandbox_error_rate": self.tool_sandbox_errors / c,
            "tool/timeout_rate": self.tool_timeouts / c,
            "tool/truncated_rate": self.tool_truncated / c,
            "tool/void_ratio": self.tool_void / t,
            "tool/malformed_rate": self.tool_malformed / c,
            "tool/void_turn_ratio": self.tool_void_turns / t,
        }

    def code_stats(self) -> dict:
        """The code reward's `reward/code_*` rates over the responses it scored (docs/metrics.md): compile errors,
        runtime errors, timeouts, sandbox errors (void: they do not train), responses without a code block, and
        responses with a recognised hack attempt (`dapo_rl.reward.code.HACKS`)."""
        c = self.code_responses
        return {
            "reward/code_compile_error_rate": self.code_compile_errors / c,
            "reward/code_runtime_error_rate": self.code_runtime_errors / c,
            "reward/code_timeout_rate": self.code_timeouts / c,
            "reward/code_sandbox_error_rate": self.code_sandbox_errors / c,
            "reward/code_no_code_rate": self.code_no_code / c,
            "reward/code_hack_rate": self.code_hacks / c,
        }


STEP_COUNTS = (
    "train/num_gen_batches",
    "train/gen_samples",
    "train/gen_tokens",
    "train/gen_tokens_wasted",
    "train/gen_tokens_wasted_ratio",
)
"""The statistics that a step which generated nothing still logs: its counts (0) and the waste share (1 when it
dropped carried groups for lack of room, else 0); its means are left out."""
