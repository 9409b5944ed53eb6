"""Worked solutions for the supervised warm-up: responses that write their intermediate results.

The embedded tasks' reference answers are bare numbers. A warm-up on `Answer: N` alone gives responses of one
length, on which DAPO's length-related techniques (overlong shaping and filtering, token-level loss) have nothing to
act. A warm-up that mixes bare answers with worked solutions of one line per operation gives the model both styles,
a real spread of response lengths (one line per term), and room for RL to move between them: the worked style is
longer and more often right on long chains, the bare style short and often wrong (the "length grows as the model
learns to reason" of DAPO's Fig. 7, in miniature).

Example (`chain_sum`, expression `15 - 43 - 75 + 61`)::

    15-43=-28
    -28-75=-103
    -103+61=-42
    Answer: -42
"""

from __future__ import annotations

import random
import re

from dapo_rl.data.dataset import DataError, Sample

_TERM = re.compile(r"\s*([+-])\s*(\d+)")

COMPLETION_STYLES = ("answer", "steps", "mixed", "tool", "tool_mixed", "code", "code_mixed")
"""`SFTConfig.completion` values: bare `Answer: N`, worked steps, or a seeded mix of the two; a Python tool call and
its output before the answer (`tool_trace`), or a seeded mix of tool traces and bare answers; a `tiny_functions`
program in a Python block, or a seeded mix of programs and tables of the shown examples
(`dapo_rl.data.code_tasks.code_completion`)."""

RETOOL_TAGS = ("<code>", "</code>", "<interpreter>", "</interpreter>")
"""ReTool's tags (arXiv 2504.11536): a call opens and closes, then the tool's output opens and closes: the defaults
of `episode.tool.call_start`, `call_end`, `output_start`, `output_end` and the tags of `tool_trace`."""


def tool_output_text(stdout: str, output_start: str, output_end: str) -> str:
    """A tool call's output as the tool episode appends it to the context (`dapo_rl.episode.tool`): on lines of its
    own between the output tags, `"\n<interpreter>\n68762\n\n</interpreter>\n"` for a program that printed
    `68762`."""
    return f"\n{output_start}\n{stdout}\n{output_end}\n"


def tool_trace(sample: Sample, tags: tuple[str, str, str, str] = RETOOL_TAGS) -> str:
    """A response that computes a chain_sum with the Python tool and then answers: the call, the output the tool
    episode would append (`tool_output_text`), the answer::

        <code>print(48213 - 9917 + 30466)</code>
        <interpreter>
        68762

        </interpreter>
        Answer: 68762

    Raises:
        DataError: not a reasoning-gym chain_sum sample, or its expression does not give its ground truth.
    """
    expression = _chain_sum_expression(sample, "tool traces")
    worked_solution(sample)  # the expression's value is the ground truth
    call_start, call_end, output_start, output_end = tags
    out = tool_output_text(f"{sample.ground_truth}\n", output_start, output_end)
    return f"{call_start}print({expression.strip()}){call_end}{out}Answer: {sample.ground_truth}"


def tool_output_spans(text: str, tags: tuple[str, str, str, str] = RETOOL_TAGS) -> list[tuple[str, bool]]:
    """`text` cut into `(segment, trained)` pieces: each tool output block the episode appends
    (`tool_output_text`: from the newline before the output's opening tag to the newline after its closing tag)
    gives three pieces with `trained` False (the opening, the output, the closing),
    the model's text around them pieces with `trained` True. The pieces join back to `text`; a text without output
    blocks is one trained piece.

    The supervised warm-up trains on the model's pieces only, as RL's loss mask does (the tool episode gives the
    tool's tokens loss mask 0), and tokenizes each piece alone, as the episode tokenizes the opening, the output
    and the closing it appends (`dapo_rl.episode.tool`).
    """
    head = f"\n{tags[2]}\n"
    tail = f"\n{tags[3]}\n"
    pieces: list[tuple[str, bool]] = []
    at = 0
    while (start := text.find(head, at)) >= 0 and (end := text.find(tail, start + len(head))) >= 0:
        if start > at:
            pieces.append((text[at:start], True))
        body = text[start + len(head) : end]
        pieces += [(head, False), *([(body, False)] if body else []), (tail, False)]
        at = end + len(tail)
    if at < len(text) or not pieces:
        pieces.append((text[at:], True))
    return pieces


