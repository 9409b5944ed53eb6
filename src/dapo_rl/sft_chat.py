"""`dapo sft` on chat data for any Hugging Face causal LM: the cold-start stage before RL (MiroMind-M1's SFT, DeepSeek-R1's
cold start), through TRL's `SFTTrainer` (transformers' `Trainer` underneath: epochs or steps, warm-up + constant or
cosine LR, checkpoints, resume).

Each example is rendered as `dapo train` renders prompts (`dapo_rl.data.render_prompt`: the model's chat template
with the generation prompt, or the plain join for a tokenizer without one), so the model learns on the same text it
will be prompted with in RL. Every assistant turn is a target: a conversation with k assistant messages gives k
(prompt, completion) examples, the prompt being everything before that turn; the loss covers completion tokens only
(TRL's `completion_only_loss`), eos appended.

Run directory (`sft.output_dir`): `model/` (the final Hugging Face checkpoint, written atomically), `checkpoints/`
(the Trainer's `checkpoint-<step>`, for `--resume`), `metrics.jsonl` (`train/loss`, `train/lr`, `train/grad_norm`,
`train/epoch` per step), `sft_dynamics.png`, `config.yaml`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from dapo_rl.config import ConfigError, SFTConfig
from dapo_rl.data.dataset import DataError, render_prompt


def chat_examples(rows: list[tuple[str, Any]], tokenizer: Any, cfg: SFTConfig, source: str) -> list[dict]:
    """`{"prompt", "completion"}` texts from chat rows.

    Args:
        rows: `(where, row)` pairs (`row N`, 0-based).
        tokenizer: renders prompts (`render_prompt`).
        cfg: `messages_column` (a list of `{"role", "content"}`; each assistant turn a target) or
            `prompt_column` + `response_column` (one user turn, one target).
        source: the file, for error messages.

    Raises:
        DataError: a row without the columns, a message that is not `{"role", "content"}` text, or a conversation
            without an assistant turn after a user turn (file, row and field named).
    """
    out = []
    for where, row in rows:
        at = f"{source}: {where}"
        if not isinstance(row, dict):
            raise DataError(f"{at}: expected an object")
        msgs = row.get(cfg.messages_column)
        if msgs is not None:
            if not isinstance(msgs, list) or not msgs:
                raise DataError(
                    f"{at}: field {cfg.messages_column!r} must be a non-empty list of chat messages"
                )
            for j, m in enumerate(msgs):
                if not (
                    isinstance(m, dict)
                    and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)
                ):
                    raise DataError(
                        f"{at}: field '{cfg.messages_column}[{j}]' must be a message with string 'role' and 'content'"
                    )
            targets = [j for j, m in enumerate(msgs) if m["role"] == "assistant" and j > 0]
            if not targets:
                raise DataError(
                    f"{at}: field {cfg.messages_column!r} has no assistant turn after a user turn"
                )
            for j in targets:
                prompt = [{"role": m["role"], "content": m["content"]} for m in msgs[:j]]
                out.append({"prompt": render_prompt(tokenizer, prompt), "completion": msgs[j]["content"]})
            continue
        p, r = row.get(cfg.prompt_column), row.get(cfg.response_column)
        for name, v in ((cfg.prompt_column, p), (cfg.response_column, r)):
            if not isinstance(v, str) or not v.strip():
                have = ", ".join(row)
                raise DataError(
                    f"{at}: field {name!r} is missing or not text (no {cfg.messages_column!r} either; the row has "
                    f"{have}); name the columns with sft.messages_column or sft.prompt_column / sft.response_column"
                )
        out.append({"prompt": render_prompt(tokenizer, [{"role": "user", "content": p}]), "completion": r})
    return out


def _read_rows(path: str) -> list[tuple[str, Any]]:
    from dapo_rl.data.convert import read_dataset

    ds = read_dataset(path)
    return [(f"row {i}", r) for i, r in enumerate(ds)]


def _base_model(cfg: SFTConfig):
    """The model to fine-tune and its tokenizer: `sft.model_path`, or a fresh tiny model (`sft.hidden_size`, ...)."""
    from transformers import AutoModelForCausalLM

    if cfg.model_path:
        from dapo_rl.models.hf import load_tokenizer
        from dapo_rl.models.smollm2 import resolve_model_alias

        path = resolve_model_alias(cfg.model_path)
        tok = load_tokenizer(path, setting="sft.model_path")
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
        except (OSError, ValueError) as e:
            raise ConfigError(f"sft.model_path={cfg.model_path}: cannot load the model ({e})") from e
        return model, tok
    from dapo_rl.sft import fresh_tiny_model

    return fresh_tiny_model(cfg)


def run_chat_sft(cfg: SFTConfig, resume: bool = False, log=print, config_yaml: str = "") -> Path:
    """Fine-tune `sft.model_path` (or a fresh tiny model) on `sft.train_files`; returns `<output_dir>/model`.

    Raises:
        ConfigError: no `sft.output_dir`, a run directory that already holds a run (without `resume`), `resume`
            without a checkpoint, the `trl` package missing, or a model that cannot be loaded.
        DataError: unreadable data or a malformed row (file, row and field named).
    """
    try:
        import trl
    except ImportError as e:
        raise ConfigError(
            f"dapo sft on chat data (sft.train_files) needs TRL ({e}): pip install 'dapo-rl[sft]'"
        ) from e
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from dapo_rl.checkpoint import truncate_metrics

    if not cfg.output_dir:
        raise ConfigError("sft.train_files needs sft.output_dir (where the run and its model go)")
    out = Path(cfg.output_dir)
    ckpts = out / "checkpoints"
    has_ckpt = ckpts.is_dir() and any(ckpts.glob("checkpoint-*"))
    if resume and not has_ckpt:
        raise ConfigError(f"--resume: {ckpts} holds no checkpoint-* to resume from")
    if not resume and out.exists() and any(out.iterdir()):
        raise ConfigError(
            f"sft.output_dir={out} already holds a run; use --resume to continue it or choose another"
        )
    model, tok = _base_model(cfg)
    examples = []
    for f in cfg.train_files:
        examples += chat_examples(_read_rows(f), tok, cfg, f)
    if not examples:
        raise DataError(f"sft.train_files {cfg.train_files}: no examples")
    out.mkdir(parents=True, exist_ok=True)
    if config_yaml:
        (out / "config.yaml").write_text(config_yaml)
    metrics = out / "metrics.jsonl"

    class Metrics(TrainerCallback):
        """metrics.jsonl rows in `dapo train`'s style, one per logged step."""

        def on_train_begin(self, args, state, control, **kw):
            if metrics.exists():  # rows after the resumed checkpoint come again
                truncate_metrics(metrics, state.global_step)

        def on_log(self, args, state, control, logs=None, **kw):
            logs = logs or {}
            if "loss" not in logs:
                return
            row = {"step": state.global_step}
            for src, dst in (
                ("loss", "train/loss"),
                ("learning_rate", "train/lr"),
                ("grad_norm", "train/grad_norm"),
                ("epoch", "train/epoch"),
            ):
                if src in logs:
                    row[dst] = float(logs[src])
            with open(metrics, "a") as fh:
                fh.write(json.dumps(row) + "\n")

    cuda = torch.cuda.is_available()
    schedule = {"constant": "constant_with_warmup", "cosine": "cosine"}[cfg.lr_scheduler]
    args = trl.SFTConfig(
        output_dir=str(ckpts),
        num_train_epochs=cfg.epochs if cfg.epochs > 0 else 1.0,
        max_steps=cfg.steps if cfg.epochs <= 0 else -1,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.lr,
        lr_scheduler_type=schedule,
        warmup_steps=cfg.warmup_steps,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=1,
        save_steps=cfg.save_freq if cfg.save_freq > 0 else 10**9,
        save_total_limit=2,
        report_to=[],
        use_cpu=not cuda,
        bf16=cuda and cfg.autocast_dtype in ("auto", "bfloat16"),
        seed=cfg.seed,
        data_seed=cfg.seed,
        max_length=cfg.max_length,
        packing=cfg.packing,
        completion_only_loss=True,
        eos_token=tok.eos_token,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = trl.SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(examples),
        processing_class=tok,
        callbacks=[Metrics()],
    )
    log(
        f"sft: {len(examples)} examples from {len(cfg.train_files)} file(s); {'resuming' if resume else 'starting'}"
    )
    trainer.train(resume_from_checkpoint=True if resume else None)
    final = out / "model"
    tmp = out / f"model.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.save_model(str(tmp))
    tok.save_pretrained(str(tmp))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    from dapo_rl.plotting import plot_sft

    plot_sft(metrics, out / "sft_dynamics.png")
    log(f"sft: saved {final}")
    return final
