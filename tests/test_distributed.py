"""Data parallelism on this CPU: FSDP2 over gloo with 2 real processes against one process, on the real tiny model.

The equivalence test is the contract of `Actor.update` under N ranks: the same batch split over 2 ranks (balanced,
each mini-batch's loss divided by the all-reduced global token count) gives the one-process loss, gradient norm and
parameters. GPU paths (NCCL, bf16 mixed precision) skip here with their reason.
"""

import os

import pytest
import torch
import torch.multiprocessing as mp
from ranks import free_port, join_gloo

from dapo_rl.actor import Actor, TrainBatch
from dapo_rl.config import ActorConfig, AlgorithmConfig
from dapo_rl.distributed import DistContext, balanced_partition, barrier, shard_minibatches, shutdown
from dapo_rl.models.tiny import build_tiny_tokenizer

N = 16  # sequences; two mini-batches of 8, so the second optimizer step is off-policy (ratio != 1)
MINI = 8


def _batch_lists():
    """Prompts and responses of varied lengths, advantages of both signs (deterministic)."""
    tok = build_tiny_tokenizer()
    prompts = [tok(f"{i} + {3 * i} - {i % 5} =\n")["input_ids"] for i in range(N)]
    responses = [
        tok("Answer: " + "7" * (1 + (5 * i) % 7))["input_ids"] + [tok.eos_token_id] for i in range(N)
    ]
    adv = torch.tensor([(-1.0) ** i * (0.05 + 0.02 * i) for i in range(N)])
    return prompts, responses, adv, tok.pad_token_id


def _actor_cfg(loss_agg_mode: str):
    return (
        ActorConfig(
            ppo_mini_batch_size=MINI, ppo_micro_batch_size=3, lr=1e-3, weight_decay=0.1, grad_clip=1e9
        ),
        AlgorithmConfig(loss_agg_mode=loss_agg_mode),
    )


def _update(model_dir, ctx: DistContext, loss_agg_mode: str):
    """This rank's share of the batch through one `Actor.update`; returns the metrics and the full parameters."""
    prompts, responses, adv, pad = _batch_lists()
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    rows, minibatch = shard_minibatches(lengths, MINI, ctx.world_size, ctx.rank)
    batch = TrainBatch.build(
        [prompts[i] for i in rows],
        [responses[i] for i in rows],
        adv[rows],
        torch.ones(len(rows)),
        pad,
        minibatch=minibatch,
    )
    cfg, algo = _actor_cfg(loss_agg_mode)
    actor = Actor(str(model_dir), cfg, algo, ctx, temperature=0.9)
    metrics = actor.update(batch)
    params = {k: v.clone() for k, v in actor.engine_weights()}
    return actor, metrics, params


def _rank_main(rank: int, world: int, port: int, model_dir: str, out_dir: str, loss_agg_mode: str):
    ctx = join_gloo(rank, world, port)
    try:
        actor, metrics, params = _update(model_dir, ctx, loss_agg_mode)
        actor.save(os.path.join(out_dir, "ckpt"))
        if ctx.is_main:
            torch.save({"metrics": metrics, "params": params}, os.path.join(out_dir, "result.pt"))
    finally:
        shutdown(ctx)


def test_balanced_partition_by_hand():
    # longest first, each to the lighter part with room: 9 -> A, 7 -> B, 6 -> B (13), 5 -> A (14), 2 -> B (15),
    # 1 -> A (15)
    parts = balanced_partition([9, 7, 6, 5, 2, 1], 2)
    assert sorted(len(p) for p in parts) == [3, 3]
    loads = sorted(sum([9, 7, 6, 5, 2, 1][i] for i in p) for p in parts)
    assert loads == [15, 15]
    assert parts == [[0, 3, 5], [1, 2, 4]]  # each part in the batch's order
    with pytest.raises(ValueError):
        balanced_partition([1, 2, 3], 2)