def chain_steps(expression: str) -> list[str]:
    """One line per operation of a left-to-right chain of additions and subtractions.

    Args:
        expression: integers joined by `+` / `-` (reasoning-gym `chain_sum`'s `metadata["expression"]`, e.g.
            `"15 - 43 - 75"`); a leading minus sign on the first term is allowed.

    Returns:
        `["15-43=-28", "-28-75=-103"]`: each line the running value, the operation, and the new running value;
        no spaces. An expression of one term gives `[]`.

    Raises:
        ValueError: the expression is not such a chain (other operators, parentheses, no digits).
    """
    text = expression.strip()
    m = re.match(r"(-?)\s*(\d+)", text)
    if not m:
        raise ValueError(f"not a +/- chain of integers: {expression!r}")
    value = int(m.group(2)) * (-1 if m.group(1) else 1)
    pos, lines = m.end(), []
    while pos < len(text):
        t = _TERM.match(text, pos)
        if not t:
            raise ValueError(f"not a +/- chain of integers: {expression!r} (at character {pos})")
        op, term = t.group(1), int(t.group(2))
        new = value + term if op == "+" else value - term
        lines.append(f"{value}{op}{term}={new}")
        value, pos = new, t.end()
    return lines


def _chain_sum_expression(sample: Sample, what: str) -> str:
    """A reasoning-gym chain_sum sample's expression (`extra_info["metadata"]["expression"]`).

    Raises:
        DataError: another task, or no expression (names the sample and `what` cannot be written for it).
    """
    meta = (sample.extra_info or {}).get("metadata") or {}
    expression = meta.get("expression") if isinstance(meta, dict) else None
    if sample.data_source != "reasoning_gym/chain_sum" or not isinstance(expression, str):
        raise DataError(
            f"sample {sample.uid}: {what} are written for reasoning-gym chain_sum only "
            f"(data_source {sample.data_source!r}); use sft.completion=answer for other tasks"
        )
    return expression


def worked_solution(sample: Sample) -> str:
    """The worked steps of a sample and its final line, `"...\\nAnswer: N"` (no end-of-sequence token).

    Supports reasoning-gym `chain_sum` samples (their `extra_info["metadata"]["expression"]`). The last step's
    value is checked against the sample's ground truth.

    Raises:
        DataError: the sample's task has no worked-solution writer, or its expression does not evaluate to its
            ground truth (names the sample's uid).
    """
    expression = _chain_sum_expression(sample, "worked solutions")
    try:
        lines = chain_steps(expression)
    except ValueError as e:
        raise DataError(f"sample {sample.uid}: {e}") from e
    final = lines[-1].rsplit("=", 1)[1] if lines else expression.replace(" ", "")
    if final != str(sample.ground_truth).strip():
        raise DataError(
            f"sample {sample.uid}: the steps of {expression!r} end at {final}, the ground truth is "
            f"{sample.ground_truth!r}"
        )
    return "\n".join([*lines, f"Answer: {sample.ground_truth}"])


def sft_completions(samples: list[Sample], style: str, steps_fraction: float, seed: int) -> list[str]:
    """The supervised targets of a warm-up (without the end-of-sequence token).

    Args:
        samples: the warm-up problems.
        style: `answer` (`"Answer: N"`), `steps` (`worked_solution`), `mixed` (each sample takes the worked
            solution with probability `steps_fraction`, drawn from a generator seeded with `seed`), `tool`
            (`tool_trace`) or `tool_mixed` (the tool trace with probability `steps_fraction`, else the bare answer),
            `code` (a `tiny_functions` program, `dapo_rl.data.code_tasks.code_completion`) or `code_mixed` (the
            program with probability `steps_fraction`, else the table of the shown examples).
        steps_fraction: in [0, 1]; used by `mixed`, `tool_mixed` and `code_mixed` only.
        seed: seed of the style draws.

    Raises:
        ValueError: unknown style or a fraction outside [0, 1].
        DataError: see `worked_solution`.
    """
    if style not in COMPLETION_STYLES:
        raise ValueError(f"completion style {style!r} is not one of {', '.join(COMPLETION_STYLES)}")
    if not 0.0 <= steps_fraction <= 1.0:
        raise ValueError(f"steps_fraction={steps_fraction} must be in [0, 1]")
    rng = random.Random(seed)
    out: list[str] = []
    for s in samples:
        if style in ("code", "code_mixed"):
            from dapo_rl.data.code_tasks import code_completion

            general = style == "code" or rng.random() < steps_fraction
            out.append(code_completion(s, table=not general))
            continue
        if style in ("tool", "tool_mixed"):
            tool = style == "tool" or rng.random() < steps_fraction
            out.append(tool_trace(s) if tool else f"Answer: {s.ground_truth}")
            continue
        worked = style == "steps" or (style == "mixed" and rng.random() < steps_fraction)
        out.append(worked_solution(s) if worked else f"Answer: {s.ground_truth}")
    return out
