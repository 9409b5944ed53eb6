"""Throughput accounting: the machine's matmul peak, measured, and model FLOPs utilisation (MFU).

MFU here is the training arithmetic a step needed divided by what the measured peak could have done in the time
the update took: 6N FLOPs per trained token (forward + backward, Kaplan et al. 2020) plus 2N per token of the
pi_old recompute forward, N the parameter count (under LoRA 4N + 2T per trained token, T the adapters': the
frozen weights get no gradient), over `time/update_s + time/old_log_prob_s`, against the peak
of one large matmul in the compute dtype on this device (measured, not a datasheet figure: a CPU without native
bf16 reaches a small fraction of its fp32 rate in bf16).
"""

from __future__ import annotations

import time

import torch

__all__ = [
    "BF16_MIN_SPEEDUP",
    "EAGER_MIN_SPEEDUP",
    "choose_attn_implementation",
    "choose_autocast_dtype",
    "matmul_peak_flops",
    "training_mfu",
]

BF16_MIN_SPEEDUP = 1.3
"""`actor.autocast_dtype=auto` picks bf16 only when a bf16 matmul runs at least this much faster than fp32."""

EAGER_MIN_SPEEDUP = 1.2
"""`model.attn_implementation=auto` picks `eager` over `sdpa` on a CPU only when it runs the probe this much faster."""

EAGER_MAX_LEN = 1024
"""Longest sequence for which `auto` considers `eager` at all: its (rows, heads, T, T) score tensor grows as T^2."""


def matmul_peak_flops(
    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, size: int = 0
) -> float:
    """FLOP/s of the best of several `size` x `size` matmuls on `device` in `dtype` (one process, its threads); one
    matmul only when the first takes over half a second.

    Args:
        device: where to measure.
        dtype: compute dtype (`torch.float32`, `torch.bfloat16`).
        size: matrix side; 0 picks 1024 on CPU and 8192 on GPU.

    Returns:
        FLOP/s (2 size^3 per matmul), a float.
    """
    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    torch.mm(a, b)
    sync()
    best = time.perf_counter() - t0
    if best > 0.5:  # a dtype without native support (bf16 on an AVX2 CPU): one slow matmul says enough
        return 2.0 * size**3 / best
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / best


def training_mfu(
    n_params: int,
    trained_tokens: float,
    recomputed_tokens: float,
    seconds: float,
    peak_flops: float,
    trainable_params: int | None = None,
) -> float:
    """Model FLOPs utilisation of a policy update (see the module docstring).

    Args:
        n_params: parameters of the model (N).
        trained_tokens: prompt + response tokens through forward and backward, all ranks.
        recomputed_tokens: tokens through the no-grad pi_old forward (0 when it was skipped), all ranks.
        seconds: wall time of the update (and the recompute).
        peak_flops: FLOP/s of all ranks together (`matmul_peak_flops` x world size).
        trainable_params: parameters that get gradients (T; None: all N). A trained token costs 2N forward, 2N for
            the activations' gradients and 2T for the weights' gradients: 6N in full, 4N + 2T under LoRA.

    Returns:
        A fraction in [0, 1] on a sane measurement (NaN when `seconds` or `peak_flops` is 0).
    """
    if seconds <= 0 or peak_flops <= 0:
        return float("nan")
    t = n_params if trainable_params is None else trainable_params
    return (
        ((4.0 * n_params + 2.0 * t) * trained_tokens + 2.0 * n_params * recomputed_tokens)
        / seconds
        / peak_flops
    )


def choose_autocast_dtype(
    setting: str, device: torch.device | str, measure=None, key: str = "actor.autocast_dtype"
) -> tuple[str, str]:
    """Resolve `actor.autocast_dtype` (`none`, `bfloat16` or `auto`) for this device, measuring rather than guessing.

    `auto` means bf16 only where it is faster: one fp32 and one bf16 matmul are timed on `device` (256 x 256 on a
    CPU, where a bf16 matmul without native support runs at ~0.3 GFLOP/s and a larger probe would take seconds),
    and bf16 is chosen when it runs at least :data:`BF16_MIN_SPEEDUP` x faster -- GPUs, and CPUs with native bf16
    (AVX512-BF16, AMX); elsewhere fp32 is kept. `none` and `bfloat16` are kept as they are, without measuring.

    Args:
        setting: the configured value.
        device: the actor's device.
        measure: ``measure(device, dtype) -> FLOP/s``; default :func:`matmul_peak_flops` at the probe size.
        key: the setting's name in the reason (`sft.autocast_dtype` for the warm-up).

    Returns:
        ``(dtype, reason)``: ``"bfloat16"`` or ``"none"``, and a sentence for the log.
    """
    if setting in ("none", "bfloat16"):
        return setting, f"{key}={setting}"
    device = torch.device(device)
    size = 256 if device.type == "cpu" else 0
    measure = measure or (lambda d, t: matmul_peak_flops(d, t, size=size))
    fp32, bf16 = measure(device, torch.float32), measure(device, torch.bfloat16)
    figures = f"bf16 matmul {bf16 / 1e9:.1f} GFLOP/s, fp32 {fp32 / 1e9:.1f} GFLOP/s on this {device.type}"
    if bf16 >= BF16_MIN_SPEEDUP * fp32:
        return "bfloat16", f"bf16 compute chosen by {key}=auto: {figures}"
    return "none", f"fp32 compute chosen by {key}=auto: no native bf16 here ({figures})"


