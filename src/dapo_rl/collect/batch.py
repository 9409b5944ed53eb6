"""The training batch from the kept groups: advantages per group (`algorithm.adv_estimator`), and this rank's
rows of the batch, cut into mini-batches and balanced over the ranks by token count."""

from __future__ import annotations

import torch

from dapo_rl.actor import TrainBatch
from dapo_rl.algo import get_adv_estimator
from dapo_rl.config import Config
from dapo_rl.distributed import DistContext, all_to_all_objects, shard_minibatches
from dapo_rl.episode.records import PromptGroup, Rollout


def _fetch_rows(
    groups: list[PromptGroup],
    rollouts: list[Rollout],
    lengths: list[int],
    rows: list[int],
    order,
    minibatch_size: int,
    ctx: DistContext,
) -> list[Rollout]:
    """The rollouts of this rank's `rows` (indices into the batch's flattened rollouts), complete: rows another
    rank sampled (`PromptGroup.owner`) come from it through one object all-to-all, in which every rank sends each
    other rank only the rows that rank trains on (each rank works out every rank's rows with the same
    `shard_minibatches` call as `make_train_batch`, over its flattened `rollouts` and their `lengths`)."""
    owners = [g.owner for g in groups for _ in g.rollouts]
    if not ctx.distributed or all(o < 0 for o in owners):
        return [rollouts[i] for i in rows]
    send: list[list[tuple[int, tuple]]] = [[] for _ in range(ctx.world_size)]
    for r in range(ctx.world_size):
        if r == ctx.rank:
            continue
        theirs, _ = shard_minibatches(lengths, minibatch_size, ctx.world_size, r, order)
        send[r] = [(i, rollouts[i].tokens()) for i in theirs if owners[i] == ctx.rank]
    got = {i: tokens for part in all_to_all_objects(send, ctx) for i, tokens in part}
    return [rollouts[i] if owners[i] == ctx.rank else rollouts[i].with_tokens(got[i]) for i in rows]


def make_train_batch(
    groups: list[PromptGroup], cfg: Config, pad_id: int, step: int, ctx: DistContext | None = None
) -> TrainBatch:
    """Advantages of the shaped scores (`algorithm.adv_estimator`, per group) and this rank's rows of the batch.

    The batch (optionally shuffled by a per-step seeded permutation, the same on every rank) is cut into
    mini-batches of `actor.ppo_mini_batch_size` groups' worth of sequences, as one process would cut it, and each
    mini-batch is split evenly over the ranks, balanced by token count (`shard_minibatches`).

    Args:
        groups: the step's kept groups (all ranks', in order).
        cfg: the run's configuration.
        pad_id: the tokenizer's pad id.
        step: the RL step (the shuffle's seed).
        ctx: this rank (None: one process).
    """
    ctx = ctx or DistContext()
    rollouts = [x for g in groups for x in g.rollouts]
    scores = torch.tensor([x.reward for x in rollouts])
    gidx = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g.rollouts) for g in groups]))
    estimator = get_adv_estimator(cfg.algorithm.adv_estimator)
    adv = estimator(scores, gidx, norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo)
    truncated = torch.tensor([x.truncated for x in rollouts])
    loss_mask = ~truncated if cfg.algorithm.overlong_filtering else torch.ones_like(truncated)
    order = None
    if cfg.actor.shuffle:
        order = torch.randperm(
            len(rollouts), generator=torch.Generator().manual_seed(cfg.trainer.seed + step)
        )
    lengths = [len(x.prompt_ids) + x.response_length for x in rollouts]
    mini = cfg.actor.ppo_mini_batch_size * cfg.rollout.n
    rows, minibatch = shard_minibatches(lengths, mini, ctx.world_size, ctx.rank, order)
    mine = _fetch_rows(groups, rollouts, lengths, rows, order, mini, ctx)
    # sampled by an earlier policy: carried from the previous step, or (asynchronous) an older version than the
    # one this step updates (step - 1 updates so far)
    stale = [g.key[0] == 0 or 0 <= g.version < step - 1 for g in groups for _ in g.rollouts]
    return TrainBatch.build(
        [x.prompt_ids for x in mine],
        [x.response_ids for x in mine],
        adv[rows],
        loss_mask[rows].float(),
        pad_id,
        rollout_logprobs=[x.logprobs for x in mine],
        minibatch=minibatch,
        stale=[stale[i] for i in rows] if any(stale) else None,
        token_masks=[x.loss_mask for x in mine] if any(x.loss_mask is not None for x in mine) else None,
    )
