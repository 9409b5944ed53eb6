"""Supervised warm-up (`dapo sft`): builds the embedded base model that `dapo train` starts from.

A tiny Qwen2 model (see `dapo_rl.models.tiny`) learns the response format `Answer: N<eos>` (or worked steps before
it, `sft.completion`, see `dapo_rl.data.solutions`) on a reasoning-gym task,
just long enough to solve a fraction of the problems (20-70%), so that RL has groups with mixed rewards to learn
from. The model is cached, keyed by a hash of its recipe, so later runs start at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from dapo_rl.config import SFTConfig
from dapo_rl.data import reasoning_gym_samples, render_prompt
from dapo_rl.data.solutions import sft_completions, tool_output_spans
from dapo_rl.paths import cache_root
from dapo_rl.perf import choose_attn_implementation, choose_autocast_dtype

_ADDED_LATER = {
    "completion": "answer",
    "steps_fraction": 0.5,
    "autocast_dtype": "none",
    "attn_implementation": "sdpa",
    # the chat-data settings (`dapo_rl.sft_chat`), which the embedded warm-up does not use
    "model_path": "",
    "train_files": [],
    "messages_column": "messages",
    "prompt_column": "prompt",
    "response_column": "response",
    "epochs": 0.0,
    "lr_scheduler": "constant",
    "max_length": 1024,
    "packing": False,
    "save_freq": 100,
    "micro_batch_size": 0,
}


def embedded_model_dir(cfg: SFTConfig) -> Path:
    """Where the embedded base model for this SFT recipe lives (a hash of the recipe names it)."""
    if cfg.output_dir:
        return Path(cfg.output_dir)
    recipe = asdict(cfg)
    for key, default in _ADDED_LATER.items():  # settings newer than the cache keep older models' names
        if recipe.get(key) == default:
            recipe.pop(key)
    # warm-ups before 2026-12-06 also trained on the tool's output: a key of their own
    if cfg.completion in ("tool", "tool_mixed"):
        recipe["tool_output_loss"] = "masked"
    # code warm-ups before 2026-12-07 wrote `def f(x):` with an indented return: a key of their own
    if cfg.completion in ("code", "code_mixed"):
        recipe["code_form"] = "lambda"
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / "models" / f"tiny-{cfg.task.task}-{digest}"


def fresh_tiny_model(cfg: SFTConfig):
    """A newly initialised tiny model (`sft.hidden_size`, `num_layers`, `num_heads`, `intermediate_size`,
    `max_position_embeddings`, seed `sft.seed`) and the byte-level tokenizer: `(model, tokenizer)`."""
    from dapo_rl.models.tiny import build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    model = build_tiny_model(
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        seed=cfg.seed,
    )
    return model, tok


def target_ids(tok, completion: str) -> tuple[list[int], list[bool]]:
    """The token ids of a warm-up target and which of them the loss trains on: the tool's output blocks
    (`tool_output_spans`) are tokenized alone, as the tool episode appends them, and not trained on, as RL's loss
    mask leaves them; a target without tool output is tokenized whole and trained on throughout."""
    ids: list[int] = []
    trained: list[bool] = []
    for text, train in tool_output_spans(completion):
        # the tool's pieces as the episode encodes them: special-token spellings stay text
        part = tok(text, add_special_tokens=False, split_special_tokens=not train)["input_ids"]
        ids += part
        trained += [train] * len(part)
    return ids, trained


def _padded_rows(
    idx: list[int],
    p_ids: list[list[int]],
    c_ids: list[list[int]],
    pad: int,
    c_trained: list[list[bool]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(input_ids, attention_mask, labels)`, each `(len(idx), width)` int64, of rows `idx` (prompt + target),
    right-padded to the longest of them; labels are the target tokens, -100 elsewhere (loss on the target only)
    and on target tokens whose `c_trained` entry is False (a tool's output)."""
    seqs = [p_ids[i] + c_ids[i] for i in idx]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, (i, s) in enumerate(zip(idx, seqs)):
        ids[r, : len(s)] = torch.tensor(s)
        mask[r, : len(s)] = 1
        target = torch.tensor(c_ids[i])
        if c_trained is not None:
            target = target.masked_fill(~torch.tensor(c_trained[i], dtype=torch.bool), -100)
        labels[r, len(p_ids[i]) : len(s)] = target
    return ids, mask, labels