def time_attention(
    kind: str, rows: int, heads: int, seq_len: int, head_dim: int, dtype: torch.dtype, repeats: int = 3
) -> float:
    """Seconds (best of `repeats`, after one warm-up) of one causal self-attention forward + backward on the CPU,
    as transformers computes it: `eager` (q k^T, additive mask, fp32 softmax, times v) or `sdpa`
    (`F.scaled_dot_product_attention` with a boolean mask, as a padded batch gets it).

    Args:
        kind: `eager` or `sdpa`.
        rows, heads, seq_len, head_dim: the query/key/value shape `(rows, heads, seq_len, head_dim)`.
        dtype: the compute dtype of q, k and v (bf16 under autocast).
        repeats: timed repetitions.

    Raises:
        ValueError: an unknown `kind`.
    """
    import torch.nn.functional as F

    if kind not in ("eager", "sdpa"):
        raise ValueError(f"kind must be eager or sdpa, not {kind!r}")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(rows, seq_len, heads, head_dim, generator=gen).to(dtype).transpose(1, 2).requires_grad_()
        for _ in range(3)
    )
    allowed = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()[None, None].expand(rows, 1, -1, -1)
    additive = torch.zeros(seq_len, seq_len, dtype=dtype).masked_fill(~allowed[0, 0], float("-inf"))

    def once() -> None:
        if kind == "eager":
            w = (q @ k.transpose(-1, -2)) * head_dim**-0.5 + additive
            out = w.softmax(-1, dtype=torch.float32).to(dtype) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=head_dim**-0.5)
        out.sum().backward()

    once()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        best = min(best, time.perf_counter() - t0)
    return best


def choose_attn_implementation(
    setting: str,
    device: torch.device | str,
    compute_dtype: torch.dtype,
    *,
    heads: int,
    head_dim: int,
    rows: int,
    seq_len: int,
    measure=None,
) -> tuple[str, str]:
    """Resolve `model.attn_implementation` (a transformers attention name, or `auto`) for this device and run.

    `auto`: on a GPU, `flash_attention_2` when the flash-attn package is importable and the compute dtype is bf16
    or fp16 (it has no fp32 kernel; it also enables the packed forward, `actor.use_remove_padding`), else `sdpa`.
    On a CPU the two stock kernels are timed at the run's micro-batch shape (`time_attention`, forward +
    backward): PyTorch's CPU flash kernel for SDPA is slow in bf16 on short sequences (on a 2-core AVX512-BF16
    machine 4x slower than eager at 64 rows x 24 tokens, 2.5x at 88 tokens; equal near 256; 2x faster at 1024), so
    `eager` is chosen when it is at least :data:`EAGER_MIN_SPEEDUP` x faster and the sequences are at most
    :data:`EAGER_MAX_LEN` tokens; else `sdpa`. Any other value is kept without measuring.

    Args:
        setting: the configured value.
        device: where the model runs.
        compute_dtype: the matmul dtype (bf16 under autocast or bf16 parameters, else fp32).
        heads, head_dim: the model's attention heads and their width.
        rows: sequences per training micro-batch.
        seq_len: the longest prompt + response, tokens.
        measure: ``measure(kind, rows, heads, seq_len, head_dim, dtype) -> seconds``; default `time_attention`.

    Returns:
        ``(implementation, reason)``: a name for `from_pretrained(attn_implementation=...)`, and a sentence for
        the log.
    """
    if setting != "auto":
        return setting, f"model.attn_implementation={setting}"
    device = torch.device(device)
    if device.type == "cuda":
        from transformers.utils import is_flash_attn_2_available

        if compute_dtype in (torch.bfloat16, torch.float16) and is_flash_attn_2_available():
            return (
                "flash_attention_2",
                "flash_attention_2 chosen by model.attn_implementation=auto (flash-attn found)",
            )
        return "sdpa", "sdpa chosen by model.attn_implementation=auto (no flash-attn, or fp32 compute)"
    if device.type != "cpu" or seq_len > EAGER_MAX_LEN:
        return "sdpa", f"sdpa chosen by model.attn_implementation=auto ({device.type}, {seq_len} tokens)"
    measure = measure or time_attention
    rows = max(1, min(rows, 8192 // max(seq_len, 1)))  # a probe of at most 8k tokens: well under a second
    eager = measure("eager", rows, heads, seq_len, head_dim, compute_dtype)
    sdpa = measure("sdpa", rows, heads, seq_len, head_dim, compute_dtype)
    figures = (
        f"attention forward+backward of {rows} rows x {seq_len} tokens (the longest prompt + response; rows capped "
        f"at 8192 tokens) in {str(compute_dtype).removeprefix('torch.')}: "
        f"eager {eager * 1e3:.1f} ms, sdpa {sdpa * 1e3:.1f} ms"
    )
    if sdpa >= EAGER_MIN_SPEEDUP * eager:
        return "eager", f"eager attention chosen by model.attn_implementation=auto: {figures}"
    return "sdpa", f"sdpa attention chosen by model.attn_implementation=auto: {figures}"
