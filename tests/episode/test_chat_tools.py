"""The tool in the model's chat-template format (`episode.tool.format=chat_template`, `dapo_rl.episode.chat_tools`):
the texts read off a Hermes-style template, the templates refused (none, no tools, not append-only), the call parser
(JSON, never evaluated), and the turn loop's tokens with the template's turn markers. The templates are written
here in the form Qwen2.5's template renders (`<|im_start|>role ... <|im_end|>`, tools listed in a system turn,
`<tool_call>` JSON, tool output in a user turn's `<tool_response>`); the tiny tokenizer encodes them byte by byte,
so every count below is known by hand. The programs run in the real sandbox; the engine is the scripted one of
`test_tool_episode.py`."""

import json

import pytest
from test_tool_episode import EOS, Scripted, turns_and_outputs

from dapo_rl.config import ConfigError, load_config
from dapo_rl.data import PromptDataset, Sample
from dapo_rl.episode import build_episode
from dapo_rl.episode.chat_tools import (
    MALFORMED_CALL,
    TOOL_SCHEMA,
    ChatTemplateError,
    chat_tool_format,
    parse_call,
    prompt_tools,
)
from dapo_rl.models.tiny import build_tiny_tokenizer
from dapo_rl.rollout.base import SamplingParams

HERMES = (
    "{% if tools %}<|im_start|>system\nYou may call functions. Signatures within <tools></tools>:\n<tools>"
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\nCall one as <tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n{% endif %}'
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A Hermes-style template, append-only: each message renders the same whatever follows it."""

HEAD = "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
TAIL = "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def _cfg(*extra):
    return load_config(
        None,
        [
            "episode.name=tool",
            "episode.tool.format=chat_template",
            "reward.num_workers=0",
            "reward.name=math_dapo",
            *extra,
        ],
    )


def _tok(template):
    tok = build_tiny_tokenizer()
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def tok():
    return _tok(HERMES)


def test_the_texts_around_an_output_are_read_off_the_template(tok):
    fmt = chat_tool_format(tok)
    assert (fmt.call_start, fmt.call_end, fmt.json_calls) == ("<tool_call>", "</tool_call>", True)
    assert fmt.around_output() == (HEAD, TAIL)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "6 * 7 ="}],
        tools=[TOOL_SCHEMA],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert json.dumps(TOOL_SCHEMA) in prompt and prompt.endswith(
        "<|im_start|>user\n6 * 7 =<|im_end|>\n<|im_start|>assistant\n"
    )


def test_templates_that_cannot_run_the_tool_are_refused():
    plain = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    # like Qwen3's: an assistant turn followed by more of the conversation is rewritten (its reasoning dropped)
    rewrites = HERMES.replace(
        "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}",
        "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content if loop.last else '' }}"
        "{% if not loop.last %}(earlier){% endif %}",
    )
    # like Llama 3.1's: the tools listed, the calls bare JSON
    bare_json = HERMES.replace("Call one as <tool_call>\n", "Call one as ").replace(
        "<args-json-object>}\n</tool_call>", "<args-json-object>}"
    )
    raises = HERMES.replace(
        "{% for c in m.tool_calls or [] %}", "{% for c in m.tool_calls or [] %}{{ c.id.x }}"
    )
    special = _tok(HERMES)
    special.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    for tok, why in [
        (_tok(None), "has no chat template"),
        (_tok(plain), "lists no tools"),
        (_tok(bare_json), "lists tools but does not ask for <tool_call> JSON calls"),
        (_tok(rewrites), "is not append-only"),
        (_tok(raises), "failed on a tool conversation"),
        (special, "holds </tool_call> as a special token"),
    ]:
        with pytest.raises(ChatTemplateError, match=why):
            chat_tool_format(tok)
    cfg = load_config(None, ["episode.name=tool", "episode.tool.format=chat_template"])
    with pytest.raises(ChatTemplateError, match="lists no tools"):
        prompt_tools(cfg.episode, _tok(plain))
    assert prompt_tools(load_config(None, ["episode.name=tool"]).episode, _tok(plain)) is None
    with pytest.raises(ConfigError, match="episode.tool.format='hermes' is not one of tags, chat_template"):
        load_config(None, ["episode.name=tool", "episode.tool.format=hermes"])
    with pytest.raises(
        ConfigError, match="with data.prompt_template=tool: those write the tool in ReTool's tags"
    ):
        load_config(
            None, ["episode.name=tool", "episode.tool.format=chat_template", "data.prompt_template=tool"]
        )
    with pytest.raises(ConfigError, match="with sft.completion=tool_mixed"):
        load_config("tiny_python_tool", ["episode.tool.format=chat_template"])


def test_a_template_that_writes_reasoning_is_read_with_a_reasoning_turn():
    """Like Qwen3's: the last assistant turn gets an empty <think></think> when it has none, earlier ones do not,
    so an empty probe turn reads as rewritten; with reasoning in it (as a thinking rollout has) it is append-only."""
    thinks = HERMES.replace(
        "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}",
        "{% elif m.role == 'assistant' %}<|im_start|>assistant\n"
        "{% if loop.last and '</think>' not in m.content %}<think>\n\n</think>\n\n{% endif %}{{ m.content }}",
    )
    assert thinks != HERMES
    assert chat_tool_format(_tok(thinks)).around_output() == (HEAD, TAIL)


def test_output_that_spells_special_tokens_stays_text_and_the_output_budget_covers_the_markers(tok):
    """A program printing the tokenizer's eos or the template's turn markers gets those characters back, not the
    special tokens; a max_output_tokens that the markers alone fill is refused."""
    cfg = _cfg()
    with build_episode(cfg, tok) as episode:
        ids, cut = episode._output_ids("<|endoftext|>", 256)
    assert not cut and EOS not in ids
    assert bytes(ids).decode() == HEAD + "<|endoftext|>" + TAIL
    room = len(HEAD) + len(TAIL) + len("\n...\n")  # one byte a token
    with pytest.raises(ValueError, match=f"max_output_tokens={room} leaves no room .* take {room} tokens"):
        build_episode(_cfg(f"episode.tool.max_output_tokens={room}"), tok)


def test_calls_are_read_as_json_and_never_run_as_code():
    call = {"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}
    assert parse_call(json.dumps(call)) == "print(6 * 7)"
    as_string = {**call, "arguments": json.dumps(call["arguments"])}  # some templates write the arguments so
    assert parse_call("\n" + json.dumps(as_string) + "\n") == "print(6 * 7)"
    bad = [
        "print(6 * 7)",  # bare code
        "__import__('os').system('touch /tmp/pwned')",  # code, not JSON: never evaluated
        json.dumps({**call, "name": "shell"}),
        json.dumps({"name": "code_interpreter", "arguments": {"code": "   "}}),
        json.dumps({"name": "code_interpreter", "arguments": {"program": "print(1)"}}),
        json.dumps({"name": "code_interpreter", "arguments": "not json"}),
        json.dumps([call]),
        "[" * 100_000,  # deep nesting: json's RecursionError, not a crash
        '{"name": "code_interpreter", "arguments": {"code": "print(1)"}',  # unterminated
    ]
    assert [parse_call(b) for b in bad] == [None] * len(bad)


def test_a_call_in_the_template_format_token_in_token_out(tok):
    """Turn 1's input is the prompt (the tool listed), turn 0's ids and the template's turn markers around the
    output, byte for byte; the markers and the output carry mask 0; a call that is not JSON gets the message."""
    rows = [
        Sample("t:0", "math_dapo", [{"role": "user", "content": "What is 48213 - 9917 + 30466?"}], "68762")
    ]
    data = PromptDataset(rows, tok, 1024, "t", [TOOL_SCHEMA])
    call = json.dumps({"name": "code_interpreter", "arguments": {"code": "print(48213 - 9917 + 30466)"}})
    turns = [
        f"Let me compute.\n<tool_call>\n{call}\n</tool_call>",
        "<tool_call>\nprint(1)\n</tool_call>",
        "So the answer is 68762.\nAnswer: 68762",
    ]
    engine = Scripted(turns, marker=b"<tool_response>")
    cfg = _cfg()
    with build_episode(cfg, tok) as episode:
        assert episode.fmt.around_output() == (HEAD, TAIL)
        [[r]], _ = episode.sample(engine, data, [0], SamplingParams(n=1, max_tokens=600, seed=5))
    out1 = HEAD + "68762\n" + TAIL
    out2 = HEAD + MALFORMED_CALL + TAIL
    model = [t.encode() for t in turns]
    ids, mask = turns_and_outputs(turns, [out1, out2])
    assert r.response_ids == ids
    assert r.loss_mask == mask
    prompt = data.prompt_ids[0]
    assert bytes(prompt).decode().startswith("<|im_start|>system\nYou may call functions.")
    first = len(model[0]) + len(out1)
    second = first + len(model[1]) + len(out2)
    assert [c[0] for c in engine.calls] == [[prompt], [prompt + ids[:first]], [prompt + ids[:second]]]
    assert [c[1].stop for c in engine.calls] == [["</tool_call>"]] * 3
    assert r.tool_calls == ["ok", "malformed"] and r.acc and r.score == 1.0


def test_data_inspect_counts_the_listed_tool_in_the_prompt_length(tok, tmp_path, capsys):
    """`dapo data inspect --chat-tools` counts each prompt as the tool run renders it (the template's tool list
    included), so `--max-prompt-length` drops what `dapo train` would; a template that cannot list the tool is
    refused as `dapo train` refuses it (exit 2, the reason on stderr)."""
    from dapo_rl.cli import main
    from dapo_rl.data.convert import inspect_dataset
    from dapo_rl.data.dataset import render_prompt

    f = tmp_path / "q.jsonl"
    f.write_text(json.dumps({"question": "What is 6 * 7?", "answer": "42"}) + "\n")
    msgs = [{"role": "user", "content": "What is 6 * 7?"}]
    plain, listed = (len(render_prompt(tok, msgs, t).encode()) for t in (None, [TOOL_SCHEMA]))
    assert listed > plain + 200  # the schema and its instructions: a byte a token
    assert inspect_dataset(f, tokenizer=tok)["prompt_tokens"]["max"] == plain
    assert inspect_dataset(f, tokenizer=tok, tools=[TOOL_SCHEMA])["prompt_tokens"]["max"] == listed
    for name, t in (("tok", tok), ("plain", _tok("{% for m in messages %}{{ m.content }}{% endfor %}"))):
        t.save_pretrained(tmp_path / name)
        (tmp_path / name / "config.json").write_text('{"model_type": "llama"}')  # a checkpoint's, to load it
    args = ["data", "inspect", str(f), "--tokenizer", str(tmp_path / "tok"), "--json"]
    assert main([*args, "--chat-tools", "--max-prompt-length", str(listed - 1)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["prompt_tokens"]["max"] == listed and report["dropped_at_max_prompt_length"]["rows"] == 1
    assert main(["data", "inspect", str(f), "--tokenizer", str(tmp_path / "plain"), "--chat-tools"]) == 2
    assert "episode.tool.format=chat_template" in capsys.readouterr().err
    assert main(["data", "inspect", str(f), "--chat-tools"]) == 2
    assert "--chat-tools needs --tokenizer" in capsys.readouterr().err