def test_shard_minibatches_gives_each_rank_equal_shares_of_every_minibatch():
    lengths = [10, 50, 20, 40, 30, 30, 60, 5]
    r0, m0 = shard_minibatches(lengths, 4, 2, 0)
    r1, m1 = shard_minibatches(lengths, 4, 2, 1)
    assert sorted(r0 + r1) == list(range(8))
    for m in (0, 1):  # each mini-batch keeps its own 4 sequences, 2 per rank
        rows = [r for r, x in zip(r0, m0) if x == m] + [r for r, x in zip(r1, m1) if x == m]
        assert sorted(rows) == list(range(4 * m, 4 * m + 4))
        assert m0.count(m) == m1.count(m) == 2
    tokens = [sum(lengths[r] for r, x in zip(rs, ms) if x == 0) for rs, ms in ((r0, m0), (r1, m1))]
    assert tokens == [60, 60]  # 10+50 / 20+40: balanced
    with pytest.raises(ValueError, match="cannot be split evenly over 3 ranks"):
        shard_minibatches(lengths, 4, 3, 0)


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_fsdp2_update_on_two_ranks_equals_one_process(model_dir, tmp_path, loss_agg_mode):
    """Acceptance: loss, grad norm and every parameter within 1e-5; the 2-rank checkpoint resumes at 1 rank."""
    mp.start_processes(
        _rank_main,
        args=(2, free_port(), str(model_dir), str(tmp_path), loss_agg_mode),
        nprocs=2,
        start_method="spawn",
    )
    got = torch.load(tmp_path / "result.pt", weights_only=True)
    _, want_metrics, want_params = _update(model_dir, DistContext(), loss_agg_mode)
    m = got["metrics"]
    print(
        f"{loss_agg_mode}: pg_loss {m['actor/pg_loss']:.8f} vs {want_metrics['actor/pg_loss']:.8f}, grad_norm "
        f"{m['actor/grad_norm']:.8f} vs {want_metrics['actor/grad_norm']:.8f}"
    )
    for k in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "actor/entropy", "actor/pg_clipfrac_upper"):
        assert m[k] == pytest.approx(want_metrics[k], abs=1e-5), k
    assert want_metrics["actor/ppo_kl"] != 0.0  # the second mini-batch really was off-policy
    worst = max(float((got["params"][k] - v).abs().max()) for k, v in want_params.items())
    print(f"largest parameter difference: {worst:.2e}")
    assert set(got["params"]) == set(want_params) and worst < 1e-5

    # the checkpoint the 2 ranks wrote (DCP shards + HF model/) loads into one process, optimizer state included
    cfg, algo = _actor_cfg(loss_agg_mode)
    one = Actor(str(tmp_path / "ckpt" / "model"), cfg, algo)
    from_hf = {k: v.clone() for k, v in one.engine_weights()}
    one.load(tmp_path / "ckpt")
    assert all(torch.equal(from_hf[k], v) for k, v in one.engine_weights())
    assert max(float((got["params"][k] - v).abs().max()) for k, v in one.engine_weights()) == 0.0
    steps = {int(s["step"]) for s in one.optimizer.state_dict()["state"].values()}
    assert steps == {2} and one.scheduler.last_epoch == 1  # two optimizer steps, one scheduler step


def test_device_auto_is_the_cpu_here_and_cuda_is_a_clear_error():
    from dapo_rl.config import ConfigError
    from dapo_rl.distributed import resolve_device

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="trainer.device=cuda, but torch sees no CUDA device"):
        resolve_device("cuda")


