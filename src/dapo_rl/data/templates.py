"""Prompt templates.

`dapo`: the template of DAPO's released data (DAPO-Math-17k and its AIME 2024 evaluation file) that asks for a final
"Answer: ..." line, which DAPO's verifier reads. `boxed`: Qwen2.5-Math's evaluation instruction (reason step by
step, final answer in \\boxed{}). `answer`: one short line asking for a last "Answer: <number>" line, for small chat
models that the long DAPO instruction confuses (SmolLM2-135M-Instruct, Q4_1, sampled at temperature 0.3: right 2% of
the time on one-digit two-term sums under the DAPO template, 13% under this line); numeric answers.
"""

from __future__ import annotations

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
DAPO_TEMPLATE = DAPO_PREFIX + "{problem}" + DAPO_SUFFIX
"""DAPO's "Answer:" prompt, with `{problem}` standing for the bare problem text."""

BOXED_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
"""Appended to the last message by the `boxed` template (unless it already asks for \\boxed)."""

ANSWER_SUFFIX = '\nGive the final answer on a last line of the form "Answer: <number>".'
"""Appended to the last message by the `answer` template (unless it already asks for an "Answer:" line)."""

TOOL_SUFFIX = (
    "\nYou can run Python: write a program between <code> and </code>, and its output is shown between <interpreter>"
    " and </interpreter>. For example, for 23 + 45 = write\n<code>print(23 + 45)</code>\n<interpreter>\n68\n\n"
    '</interpreter>\nAnswer: 68\nGive the final answer on a last line of the form "Answer: <number>".'
)
"""Appended to the last message by the `tool` template (ReTool's default tags, `dapo_rl.data.solutions.RETOOL_TAGS`;
with other `episode.tool` tags, write your own prompt)."""

TEMPLATES = ("none", "dapo", "boxed", "answer", "tool")


def apply_prompt_template(messages: list[dict], template: str) -> list[dict]:
    """Wrap the last user message of a chat in a prompt template.

    Args:
        messages: chat messages (`{"role", "content"}` dicts); not modified.
        template: `none` (return as is), `dapo` (DAPO's "Answer:" template; a message that already holds it, as
            the shared AIME 2024 parquet and DAPO's original data do, is left alone: never wrapped twice),
            `boxed` (`BOXED_SUFFIX` appended to the last message unless it mentions \\boxed), `answer`
            (`ANSWER_SUFFIX` appended to the last message unless it mentions "Answer:") or `tool` (`TOOL_SUFFIX`
            appended unless the message already names the `<code>` tag).

    Returns:
        A new list of messages.

    Raises:
        ValueError: unknown template name.
    """
    if template == "none":
        return messages
    if template in ("boxed", "answer", "tool"):
        content = messages[-1]["content"]
        marker, suffix = {
            "boxed": ("\\boxed", BOXED_SUFFIX),
            "answer": ("Answer:", ANSWER_SUFFIX),
            "tool": ("<code>", TOOL_SUFFIX),
        }[template]
        if marker in content:
            return messages
        return [*messages[:-1], {**messages[-1], "content": content + suffix}]
    if template != "dapo":
        raise ValueError(f"unknown prompt template {template!r}; choose one of {', '.join(TEMPLATES)}")
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role", "user") == "user":
            content = m["content"]
            if not (content.startswith(DAPO_PREFIX.strip()[:40]) or "Answer: $Answer" in content):
                m["content"] = DAPO_TEMPLATE.format(problem=content)
            break
    return out
