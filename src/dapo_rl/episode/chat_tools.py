"""The tool in the model's own chat-template format (`episode.tool.format=chat_template`).

Chat models trained for tool use (Qwen2.5, Qwen3, Hermes and others) have a chat template that lists the tools in
the system turn when `apply_chat_template(..., tools=[...])` is given them, and expects calls as Hermes-style JSON
between `<tool_call>` and `</tool_call>`; the tool's answer is a `tool` message the template renders as a turn of its
own (Qwen's: `<|im_end|>` closes the model's turn, a user turn holds `<tool_response>...</tool_response>`, and a new
assistant turn opens). verl's ReTool recipe runs this format (`multi_turn.format=hermes`).

The episode keeps its token-in/token-out loop (`dapo_rl.episode.tool`): the engine stops at `</tool_call>`, and what
the template writes between the end of the call and the model's next words is appended as the tool's tokens (loss
mask 0): `ToolFormat.output_head`, the program's output, `ToolFormat.output_tail`. Both are read off the template
once, by rendering a conversation with and without a tool message, so the template's own newlines stay (verl's
agent loop lost the one after `<|im_end|>` at every tool turn until its PR #6921); a template that rewrites the
turns before a tool message (not append-only) is refused. The call is parsed with `json.loads` (data, never
evaluated).
"""

from __future__ import annotations

import json
from typing import Any

from dapo_rl.episode.tool import ToolFormat

TOOL_NAME = "code_interpreter"
"""The function the model calls (verl's ReTool tool config names it so)."""

TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Runs a Python program in a sandbox and returns what it prints, or its error.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python program to run."}},
            "required": ["code"],
        },
    },
}
"""The tool as `apply_chat_template(tools=[TOOL_SCHEMA])` lists it (OpenAI's function-schema form)."""

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
"""Hermes-style call tags, as Qwen2.5's and Qwen3's templates ask for them."""

MALFORMED_CALL = (
    f'error: a call must be JSON of the form {{"name": "{TOOL_NAME}", "arguments": {{"code": "<the program>"}}}} '
    f"between {CALL_START} and {CALL_END}"
)
"""What the model reads back for a call `parse_call` cannot read (it is not run)."""