def test_actor_and_batches_live_on_the_trainer_device(model_dir):
    """Placement: parameters and optimizer state on the context's device, log-probs computed there."""
    device = torch.device("cpu")
    cfg, algo = _actor_cfg("token-mean")
    actor = Actor(str(model_dir), cfg, algo, DistContext(device=device))
    prompts, responses, adv, pad = _batch_lists()
    batch = TrainBatch.build(prompts, responses, adv, torch.ones(N), pad)
    assert all(p.device == device for p in actor.model.parameters())
    logp, _ = actor.forward(batch.slice(torch.arange(2)))
    assert logp.device == device and logp.dtype == torch.float32
    actor.update(batch)
    assert all(s["exp_avg"].device == device for s in actor.optimizer.state.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (bf16 FSDP2 mixed precision, NCCL)")
def test_bf16_compute_with_fp32_weights_on_cuda(model_dir):
    cfg, algo = _actor_cfg("token-mean")
    cfg.autocast_dtype = "bfloat16"
    actor = Actor(str(model_dir), cfg, algo, DistContext(device=torch.device("cuda", 0)))
    prompts, responses, adv, pad = _batch_lists()
    batch = TrainBatch.build(prompts, responses, adv, torch.ones(N), pad)
    actor.update(batch)
    assert all(p.dtype == torch.float32 and p.is_cuda for p in actor.model.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in actor.optimizer.state.values())


def _peak_rss() -> int:
    """This process's peak resident memory in bytes (Linux `VmHWM`)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _reset_peak_rss() -> int:
    """Reset the peak to the current resident memory (Linux: `5` into `/proc/self/clear_refs`); returns it."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _peak_rss()


def _load_rank_main(rank: int, world: int, port: int, model_dir: str, out_dir: str):
    """Rank `rank` builds the actor (meta model, shards, rank 0 broadcasts) and reports its peak RSS growth and its
    full parameters (gathered)."""
    ctx = join_gloo(rank, world, port)
    try:
        from transformers import AutoConfig

        AutoConfig.from_pretrained(model_dir)  # transformers' lazy imports happen before the baseline
        before = _reset_peak_rss()
        actor = Actor(model_dir, ActorConfig(), AlgorithmConfig(), ctx)
        grown = _peak_rss() - before
        local = sum(p.to_local().numel() * p.element_size() for p in actor.model.parameters())
        full = {k: v.clone() for k, v in actor.engine_weights()}
        buffers = {k: v.clone() for k, v in actor.model.named_buffers()}
        tied = actor.model.lm_head.weight is actor.model.model.embed_tokens.weight
        # resume: the model is built from config.json alone and DCP fills it; nobody reads model/'s weights,
        # which are removed here (a rank that tried to read them would fail)
        actor.update(_resume_batch())  # optimizer state to restore too
        ckpt = os.path.join(out_dir, "ckpt")
        actor.save(ckpt)
        want_after = {k: v.clone() for k, v in actor.engine_weights()}
        barrier(ctx)
        if ctx.is_main:
            for f in os.listdir(os.path.join(ckpt, "model")):
                if f.endswith(".safetensors"):
                    os.remove(os.path.join(ckpt, "model", f))
        barrier(ctx)
        before = _reset_peak_rss()
        resumed = Actor(
            os.path.join(ckpt, "model"), ActorConfig(), AlgorithmConfig(), ctx, load_weights=False
        )
        grown_resume = _peak_rss() - before  # the build alone: `to_empty` leaves the shards' pages untouched
        resumed.load(ckpt)
        torch.save(
            {
                "grown": grown,
                "local": local,
                "params": full,
                "buffers": buffers,
                "tied": tied,
                "grown_resume": grown_resume,
                "resumed_equal": all(torch.equal(v, want_after[k]) for k, v in resumed.engine_weights()),
                "resumed_buffers": {k: v.clone() for k, v in resumed.model.named_buffers()},
                "resumed_tied": resumed.model.lm_head.weight is resumed.model.model.embed_tokens.weight,
                "resumed_steps": {int(s["step"]) for s in resumed.optimizer.state_dict()["state"].values()},
            },
            os.path.join(out_dir, f"r{rank}.pt"),
        )
    finally:
        shutdown(ctx)


def _resume_batch() -> TrainBatch:
    prompts, responses, adv, pad = _batch_lists()
    return TrainBatch.build(prompts[:4], responses[:4], adv[:4], torch.ones(4), pad)


def test_two_ranks_build_the_model_from_rank_0_without_a_full_copy_each(tmp_path):
    """Every rank builds the model on `meta`, shards it and receives its slices from rank 0: the parameters (and the
    rotary buffers outside the state dict) equal a plain `from_pretrained`, and rank 1's peak memory grows by about
    its half of the model, not by the whole model (as it did when every rank loaded the checkpoint). On resume
    (`load_weights=False`) no rank reads the weights (they are deleted first) and the build allocates no copy of
    the model; after `load` the parameters, optimizer steps, rotary buffers and the tie of head and embeddings are
    those saved."""
    from dapo_rl.models.tiny import build_tiny_model as build

    model = build(seed=5, hidden_size=512, num_layers=8, intermediate_size=2048)  # 25M params, 100 MB
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    build_tiny_tokenizer().save_pretrained(model_dir)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    want = {k: v.clone() for k, v in model.state_dict().items()}
    want_buffers = {k: v.clone() for k, v in model.named_buffers()}
    del model
    mp.start_processes(
        _load_rank_main, args=(2, free_port(), str(model_dir), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    r0, r1 = (torch.load(tmp_path / f"r{r}.pt", weights_only=True) for r in (0, 1))
    for got in (r0, r1):
        assert set(got["params"]) == set(want)
        assert all(torch.equal(got["params"][k], v) for k, v in want.items())
        assert set(got["buffers"]) == set(want_buffers)
        assert all(torch.equal(got["buffers"][k], v) for k, v in want_buffers.items())
    print(
        f"model {size / 2**20:.0f} MiB; peak RSS growth while building the actor: rank 0 {r0['grown'] / 2**20:.0f} "
        f"MiB, rank 1 {r1['grown'] / 2**20:.0f} MiB (its shard: {r1['local'] / 2**20:.0f} MiB)"
    )
    assert r1["local"] <= 0.55 * size
    assert r1["grown"] < 0.75 * size  # a full copy would be >= size
    assert r0["grown"] >= size  # rank 0 reads the whole checkpoint (into host memory)
    print(
        f"resume without model/'s weights: peak RSS growth while building the actor: rank 0 "
        f"{r0['grown_resume'] / 2**20:.0f} MiB, rank 1 {r1['grown_resume'] / 2**20:.0f} MiB"
    )
    for got in (r0, r1):
        assert got["tied"] and got["resumed_tied"]
        assert got["resumed_equal"]
        assert got["resumed_steps"] == {1}
        assert all(torch.equal(got["resumed_buffers"][k], v) for k, v in want_buffers.items())
        assert got["grown_resume"] < 0.25 * size  # no copy of the model (reading it, rank 0 grew >= size)


def test_ray_workers_take_gpus_from_the_cluster_not_from_the_driver():
    """The driver of `ray job submit` (or a CPU head node) sees no CUDA; whether workers take a GPU comes from
    `trainer.device` and the cluster's GPUs."""
    from dapo_rl.config import ConfigError
    from dapo_rl.distributed.launch import ray_use_gpu

    assert ray_use_gpu("cuda", 16.0, 16) is True  # this driver has no CUDA at all
    assert ray_use_gpu("auto", 16.0, 16) is True
    assert ray_use_gpu("auto", 0.0, 2) is False  # a CPU cluster: gloo workers
    assert ray_use_gpu("cpu", 16.0, 16) is False
    with pytest.raises(ConfigError, match=r"the Ray cluster has 8 GPU\(s\) now"):
        ray_use_gpu("cuda", 8.0, 16)
    with pytest.raises(ConfigError, match=r"trainer.device=auto with 16 Ray Train worker\(s\)"):
        ray_use_gpu("auto", 8.0, 16)  # not a silent mix of GPU and CPU workers


def test_a_bf16_export_is_written_in_bf16_and_loads(model_dir, tmp_path):
    """`Actor.export_dtype=bfloat16` (the trainer's choice under bf16 compute): `model/` holds bf16 tensors, half the
    bytes, equal to the fp32 weights rounded; the tied head is stored once and `from_pretrained` restores it."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    actor = Actor(str(model_dir), ActorConfig(), AlgorithmConfig())
    actor.export_dtype = torch.bfloat16
    actor.save(tmp_path / "ckpt")
    with safe_open(str(tmp_path / "ckpt" / "model" / "model.safetensors"), "pt") as f:
        dtypes = {f.get_tensor(k).dtype for k in f.keys()}
        assert "lm_head.weight" not in set(f.keys())  # tied: stored once
    assert dtypes == {torch.bfloat16}
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "model").dtype == torch.bfloat16  # "auto"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "model", dtype=torch.float32)
    for k, v in actor.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v.to(torch.bfloat16).float()), k


def test_one_process_resume_builds_the_model_from_its_config_and_dcp_fills_it(model_dir, tmp_path):
    """`load_weights=False` (the trainer's `--resume`) reads only config.json: before `load` the parameters are
    whatever `to_empty` left, the rotary buffers are already from_pretrained's and the head is tied to the
    embeddings; after `load` every parameter and the optimizer's step equal the saved actor's."""
    prompts, responses, adv, pad = _batch_lists()
    actor = Actor(str(model_dir), ActorConfig(lr=1e-2), AlgorithmConfig())
    actor.update(TrainBatch.build(prompts[:4], responses[:4], adv[:4], torch.ones(4), pad))
    actor.save(tmp_path / "ckpt")
    resumed = Actor(
        str(tmp_path / "ckpt" / "model"), ActorConfig(lr=1e-2), AlgorithmConfig(), load_weights=False
    )
    assert resumed.model.lm_head.weight is resumed.model.model.embed_tokens.weight
    want_buffers = dict(actor.model.named_buffers())
    assert {k: torch.equal(v, want_buffers[k]) for k, v in resumed.model.named_buffers()} == {
        "model.rotary_emb.inv_freq": True,
        "model.rotary_emb.original_inv_freq": True,
    }
    resumed.load(tmp_path / "ckpt")
    want = dict(actor.model.named_parameters())
    assert all(torch.equal(p, want[k]) for k, p in resumed.model.named_parameters())
    assert {int(s["step"]) for s in resumed.optimizer.state_dict()["state"].values()} == {1}


def _groups_for_exchange():
    """8 prompt groups of 4 rollouts with varied lengths, rewards, log-probs, one truncated response, and in the odd
    groups a tool's token (loss mask 0) after the model's first two."""
    from dapo_rl.collect import PromptGroup, Rollout
    from dapo_rl.data.dataset import Sample

    groups = []
    for g in range(8):
        sample = Sample(f"t:{g}", "t", [{"role": "user", "content": f"q{g}"}], "1")
        prompt = list(range(3, 3 + 2 + g % 3))
        rollouts = [
            Rollout(
                sample,
                g,
                j,
                prompt,
                [10 + g, 20 + j] + [30] * ((g + 2 * j) % 5),
                [-0.1 * (g + 1) - 0.01 * j] * (2 + (g + 2 * j) % 5),
                "length" if (g, j) == (3, 1) else "stop",
                reward=float((g + j) % 2) - 0.5 * (j == 3),
                loss_mask=[1, 1, 0] + [1] * ((g + 2 * j) % 5 - 1) if g % 2 and (g + 2 * j) % 5 else None,
            )
            for j in range(4)
        ]
        groups.append(PromptGroup((1, g), rollouts))
    return groups


def _exchange_rank_main(rank: int, world: int, port: int, out_dir: str, rank0_holds_all: bool = False):
    """Rank r holds complete rollouts only for the groups it sampled (g % 2 == r) and light copies of the others,
    as `collect_batch` leaves them; or (`rank0_holds_all`, asynchronous training) rank 0's producer holds every
    group and the others get light copies through `broadcast_object`. `make_train_batch` fetches each rank's rows
    from their owner."""
    from dataclasses import replace

    from dapo_rl.collect import make_train_batch
    from dapo_rl.config import load_config
    from dapo_rl.distributed import broadcast_object

    ctx = join_gloo(rank, world, port)
    try:
        cfg = load_config(None, ["rollout.n=4", "actor.ppo_mini_batch_size=2", "actor.shuffle=true"])
        if rank0_holds_all:
            whole = [replace(g, owner=0) for g in _groups_for_exchange()] if rank == 0 else None
            light = broadcast_object([g.light() for g in whole] if rank == 0 else None, ctx)
            assert all(not x.response_ids and not x.logprobs for g in light for x in g.rollouts)
            groups = whole if rank == 0 else light
        else:
            groups = [
                replace(
                    g,
                    owner=i % 2,
                    rollouts=g.rollouts
                    if i % 2 == rank
                    else [replace(x.light(), prompt_ids=x.prompt_ids) for x in g.rollouts],
                )
                for i, g in enumerate(_groups_for_exchange())
            ]
        batch = make_train_batch(groups, cfg, 0, step=3, ctx=ctx)
        torch.save(batch.__dict__, os.path.join(out_dir, f"b{rank}.pt"))
    finally:
        shutdown(ctx)


@pytest.mark.parametrize("rank0_holds_all", [False, True], ids=["each-rank-its-own", "rank0-holds-all"])
def test_each_rank_receives_only_the_rows_it_trains_on(tmp_path, rank0_holds_all):
    """Kept groups stay with the rank that sampled them (others see them without tokens and log-probs), or with rank
    0 (asynchronous training's producer); each rank's training rows come to it through one all-to-all, and its
    batch is exactly the one it would cut from the whole batch held everywhere (shuffled mini-batches, advantages,
    rollout log-probs, the truncated response's mask, the tool tokens' mask)."""
    from dapo_rl.collect import make_train_batch
    from dapo_rl.config import load_config

    mp.start_processes(
        _exchange_rank_main,
        args=(2, free_port(), str(tmp_path), rank0_holds_all),
        nprocs=2,
        start_method="spawn",
    )
    cfg = load_config(None, ["rollout.n=4", "actor.ppo_mini_batch_size=2", "actor.shuffle=true"])
    for r in (0, 1):
        got = torch.load(tmp_path / f"b{r}.pt", weights_only=True)
        want = make_train_batch(_groups_for_exchange(), cfg, 0, step=3, ctx=DistContext(rank=r, world_size=2))
        assert len(want) == 16
        tool_tokens = sum(
            x.loss_mask.count(0) for g in _groups_for_exchange() for x in g.rollouts if x.loss_mask
        )
        assert tool_tokens == 13
        for k, v in want.__dict__.items():
            assert torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v, k
