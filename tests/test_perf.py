"""Throughput accounting: the measured matmul peak, MFU by hand, and the automatic bf16 choice."""

import math

import pytest
import torch

from dapo_rl.perf import BF16_MIN_SPEEDUP, choose_autocast_dtype, matmul_peak_flops, training_mfu


def test_training_mfu_by_hand():
    # 6 * 1e6 params * 1000 tokens + 2 * 1e6 * 500 recomputed = 7e9 FLOPs in 2 s against 1e10 FLOP/s: 35%
    assert training_mfu(1_000_000, 1000, 500, 2.0, 1e10) == pytest.approx(0.35)
    assert math.isnan(training_mfu(1, 1, 0, 0.0, 1e10))


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