_OUT = "\x00OUTPUT\x00"
"""Stands for a tool output while the template is read (a text no template writes)."""


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot run the tool: none, no tool calls, or not append-only."""


def _render(tokenizer: Any, messages: list[dict], generation_prompt: bool) -> str:
    name = getattr(tokenizer, "name_or_path", "") or "the model"
    try:
        return tokenizer.apply_chat_template(
            messages, tools=[TOOL_SCHEMA], add_generation_prompt=generation_prompt, tokenize=False
        )
    except Exception as e:  # a template's own raise_exception (jinja's TemplateError), a missing field
        raise ChatTemplateError(
            f"episode.tool.format=chat_template: {name}'s chat template failed on a tool conversation: {e}"
        ) from e


def _around_output(tokenizer: Any, content: str) -> tuple[str, str] | None:
    """`(head, tail)` around a tool output, from a conversation whose assistant turn is `content` and one call; None
    when adding the tool message rewrites what came before it (not append-only)."""
    call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": "print(1)"}}}
    asked = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": content, "tool_calls": [call]},
    ]
    before = _render(tokenizer, asked, False)
    after = _render(tokenizer, [*asked, {"role": "tool", "name": TOOL_NAME, "content": _OUT}], True)
    if not after.startswith(before) or after.count(_OUT) != 1 or CALL_END not in before:
        return None
    head, tail = after[len(before) :].split(_OUT)
    close = before[before.rindex(CALL_END) + len(CALL_END) :]  # the template's end of the model's turn
    return close + head, tail


def chat_tool_format(tokenizer: Any) -> ToolFormat:
    """The tool format the tokenizer's chat template defines: the call tags and the text around a tool's output.

    The texts are read from a conversation with one call, rendered without and with the tool's answer. Its
    assistant turn is empty, or, for a template that writes reasoning (`</think>`), holds some: Qwen3's template
    writes an empty `<think></think>` into the last assistant turn only, so an empty turn reads as rewritten once a
    tool message follows it, while a turn with its reasoning (what a thinking rollout holds) does not.

    Returns:
        A `ToolFormat` with `call_start`/`call_end` `<tool_call>`/`</tool_call>`, `json_calls` True, and
        `output_head` / `output_tail`: what the template writes after the model's `</tool_call>` and before the
        output, and after the output up to the model's next turn (for Qwen2.5's template
        `"<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n"` and `"\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n"`).

    Raises:
        ChatTemplateError: no chat template; a template that lists no tools, or whose calls are not `<tool_call>`
            JSON (Llama 3.1's are bare JSON); a template that fails on a tool conversation, or is not append-only
            when a tool message is added; call tags the tokenizer holds as special tokens (decoded away, the engine
            would never see a call end).
    """
    name = getattr(tokenizer, "name_or_path", "") or "the model"
    where = f"episode.tool.format=chat_template: {name}'s"
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(
            f"{where} tokenizer has no chat template; use episode.tool.format=tags (ReTool's tags, offered by "
            "data.prompt_template=tool)"
        )
    listed = _render(tokenizer, [{"role": "user", "content": "Q"}], True)
    if TOOL_NAME not in listed:
        raise ChatTemplateError(
            f"{where} chat template lists no tools; use episode.tool.format=tags with data.prompt_template=tool"
        )
    if CALL_START not in listed:
        raise ChatTemplateError(
            f"{where} chat template lists tools but does not ask for {CALL_START} JSON calls (Llama 3.1's, for one, "
            "are bare JSON); use episode.tool.format=tags with data.prompt_template=tool"
        )
    around = _around_output(tokenizer, "")
    if around is None and "</think>" in tokenizer.chat_template:
        around = _around_output(tokenizer, "<think>\nreasoning\n</think>\n\n")
    if around is None:
        raise ChatTemplateError(
            f"{where} chat template is not append-only (adding a tool message rewrites the turns before it), so "
            "what the model was sampled on would not be what the template gives it; use episode.tool.format=tags"
        )
    ids = tokenizer(CALL_START + "{}" + CALL_END, add_special_tokens=False)["input_ids"]
    if CALL_END not in tokenizer.decode(ids, skip_special_tokens=True):
        raise ChatTemplateError(
            f"{where} tokenizer holds {CALL_END} as a special token, which the engines decode away (skip_special_tokens):"
            " a call's end would never be seen; use episode.tool.format=tags"
        )
    return ToolFormat(CALL_START, CALL_END, output_head=around[0], output_tail=around[1], json_calls=True)


def parse_call(body: str) -> str | None:
    """The program of a Hermes-style call, `{"name": "code_interpreter", "arguments": {"code": "..."}}` (the
    arguments may also be a JSON string of that object), read with `json.loads`: never evaluated.

    Returns:
        The code, or None when the body is not such a call (the episode answers `malformed`).
    """
    try:
        call = json.loads(body)
        args = call.get("arguments") if isinstance(call, dict) else None
        if isinstance(args, str):
            args = json.loads(args)
    except (ValueError, RecursionError):
        return None
    if not isinstance(call, dict) or call.get("name") != TOOL_NAME or not isinstance(args, dict):
        return None
    code = args.get("code")
    return code if isinstance(code, str) and code.strip() else None


def prompt_tools(episode_cfg, tokenizer: Any) -> list[dict] | None:
    """The tool schemas a run's prompts list: `[TOOL_SCHEMA]` for `episode.name=tool` with
    `episode.tool.format=chat_template` (the template checked first, `chat_tool_format`), else None.

    Raises:
        ChatTemplateError: as `chat_tool_format`.
    """
    if episode_cfg.name != "tool" or episode_cfg.tool.format != "chat_template":
        return None
    chat_tool_format(tokenizer)
    return [TOOL_SCHEMA]
