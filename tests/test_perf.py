"""Throughput accounting: the measured matmul peak, MFU by hand, and the automatic bf16 and attention choices."""

import math

import pytest
import torch

from dapo_rl.perf import (
    BF16_MIN_SPEEDUP,
    EAGER_MAX_LEN,
    EAGER_MIN_SPEEDUP,
    choose_attn_implementation,
    choose_autocast_dtype,
    matmul_peak_flops,
    time_attention,
    training_mfu,
)


def test_training_mfu_by_hand():
    # 6 * 1e6 params * 1000 tokens + 2 * 1e6 * 500 recomputed = 7e9 FLOPs in 2 s against 1e10 FLOP/s: 35%
    assert training_mfu(1_000_000, 1000, 500, 2.0, 1e10) == pytest.approx(0.35)
    assert math.isnan(training_mfu(1, 1, 0, 0.0, 1e10))
    # LoRA: 1e4 trainable of 1e6: (4e6 + 2e4) x 1000 + 2e6 x 500 = 5.02e9 FLOPs in 2 s at 1e10 FLOP/s
    assert training_mfu(1_000_000, 1000, 500, 2.0, 1e10, trainable_params=10_000) == pytest.approx(0.251)


def test_matmul_peak_is_a_real_measurement():
    flops = matmul_peak_flops("cpu", torch.float32, size=256)
    assert 1e8 < flops < 1e14  # between a slow core and far beyond any 2-core CPU


@pytest.mark.parametrize(
    "fp32, bf16, want",
    [
        (107e9, 0.3e9, "none"),  # an AVX2 EPYC without native bf16 (CALIBRATION.md)
        (153e9, 381e9, "bfloat16"),  # AVX512-BF16
        (100e9, 100e9 * BF16_MIN_SPEEDUP * 0.99, "none"),  # not enough faster to be worth it
    ],
)
def test_auto_takes_bf16_only_where_it_is_faster(fp32, bf16, want):
    def measure(device, dtype):
        return bf16 if dtype == torch.bfloat16 else fp32

    dtype, reason = choose_autocast_dtype("auto", "cpu", measure)
    assert dtype == want
    assert "actor.autocast_dtype=auto" in reason and f"{bf16 / 1e9:.1f} GFLOP/s" in reason
    # explicit settings are kept whatever the figures, without measuring
    assert choose_autocast_dtype("none", "cpu", None)[0] == "none"
    assert choose_autocast_dtype("bfloat16", "cpu", None)[0] == "bfloat16"


def test_auto_measures_on_this_cpu_in_a_fraction_of_a_second():
    import time

    t0 = time.perf_counter()
    dtype, reason = choose_autocast_dtype("auto", "cpu")
    assert dtype in ("bfloat16", "none") and "GFLOP/s" in reason
    assert time.perf_counter() - t0 < 5.0  # a 256 x 256 probe even where bf16 runs at 0.3 GFLOP/s


@pytest.mark.parametrize(
    "eager_s, sdpa_s, want",
    [
        (0.0024, 0.0098, "eager"),  # bf16, 64 rows x 24 tokens on an AVX512-BF16 core pair: SDPA 4x slower
        (0.100, 0.100 * EAGER_MIN_SPEEDUP * 0.99, "sdpa"),  # not enough faster: keep the memory-lean kernel
        (0.090, 0.040, "sdpa"),  # long sequences: SDPA faster
    ],
)
def test_auto_attention_takes_eager_only_where_it_is_faster(eager_s, sdpa_s, want):
    seen = []

    def measure(kind, rows, heads, seq_len, head_dim, dtype):
        seen.append((kind, rows, heads, seq_len, head_dim, dtype))
        return eager_s if kind == "eager" else sdpa_s

    impl, reason = choose_attn_implementation(
        "auto", "cpu", torch.bfloat16, heads=4, head_dim=48, rows=256, seq_len=88, measure=measure
    )
    assert impl == want
    assert "model.attn_implementation=auto" in reason and f"eager {eager_s * 1e3:.1f} ms" in reason
    # the probe is the run's shape, rows capped at 8192 tokens: 8192 // 88 = 93 rows
    assert seen == [(k, 93, 4, 88, 48, torch.bfloat16) for k in ("eager", "sdpa")]


def test_attention_settings_kept_and_long_or_gpu_runs_not_probed():
    def measure(*a):
        raise AssertionError("must not measure")

    kw = dict(heads=4, head_dim=48, rows=8, measure=measure)
    assert choose_attn_implementation("eager", "cpu", torch.float32, seq_len=88, **kw)[0] == "eager"
    assert choose_attn_implementation("flash_attention_2", "cpu", torch.float32, seq_len=88, **kw)[0] == (
        "flash_attention_2"
    )
    assert (
        choose_attn_implementation("auto", "cpu", torch.bfloat16, seq_len=EAGER_MAX_LEN + 1, **kw)[0]
        == "sdpa"
    )
    # a GPU: flash-attention only with bf16 compute and the package installed (not here); never eager
    assert choose_attn_implementation("auto", "cuda", torch.float32, seq_len=88, **kw)[0] == "sdpa"
    assert choose_attn_implementation("auto", "cuda", torch.bfloat16, seq_len=88, **kw)[0] in (
        "sdpa",
        "flash_attention_2",
    )


def test_time_attention_runs_both_kernels_on_this_cpu():
    for kind in ("eager", "sdpa"):
        s = time_attention(kind, 4, 2, 16, 8, torch.float32, repeats=1)
        assert 0 < s < float("inf")
    with pytest.raises(ValueError, match="eager or sdpa"):
        time_attention("flash", 4, 2, 16, 8, torch.float32)