def batch_backward(
    model,
    idx: list[int],
    p_ids: list[list[int]],
    c_ids: list[list[int]],
    pad: int,
    micro_batch_size: int = 0,
    compute: torch.dtype = torch.float32,
    c_trained: list[list[bool]] | None = None,
) -> torch.Tensor:
    """Forward and backward of one warm-up batch: adds to `model`'s `.grad` the gradient of the mean token loss
    over the targets of rows `idx`.

    `micro_batch_size` 0 (or at least the batch): one pass, padded to the longest row. Otherwise the rows, sorted
    by length, go through passes of that many rows, each padded to its own longest row, and each pass's summed
    loss is divided by the whole batch's target tokens (transformers' `num_items_in_batch`): the same gradient,
    fewer padded positions computed.

    Args:
        model: a transformers causal LM in train mode.
        idx: row indices into `p_ids` / `c_ids` (prompt and target token ids).
        pad: the pad token id.
        micro_batch_size: rows per pass (0: all).
        compute: `torch.bfloat16` runs the passes under CPU autocast; fp32 otherwise.
        c_trained: per target token, whether the loss trains on it (`target_ids`); None: all of them.

    Returns:
        The batch's mean token loss, a detached scalar.
    """
    bf16 = compute == torch.bfloat16
    if micro_batch_size <= 0 or micro_batch_size >= len(idx):
        ids, mask, labels = _padded_rows(idx, p_ids, c_ids, pad, c_trained)
        with torch.autocast("cpu", dtype=compute, enabled=bf16):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        return loss.detach()
    targets = sum(sum(c_trained[i]) if c_trained is not None else len(c_ids[i]) for i in idx)
    ranked = sorted(idx, key=lambda i: len(p_ids[i]) + len(c_ids[i]))
    loss = torch.zeros(())
    for k in range(0, len(ranked), micro_batch_size):
        ids, mask, labels = _padded_rows(ranked[k : k + micro_batch_size], p_ids, c_ids, pad, c_trained)
        with torch.autocast("cpu", dtype=compute, enabled=bf16):
            part = model(input_ids=ids, attention_mask=mask, labels=labels, num_items_in_batch=targets).loss
        part.backward()
        loss = loss + part.detach()
    return loss


def run_sft(cfg: SFTConfig, log=print) -> Path:
    """Train the tiny base model and save it (safetensors + tokenizer) to `embedded_model_dir(cfg)`.

    The write is atomic: a temporary directory renamed into place, so an interrupted run leaves no half model.

    Returns:
        The model directory, loadable with `AutoModelForCausalLM.from_pretrained`.
    """
    out_dir = embedded_model_dir(cfg)
    torch.manual_seed(cfg.seed)
    model, tok = fresh_tiny_model(cfg)
    t = cfg.task
    samples = reasoning_gym_samples(t.task, t.size, t.seed, dict(t.params), t.strip_instruction)
    prompts = [render_prompt(tok, s.prompt) for s in samples]
    comps = [
        c + tok.eos_token for c in sft_completions(samples, cfg.completion, cfg.steps_fraction, cfg.seed)
    ]
    p_ids = tok(prompts, add_special_tokens=False)["input_ids"]
    c_ids, c_trained = map(list, zip(*(target_ids(tok, c) for c in comps)))
    autocast, why = choose_autocast_dtype(cfg.autocast_dtype, "cpu", key="sft.autocast_dtype")
    compute = torch.bfloat16 if autocast == "bfloat16" else torch.float32
    attn, attn_why = choose_attn_implementation(
        cfg.attn_implementation,
        "cpu",
        compute,
        heads=cfg.num_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        rows=cfg.batch_size,
        seq_len=max(len(p) + len(c) for p, c in zip(p_ids, c_ids)),
    )
    model.set_attn_implementation(attn)
    if cfg.autocast_dtype != "none" or cfg.attn_implementation != "sdpa":
        log(f"sft: {why}; {attn_why}")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(cfg.warmup_steps, 1)))
    gen = torch.Generator().manual_seed(cfg.seed)
    pad = tok.pad_token_id
    model.train()
    start = time.time()
    for step in range(cfg.steps):
        idx = torch.randint(len(samples), (cfg.batch_size,), generator=gen).tolist()
        opt.zero_grad(set_to_none=True)
        loss = batch_backward(model, idx, p_ids, c_ids, pad, cfg.micro_batch_size, compute, c_trained)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        done = step + 1
        if done == 1 or done % 25 == 0 or done == cfg.steps:  # about every 15 s on 2 cores
            spent = time.time() - start
            left = f", about {spent / done * (cfg.steps - done):.0f}s left" if done < cfg.steps else ""
            log(f"sft step {done:4d}/{cfg.steps}  loss {loss.item():.4f}  {spent:.0f}s{left}")
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.eval()
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "sft_recipe.json").write_text(json.dumps(asdict(cfg), indent=2))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    log(f"sft: saved the base model to {out_dir} ({time.time() - start:.0f}s)")
    return out_dir


def ensure_embedded_model(cfg: SFTConfig, log=print) -> Path:
    """The embedded base model's directory, training it first (`run_sft`) when it is not cached yet.

    Logs one line either way: where the cached model is (and that deleting it rebuilds it), or that it is being
    built.
    """
    path = embedded_model_dir(cfg)
    if (path / "config.json").is_file():
        log(f"using the cached embedded base model {path.name} ({path}; delete it to rebuild)")
        return path
    log(f"building the embedded base model (supervised warm-up, {cfg.steps} steps; cached for later runs)")
    return run_sft(cfg, log=log)
