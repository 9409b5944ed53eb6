"""Data: real shared files in verl's schema, DAPO template detection, reasoning-gym, resumable sampling."""

import json
from pathlib import Path

import pytest

from dapo_rl.data import (
    DAPO_TEMPLATE,
    DataError,
    EpochSampler,
    PromptDataset,
    apply_prompt_template,
    load_samples,
    reasoning_gym_samples,
    render_prompt,
)
from dapo_rl.models.tiny import build_tiny_tokenizer
from dapo_rl.reward import compute_score

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
AIME_DAPO = DATA / "aime24_dapo" / "aime-2024.parquet"
DAPO_17K = DATA / "dapo_math_17k" / "dapo_math_17k.parquet"


def test_aime_parquet_is_already_wrapped_and_not_wrapped_twice():
    raw = load_samples(AIME_DAPO)
    wrapped = load_samples(AIME_DAPO, template="dapo")
    assert len(raw) == 960
    assert raw[0].prompt == wrapped[0].prompt
    assert wrapped[0].prompt[0]["content"].count("Solve the following math problem") == 1
    assert raw[0].data_source == "math_dapo"
    assert raw[0].ground_truth == "540"


def test_dapo_17k_bare_problems_get_the_dapo_template():
    samples = load_samples(DAPO_17K, template="dapo")
    assert len(samples) == 17917
    s = samples[0]
    assert s.ground_truth == "34" and s.data_source == "DAPO-17k"
    bare = load_samples(DAPO_17K)[0].prompt[0]["content"]
    assert s.prompt[0]["content"] == DAPO_TEMPLATE.format(problem=bare)
    # the wrapped prompt survives a second application unchanged
    assert apply_prompt_template(s.prompt, "dapo") == s.prompt


def test_answer_template_appends_one_line_once():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 - 6 ="}]
    out = apply_prompt_template(msgs, "answer")
    assert out[0] == msgs[0] and msgs[1]["content"] == "1 - 6 ="  # input not modified
    assert out[1] == {
        "role": "user",
        "content": '1 - 6 =\nGive the final answer on a last line of the form "Answer: <number>".',
    }
    assert apply_prompt_template(out, "answer") == out  # already asks for an "Answer:" line
    with pytest.raises(ValueError, match="unknown prompt template 'answers'.*answer"):
        apply_prompt_template(msgs, "answers")


def test_tool_template_shows_a_call_exactly_as_the_tool_episode_runs_and_answers_it():
    from dapo_rl.data.solutions import RETOOL_TAGS, tool_output_text
    from dapo_rl.episode.tool import ToolFormat, extract_code

    msgs = [{"role": "user", "content": "12 - 98 ="}]
    out = apply_prompt_template(msgs, "tool")
    text = out[0]["content"]
    assert text.startswith("12 - 98 =\nYou can run Python: write a program between <code> and </code>")
    assert text.endswith('Give the final answer on a last line of the form "Answer: <number>".')
    # the worked call: the code the episode would run, and the output block it would append after it
    call = text[text.index("<code>print") : text.index("</code>\n<interpreter>") + len("</code>")]
    assert extract_code(call, ToolFormat()) == "print(23 + 45)"
    assert call + tool_output_text("68\n", *RETOOL_TAGS[2:]) + "Answer: 68\n" in text
    assert apply_prompt_template(out, "tool") == out  # already offers the tool


