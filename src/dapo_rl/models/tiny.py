"""The project's own tiny model: a byte-level tokenizer and a small Qwen2 model, built without any download.

The tokenizer is a byte-level BPE with the 256 byte symbols and no merges: one token per byte, so every string
(LaTeX, non-ASCII) tokenizes without unknown tokens and decodes back exactly. It is built the way transformers'
`Qwen2Tokenizer` builds itself (same pre-tokenizer, normaliser and decoder), because `AutoTokenizer` loads any
checkpoint whose config says `qwen2` as a `Qwen2Tokenizer` whatever the saved class: a tokenizer of another
construction would silently lose spaces and newlines on reload (see CALIBRATION.md).
"""

from __future__ import annotations

import os
from typing import Any

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map used by byte-level BPE."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def build_tiny_tokenizer() -> Any:
    """A byte-level tokenizer (258 ids: 256 bytes, `<|endoftext|>` = eos, `<|pad|>` = pad).

    Returns:
        A transformers `Qwen2Tokenizer` that round-trips any UTF-8 text and survives `save_pretrained` +
        `AutoTokenizer.from_pretrained` unchanged.
    """
    from transformers import Qwen2Tokenizer

    byte_map = _bytes_to_unicode()
    vocab = {byte_map[b]: b for b in range(256)}
    vocab[EOS_TOKEN] = 256
    vocab[PAD_TOKEN] = 257
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    tok.padding_side = "left"
    return tok


def build_tiny_model(
    vocab_size: int = 258,
    hidden_size: int = 192,
    num_layers: int = 3,
    num_heads: int = 4,
    intermediate_size: int = 576,
    max_position_embeddings: int = 4096,
    eos_token_id: int = 256,
    pad_token_id: int = 257,
    seed: int = 0,
    num_kv_heads: int | None = None,
    tie_word_embeddings: bool = True,
) -> Any:
    """A randomly initialised `Qwen2ForCausalLM` (defaults: 1.5M parameters, tied embeddings, fp32).

    Rotary positions make a long `max_position_embeddings` free in parameters, so real-data prompts (1-2k
    characters of LaTeX) fit. `num_kv_heads` (default: `num_heads`) < `num_heads` gives grouped-query attention;
    `tie_word_embeddings=False` gives the LM head its own weight (as Qwen2.5-7B and larger have).
    The benchmarks' larger models are this one with other sizes (hidden 768 x 12 layers: 113M parameters).
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        use_cache=True,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def save_tiny_checkpoint(path: str | os.PathLike, **model_kwargs: Any) -> Any:
    """Write `build_tiny_model(**model_kwargs)` and the byte tokenizer to `path` as a Hugging Face checkpoint.

    Returns:
        The tokenizer (`build_tiny_tokenizer`).
    """
    tok = build_tiny_tokenizer()
    build_tiny_model(**model_kwargs).save_pretrained(path)
    tok.save_pretrained(path)
    return tok
