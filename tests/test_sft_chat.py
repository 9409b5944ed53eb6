"""`dapo sft` on chat data (TRL's SFTTrainer underneath): examples rendered as `dapo train` renders prompts, every
assistant turn a target; a real run of a fresh tiny model, SIGKILLed and resumed; a saved checkpoint fine-tuned."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from e2e import dapo, rows_of

from dapo_rl.config import SFTConfig
from dapo_rl.data.dataset import DataError
from dapo_rl.models.tiny import build_tiny_tokenizer
from dapo_rl.sft_chat import chat_examples

pytest.importorskip("trl", reason="TRL is not installed (pip install 'dapo-rl[sft]')")


def test_every_assistant_turn_is_a_target_rendered_as_in_rl():
    tok = build_tiny_tokenizer()  # no chat template: contents joined by blank lines, then a newline
    rows = [
        (
            "row 0",
            {
                "messages": [
                    {"role": "user", "content": "1 + 2 ="},
                    {"role": "assistant", "content": "Answer: 3"},
                    {"role": "user", "content": "and + 4 ="},
                    {"role": "assistant", "content": "Answer: 7"},
                ]
            },
        ),
        ("row 1", {"prompt": "5 - 1 =", "response": "Answer: 4"}),
    ]
    ex = chat_examples(rows, tok, SFTConfig(), "chat.jsonl")
    assert ex == [
        {"prompt": "1 + 2 =\n", "completion": "Answer: 3"},
        {"prompt": "1 + 2 =\n\nAnswer: 3\n\nand + 4 =\n", "completion": "Answer: 7"},
        {"prompt": "5 - 1 =\n", "completion": "Answer: 4"},
    ]
    cfg = SFTConfig(prompt_column="q", response_column="a")
    assert chat_examples([("row 0", {"q": "2 + 2 =", "a": "4"})], tok, cfg, "f") == [
        {"prompt": "2 + 2 =\n", "completion": "4"}
    ]
    bad = [
        ({"messages": [{"role": "user", "content": "x"}]}, "row 3: field 'messages' has no assistant turn"),
        ({"messages": [{"role": "user", "content": 5}]}, r"row 3: field 'messages\[0\]' must be a message"),
        (
            {"question": "x", "answer": "y"},
            "row 3: field 'prompt' is missing or not text .*the row has question, answer",
        ),
    ]
    for row, message in bad:
        with pytest.raises(DataError, match=f"chat.jsonl: {message}"):
            chat_examples([("row 3", row)], tok, SFTConfig(), "chat.jsonl")


def _chat_file(path, n=400):
    from dapo_rl.data import reasoning_gym_samples

    rows = reasoning_gym_samples("chain_sum", n, 1000, {"min_terms": 2, "max_terms": 2}, True)
    path.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": s.prompt[0]["content"]},
                        {"role": "assistant", "content": f"Answer: {s.ground_truth}"},
                    ]
                }
            )
            + "\n"
            for s in rows
        )
    )
    return path


@pytest.mark.slow
def test_fresh_tiny_model_killed_resumed_then_a_checkpoint_fine_tuned(tmp_path):
    data = _chat_file(tmp_path / "chat.jsonl")
    out = tmp_path / "run"
    args = [
        "sft",
        f"sft.train_files=[{data}]",
        f"sft.output_dir={out}",
        "sft.steps=40",
        "sft.batch_size=16",
        "sft.warmup_steps=5",
        "sft.save_freq=10",
        "sft.lr_scheduler=cosine",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dapo_rl.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300

    def logged() -> int:
        return len(rows_of(out)) if (out / "metrics.jsonl").exists() else 0

    while not (out / "checkpoints" / "checkpoint-10").is_dir() or logged() < 14:
        assert proc.poll() is None and time.time() < deadline, (
            proc.stderr.read()[-3000:] if proc.stderr else ""
        )
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)  # mid-run, after a checkpoint, with steps logged past it
    proc.wait()
    assert not (out / "model").exists()
    r = dapo(*args)  # without --resume: refused, nothing touched
    assert r.returncode == 2 and "already holds a run; use --resume" in r.stderr
    r = dapo(*args, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(out)
    assert [x["step"] for x in rows] == list(range(1, 41))  # the steps after the checkpoint were redone, once
    assert rows[-1]["train/loss"] < rows[0]["train/loss"] / 2
    assert rows[-1]["train/lr"] < rows[20]["train/lr"] < rows[6]["train/lr"]  # cosine decay after the warm-up
    assert (out / "model" / "config.json").is_file() and (out / "sft_dynamics.png").stat().st_size > 5_000

    # fine-tune the saved checkpoint further (a real Hugging Face model directory)
    r = dapo(
        "sft",
        f"sft.train_files=[{data}]",
        f"sft.output_dir={tmp_path / 'again'}",
        f"sft.model_path={out / 'model'}",
        "sft.steps=5",
        "sft.batch_size=16",
        "sft.warmup_steps=0",
        "sft.save_freq=0",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    again = rows_of(tmp_path / "again")
    assert (
        len(again) == 5 and again[0]["train/loss"] < rows[0]["train/loss"] / 2
    )  # it starts from the trained model
