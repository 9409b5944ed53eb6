"""Reward shaping applied to `score` only, never to `acc`: the repetition penalty of MiroMind-M1's CAMPO.

MiroMind-M1 (arXiv 2507.14683) penalises responses that fall into a repeating loop, a common failure of long
reasoning rollouts that DAPO's overlong penalty only catches once the loop hits the length limit. Here the penalty is
`-factor * fraction`, where `fraction` is the share of the response's tokens that lie inside a detected loop: a block
of at most `max_period` tokens repeated at least `min_repeats` times back to back, spanning at least `min_tokens`
tokens (so that "1000" or "= = =" in ordinary text is not a loop). The soft overlong penalty (DAPO Eq. 13) is
`dapo_rl.algo.overlong_penalty`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def repetition_fraction(
    token_ids: Sequence[int], min_repeats: int = 3, max_period: int = 128, min_tokens: int = 32
) -> float:
    """Share of a response's tokens inside a repeating loop.

    For every period p in 1..max_period, a loop is a maximal stretch where token i equals token i - p for at least
    `(min_repeats - 1) * p` consecutive positions; it covers those positions and the p tokens before them. Loops
    shorter than `min_tokens` tokens are ignored. The union of all loops, divided by the response length, is the
    fraction.

    Args:
        token_ids: the response's token ids (any integer sequence; characters work too via `ord`).
        min_repeats: copies of the block needed to call it a loop (>= 2).
        max_period: the longest block length looked for, in tokens.
        min_tokens: the shortest loop counted, in tokens.

    Returns:
        A float in [0, 1]; 0 for an empty response.

    Raises:
        ValueError: `min_repeats` < 2 or `max_period` < 1.
    """
    if min_repeats < 2 or max_period < 1:
        raise ValueError("min_repeats must be >= 2 and max_period >= 1")
    a = np.asarray(token_ids, dtype=np.int64)
    n = a.size
    if n == 0:
        return 0.0
    covered = np.zeros(n + 1, dtype=np.int64)  # difference array of covered positions
    for p in range(1, min(max_period, n // min_repeats) + 1):
        eq = np.concatenate(([False], a[p:] == a[:-p], [False]))  # eq[k + 1]: token k + p equals token k
        edges = np.flatnonzero(np.diff(eq.astype(np.int8)))
        starts, ends = edges[0::2], edges[1::2]  # runs of matches: positions start + p .. end + p - 1
        keep = (ends - starts) >= (min_repeats - 1) * p
        for s, e in zip(starts[keep], ends[keep]):
            lo, hi = s, e + p  # the loop covers tokens s .. e + p - 1
            if hi - lo >= min_tokens:
                covered[lo] += 1
                covered[hi] -= 1
    inside = np.cumsum(covered[:n]) > 0
    return float(inside.mean())


def repetition_penalty(
    token_ids: Sequence[int],
    factor: float = 1.0,
    min_repeats: int = 3,
    max_period: int = 128,
    min_tokens: int = 32,
) -> float:
    """`-factor * repetition_fraction(...)`: the amount added to a response's score (MiroMind-M1's repetition
    penalty); 0 for a response without loops."""
    return -factor * repetition_fraction(token_ids, min_repeats, max_period, min_tokens)
