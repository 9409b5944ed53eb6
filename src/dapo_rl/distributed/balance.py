"""Splitting a training batch across ranks: equal sequence counts (FSDP2 needs every rank to run the same number of
forward passes), balanced token counts (the slowest rank sets the pace)."""

from __future__ import annotations

import heapq
import math

import torch


def balanced_partition(costs: list[int], parts: int) -> list[list[int]]:
    """Split indices `0..len(costs)-1` into `parts` lists of equal length with sums as even as a greedy can make
    them (longest first, each to the least-loaded part that still has room; the LPT rule).

    Args:
        costs: per-item cost (tokens).
        parts: number of parts; must divide `len(costs)`.

    Returns:
        `parts` lists of indices, each sorted ascending (so a part keeps the batch's order).

    Raises:
        ValueError: `parts` < 1 or does not divide the number of items.
    """
    if parts < 1 or len(costs) % parts:
        raise ValueError(f"{len(costs)} items cannot be split into {parts} equal parts")
    size = len(costs) // parts
    heap = [(0, p) for p in range(parts)]  # (load, part)
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        full = []
        load, p = heapq.heappop(heap)
        while len(out[p]) == size:
            full.append((load, p))
            load, p = heapq.heappop(heap)
        out[p].append(i)
        heapq.heappush(heap, (load + costs[i], p))
        for item in full:
            heapq.heappush(heap, item)
    return [sorted(x) for x in out]


def shard_minibatches(
    lengths: list[int], mini_size: int, world_size: int, rank: int, order: torch.Tensor | None = None
) -> tuple[list[int], list[int]]:
    """This rank's rows of a training batch, mini-batch by mini-batch.

    The batch (in `order`) is cut into consecutive mini-batches of `mini_size` sequences, exactly as one process
    would cut it; each mini-batch is then split into `world_size` equal parts balanced by token count
    (`balanced_partition`). Every optimizer step therefore sees the same sequences as in one process, and with the
    loss normalised by the global token count (`Actor.update`) the same gradient.

    Args:
        lengths: `(B,)` tokens of each sequence (prompt + response).
        mini_size: sequences per mini-batch (the last one may be shorter); `world_size` must divide every
            mini-batch's size.
        world_size: ranks.
        rank: this rank.
        order: a permutation of `0..B-1` (shuffling), or None for the batch order.

    Returns:
        `(rows, minibatch)`: indices into the batch for this rank and the mini-batch number of each.

    Raises:
        ValueError: a mini-batch whose size `world_size` does not divide.
    """
    b = len(lengths)
    idx = list(range(b)) if order is None else [int(i) for i in order]
    rows: list[int] = []
    minibatch: list[int] = []
    for m, start in enumerate(range(0, b, mini_size)):
        chunk = idx[start : start + mini_size]
        if len(chunk) % world_size:
            raise ValueError(
                f"a mini-batch of {len(chunk)} sequences cannot be split evenly over {world_size} ranks"
            )
        part = balanced_partition([lengths[i] for i in chunk], world_size)[rank]
        rows.extend(chunk[i] for i in part)
        minibatch.extend([m] * len(part))
    return rows, minibatch


def token_budget_bins(lengths: list[int], budget: int, *, padded: bool, num_bins: int = 1) -> list[list[int]]:
    """Micro-batches by token budget (verl's `use_dynamic_bsz`): indices `0..len(lengths)-1` grouped so that each
    group's forward costs at most `budget` tokens.

    `padded=True` (a right-padded forward, cost = rows x longest row): rows sorted longest first are cut into
    consecutive runs, so each micro-batch holds sequences of similar length and little padding.
    `padded=False` (a packed, padding-free forward, cost = the sum of lengths): the fewest bins that fit, filled
    longest first into the least-loaded bin (LPT), so the bins are balanced.

    A row longer than `budget` gets a micro-batch of its own. With `num_bins` the result has at least that many
    micro-batches where there are rows enough (FSDP2: every rank must run as many forward passes as the others):
    the micro-batch with the most rows is halved until there are.

    Args:
        lengths: tokens of each row (prompt + response).
        budget: tokens per micro-batch (`actor.ppo_max_token_len_per_gpu`); >= 1.
        padded: see above.
        num_bins: the least number of micro-batches wanted.

    Returns:
        Lists of row indices, each sorted ascending, none empty (no list at all for no rows).

    Raises:
        ValueError: `budget` < 1.
    """
    if budget < 1:
        raise ValueError(f"token budget must be >= 1, got {budget}")
    if not lengths:
        return []
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if padded:
        bins: list[list[int]] = []
        for i in order:
            if bins and (len(bins[-1]) + 1) * lengths[bins[-1][0]] <= budget:
                bins[-1].append(i)
            else:
                bins.append([i])
    else:
        k = max(1, math.ceil(sum(lengths) / budget))
        while True:
            heap = [(0, b) for b in range(k)]
            bins = [[] for _ in range(k)]
            for i in order:
                load, b = heapq.heappop(heap)
                bins[b].append(i)
                heapq.heappush(heap, (load + lengths[i], b))
            over = any(len(x) > 1 and sum(lengths[i] for i in x) > budget for x in bins)
            if not over or k >= len(lengths):
                break
            k += 1
        bins = [x for x in bins if x]
    while len(bins) < num_bins:
        widest = max(range(len(bins)), key=lambda b: len(bins[b]))
        if len(bins[widest]) < 2:
            break
        rows = bins.pop(widest)
        bins[widest:widest] = [rows[: len(rows) // 2], rows[len(rows) // 2 :]]
    return [sorted(x) for x in bins]