def test_jsonl_rows_and_string_prompts(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [
        {"data_source": "math_dapo", "prompt": "What is 1+1?", "reward_model": {"ground_truth": 2}},
        {
            "prompt": [{"role": "user", "content": "2+2?"}],
            "reward_model": {"ground_truth": "4"},
            "extra_info": {"k": 1},
        },
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    s = load_samples(p)
    assert [x.ground_truth for x in s] == ["2", "4"]
    assert s[0].prompt == [{"role": "user", "content": "What is 1+1?"}]
    assert s[1].extra_info == {"k": 1} and s[1].uid == "d:1"


@pytest.mark.parametrize(
    "row, field",
    [
        ({"prompt": "x"}, "reward_model.ground_truth"),
        ({"prompt": "x", "reward_model": {"ground_truth": "  "}}, "reward_model.ground_truth"),
        ({"prompt": 3, "reward_model": {"ground_truth": "1"}}, "'prompt'"),
        ({"prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}}, "'prompt[0]'"),
        ({"prompt": [], "reward_model": {"ground_truth": "1"}}, "'prompt'"),
        (
            {"reward_model": {"ground_truth": "1"}},
            "'prompt' must be a string or a non-empty list of chat messages (missing)",
        ),
        (
            {"prompt": [{"role": 1, "content": "x"}], "reward_model": {"ground_truth": "1"}},
            "'prompt[0].role'",
        ),
        (
            {"prompt": [{"role": "user", "content": " "}], "reward_model": {"ground_truth": "1"}},
            "'prompt[0].content' is empty",
        ),
        ({"prompt": "x", "reward_model": "1"}, "'reward_model' must be an object"),
        (
            {"prompt": "x", "reward_model": {"ground_truth": [1, 2]}},
            "'reward_model.ground_truth' must be a string or a number (got list",
        ),
        (
            {"prompt": "x", "reward_model": {"ground_truth": True}},
            "'reward_model.ground_truth' must be a string or a number (got bool",
        ),
        (
            {"prompt": "x", "reward_model": {"ground_truth": "1"}, "extra_info": [1]},
            "'extra_info' must be an object",
        ),
        (
            {"prompt": "x", "reward_model": {"ground_truth": "1"}, "data_source": 7},
            "'data_source' must be a string",
        ),
        ([1, 2], "expected an object"),
    ],
)
def test_bad_rows_name_file_row_and_field(tmp_path, row, field):
    p = tmp_path / "bad.jsonl"
    good = {"prompt": "ok", "reward_model": {"ground_truth": "1"}}
    p.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError) as e:
        load_samples(p)
    assert "bad.jsonl: line 2" in str(e.value) and field in str(e.value)


def test_missing_file_and_unknown_suffix(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_samples(tmp_path / "nope.parquet")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type"):
        load_samples(tmp_path / "x.csv")


def test_reasoning_gym_samples_score_with_their_own_verifier():
    s = reasoning_gym_samples("chain_sum", 5, 0, {"min_terms": 2, "max_terms": 3}, strip_instruction=True)
    assert s[0].data_source == "reasoning_gym/chain_sum"
    assert not s[0].prompt[0]["content"].startswith("State the final answer")
    assert s[0].prompt[0]["content"].endswith("=")
    r = compute_score(s[0].data_source, f"Answer: {s[0].ground_truth}", s[0].ground_truth, s[0].extra_info)
    assert r["acc"] is True and r["score"] == 1.0
    # the same seed gives the same problems
    assert [
        x.ground_truth for x in reasoning_gym_samples("chain_sum", 5, 0, {"min_terms": 2, "max_terms": 3})
    ] == [x.ground_truth for x in s]


def test_reasoning_gym_seeds_overlap_and_validation_can_leave_training_prompts_out():
    # reasoning-gym seeds item i with seed + i: seed 1's items are seed 0's items shifted by one, so a "held-out"
    # set of another nearby seed repeats training problems (data.val_exclude_train_prompts)
    params = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}
    train = reasoning_gym_samples("chain_sum", 6, 0, params, strip_instruction=True)
    val = reasoning_gym_samples("chain_sum", 6, 1, params, strip_instruction=True)
    assert [x.prompt for x in val[:5]] == [x.prompt for x in train[1:]]
    tok = build_tiny_tokenizer()
    train_ds = PromptDataset(train, tok, 64, "chain_sum")
    val_ds = PromptDataset(val, tok, 64, "chain_sum")
    seen = {tuple(ids) for ids in train_ds.prompt_ids}
    assert val_ds.count_prompts(seen) == 5 and len(val_ds) == 6
    assert val_ds.drop_prompts(seen) == 5
    assert [x.uid for x in val_ds.samples] == ["chain_sum:1:5"] and len(val_ds.prompt_ids) == 1
    with pytest.raises(DataError, match="dataset chain_sum: all 6 prompts are also training prompts"):
        PromptDataset(train, tok, 64, "chain_sum").drop_prompts(seen)


def test_prompt_dataset_drops_and_counts_long_prompts():
    tok = build_tiny_tokenizer()
    samples = load_samples(AIME_DAPO)[:32]
    lengths = [len(tok(render_prompt(tok, s.prompt), add_special_tokens=False)["input_ids"]) for s in samples]
    limit = sorted(lengths)[len(lengths) // 2]
    ds = PromptDataset(samples, tok, limit, "aime")
    assert ds.num_dropped == sum(n > limit for n in lengths) > 0
    assert len(ds) == sum(n <= limit for n in lengths)
    assert all(len(ids) <= limit for ids in ds.prompt_ids)
    with pytest.raises(DataError, match="raise data.max_prompt_length"):
        PromptDataset(samples, tok, 10, "aime")


def test_render_prompt_without_chat_template_is_contents_and_newline():
    tok = build_tiny_tokenizer()
    assert render_prompt(tok, [{"role": "user", "content": "4 + 3 ="}]) == "4 + 3 =\n"


def test_sampler_continues_exactly_after_state_round_trip():
    a = EpochSampler(10, seed=3)
    first = a.next(7)
    state = a.state_dict()
    rest_a = a.next(25)
    b = EpochSampler(10, seed=3)
    b.load_state_dict(state)
    assert b.next(25) == rest_a
    # each epoch is a permutation
    c = EpochSampler(10, seed=3)
    assert sorted(c.next(10)) == list(range(10))
    assert first == EpochSampler(10, seed=3).next(7)
    assert EpochSampler(4, shuffle=False).next(6) == [0, 1, 2, 3, 0, 1]


def test_parquet_with_missing_columns_lists_what_it_has(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"question": ["1+1?"], "answer": ["2"]}), p)
    with pytest.raises(
        DataError, match=r"wrong.parquet: missing column\(s\) prompt, reward_model.*question, answer"
    ):
        load_samples(p)


def test_invalid_json_names_the_file_line(tmp_path):
    p = tmp_path / "broken.jsonl"
    p.write_text('{"prompt": "a", "reward_model": {"ground_truth": "1"}}\n\n{"prompt": \n')
    with pytest.raises(DataError, match=r"broken.jsonl: line 3: not valid JSON"):
        load_samples(p)


def test_invalid_utf8_names_the_file_line(tmp_path):
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(
        b'{"prompt": "ok", "reward_model": {"ground_truth": "1"}}\n{"prompt": "caf\xe9", "reward_model": {"ground_truth": "1"}}\n'
    )
    with pytest.raises(DataError, match=r"latin1.jsonl: line 2: not valid UTF-8"):
        load_samples(p)


def test_unreadable_parquet_names_the_file(tmp_path):
    p = tmp_path / "fake.parquet"
    p.write_text("this is not parquet")
    with pytest.raises(DataError, match=r"fake.parquet: not a readable parquet file"):
        load_samples(p)


def test_parquet_bad_row_names_row_and_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "rows.parquet"
    prompts = [[{"role": "user", "content": "1+1?"}], [{"role": "user", "content": "2+2?"}]]
    pq.write_table(
        pa.table({"prompt": prompts, "reward_model": [{"ground_truth": "2"}, {"ground_truth": ""}]}), p
    )
    with pytest.raises(
        DataError, match=r"rows.parquet: row 1: field 'reward_model.ground_truth' is missing or empty"
    ):
        load_samples(p)


def test_skip_invalid_skips_and_collects_bad_rows(tmp_path):
    p = tmp_path / "mixed.jsonl"
    good = {"prompt": "ok", "reward_model": {"ground_truth": "1"}}
    p.write_bytes(
        (json.dumps(good) + "\n" + json.dumps({"prompt": "x"}) + "\n").encode()
        + b"{not json\n"
        + b'{"prompt": "\xff"}\n'
        + (json.dumps(good) + "\n").encode()
    )
    errors: list[DataError] = []
    samples = load_samples(p, errors=errors)
    assert [s.uid for s in samples] == ["mixed:0", "mixed:2"]  # uid counts rows that parsed as JSON
    assert [str(e).split(": ", 1)[1].split(":")[0] for e in errors] == ["line 3", "line 4", "line 2"]
    assert "reward_model.ground_truth" in str(errors[2])
    with pytest.raises(DataError):  # a missing file still stops the run
        load_samples(tmp_path / "nope.jsonl", errors=errors)


def test_directory_given_as_a_data_file_says_so(tmp_path):
    with pytest.raises(DataError, match="is a directory; give a .parquet or .jsonl file"):
        load_samples(tmp_path)


def test_plain_prompts_keep_the_tokenizers_bos_and_the_embedded_ones_are_unchanged():
    """A tokenizer without a chat template whose post-processor adds a BOS (Llama-style base checkpoints) gets it
    at the start of every prompt; the embedded byte tokenizer adds nothing (prompts are the UTF-8 bytes)."""
    from tokenizers.processors import TemplateProcessing

    from dapo_rl.data.dataset import PromptDataset, Sample

    samples = [Sample("t:0", "t", [{"role": "user", "content": "1 + 2 ="}], "3")]
    tok = build_tiny_tokenizer()
    assert PromptDataset(samples, tok, 64, "t").prompt_ids == [list(b"1 + 2 =\n")]
    tok.add_special_tokens({"bos_token": "<s>"})
    tok._tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 258)])
    assert PromptDataset(samples, tok, 64, "t").prompt_ids == [[258, *b"1 + 2 =\n"]]
