"""Loading a local Hugging Face checkpoint: its tokenizer, its context length and its causal LM, each failure a
`ConfigError` naming the setting that gave the path. Shared by the actor, the rollout engines, LoRA's export and the
CLI."""

from __future__ import annotations

import os

import torch

from dapo_rl.config import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""`model.dtype` names and their torch dtypes."""


def load_tokenizer(path: str, trust_remote_code: bool = False, setting: str = "model.path"):
    """Load and check the tokenizer of a local Hugging Face checkpoint, without its weights (cheap, so every
    checkpoint problem is reported before any heavy work).

    Args:
        path: checkpoint directory (config.json, weights, tokenizer files).
        trust_remote_code: allow code shipped with the checkpoint.
        setting: how error messages name the path (`model.path`, or `--model` for `dapo eval`).

    Returns:
        The tokenizer; its pad token falls back to eos when missing.

    Raises:
        ConfigError: the path does not exist or is not a Hugging Face checkpoint, or the tokenizer cannot be loaded
            or has no eos token.
    """
    from transformers import AutoTokenizer

    hint = _checkpoint_hint(path)
    if not os.path.isdir(path):
        raise ConfigError(f"{setting}={path}: no such directory (give a local Hugging Face checkpoint){hint}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(
            f"{setting}={path}: no config.json, so not a Hugging Face checkpoint directory{hint}"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{setting}={path}: cannot load a tokenizer from it ({e})") from e
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"{setting}={path}: the tokenizer has no eos token, so responses could never stop")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _checkpoint_hint(path: str) -> str:
    """What to give instead of `path` when it is a run's or a checkpoint's directory rather than a model's (`; ...`),
    or ""."""
    model = os.path.join(path, "model")
    if os.path.isfile(os.path.join(model, "config.json")):
        return f"; {path} is a checkpoint: give its model/ folder, {model}"
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return f"; {path} is a run directory: give a checkpoint's model/ folder, {path}/checkpoints/global_step_N/model"
    lora = next(
        (
            d
            for d in (path, os.path.dirname(os.path.normpath(path)))
            if os.path.isdir(os.path.join(d, "adapter"))
        ),
        None,
    )
    if lora is not None:
        return f"; {lora} is a LoRA checkpoint without a merged model: `dapo export {lora}` writes its model/"
    return ""


def model_context_length(path: str, trust_remote_code: bool = False) -> int | None:
    """The model's context in tokens (`max_position_embeddings` of its config.json), read without the weights;
    `None` when the config does not say.

    Raises:
        ConfigError: the config cannot be read.
    """
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.path={path}: cannot read its config.json ({e})") from e
    return getattr(config, "max_position_embeddings", None)


def load_model(
    path: str,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    setting: str = "model.path",
    attn_implementation: str | None = None,
):
    """Load the causal LM of a local Hugging Face checkpoint (`float32` or `bfloat16`), with transformers' attention
    kernel `attn_implementation` (None: transformers' default, `sdpa`).

    Raises:
        ConfigError: the weights cannot be loaded as a causal LM (the message names `setting`), or the attention
            kernel is unknown or not installed (the message names `model.attn_implementation`).
    """
    from transformers import AutoModelForCausalLM

    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    try:
        return AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code, **kwargs
        )
    except (OSError, ValueError, ImportError) as e:
        if attn_implementation is not None and (
            attn_implementation in str(e) or "attention" in str(e).lower()
        ):
            raise ConfigError(f"model.attn_implementation={attn_implementation}: {e}") from e
        raise ConfigError(f"{setting}={path}: cannot load a causal LM from it ({e})") from e
