"""Asynchronous DAPO (`async_training.max_staleness`): the staleness queue by hand, and real `dapo train` runs with the
engine in its own process (the tiny model's warm-up, the real verifier)."""

import signal

import pytest
import torch
from e2e import FAULT, assert_same_metrics, dapo, gone, rows_of, run_args

from dapo_rl.collect.producer import GroupQueue, RolloutProducer
from dapo_rl.config import ConfigError, load_config, validate_config
from dapo_rl.data import Sample
from dapo_rl.episode.records import PromptGroup, Rollout


def _group(version: int, i: int) -> PromptGroup:
    sample = Sample(f"s{i}", "test", [{"role": "user", "content": "1+1"}], "2")
    return PromptGroup((version + 1, i), [Rollout(sample, i, 0, [1], [2, 3], [-0.5, -0.25])], version=version)


def test_the_queue_takes_groups_at_most_k_versions_old_and_drops_older_ones():
    q = GroupQueue(max_staleness=1)
    q.groups.extend(_group(v, i) for i, v in enumerate([0, 0, 1, 1, 2, 2]))
    # policy version 2 (step 3): versions 1 and 2 are within one version, the two of version 0 are not
    assert q.fresh(2) == 4 and q.fresh(1) == 6 and q.fresh(3) == 2
    batch, dropped = q.take(3, policy_version=2)
    assert [g.version for g in dropped] == [0, 0]
    assert [g.version for g in batch] == [1, 1, 2] and [g.key for g in batch] == [(2, 2), (2, 3), (3, 4)]
    assert len(q) == 1
    # K = 0: only the current version trains
    q0 = GroupQueue(max_staleness=0)
    gs = [_group(v, i) for i, v in enumerate([0, 1, 1])]
    q0.groups.extend(gs)
    assert q0.take(5, policy_version=1) == (gs[1:], gs[:1]) and len(q0) == 0


def test_after_a_take_the_producer_counts_only_groups_fresh_for_the_next_step():
    """Review m1: K=1, 32 groups a batch, 64 queued of version 1. The step at policy 2 takes 32; the other 32 are
    fresh for it but not for the step at policy 3, so the producer is not full (it generates through the update)."""
    from types import SimpleNamespace

    from dapo_rl.config import AlgorithmConfig

    cfg = SimpleNamespace(
        data=SimpleNamespace(train_batch_size=32), algorithm=AlgorithmConfig(), rollout=SimpleNamespace(n=1)
    )
    policy = SimpleNamespace(kept_rate=None)
    p = RolloutProducer(None, None, None, None, lambda: cfg, policy, max_staleness=1, version=2)
    p.queue.groups.extend(_group(1, i) for i in range(64))
    assert p._full()
    batch, _ = p.next_batch(32, policy_version=2)
    assert len(batch) == 32 and len(p.queue) == 32
    assert p.learner_version == 3 and p.queue.fresh(3) == 0 and not p._full()


def test_the_producers_state_round_trips_through_plain_lists(tmp_path):
    """A checkpoint keeps the queue (versions, token ids, log-probs, rewards) and the unreported round statistics in
    types `torch.load(weights_only=True)` reads back."""
    from dapo_rl.data import PromptDataset
    from dapo_rl.models.tiny import build_tiny_tokenizer

    samples = [Sample(f"s{i}", "test", [{"role": "user", "content": f"{i}+1"}], str(i + 1)) for i in range(3)]
    ds = PromptDataset(samples, build_tiny_tokenizer(), 64, "test")
    p = RolloutProducer(None, None, None, ds, lambda: None, None, max_staleness=2, version=4)
    g = PromptGroup(
        (7, 1),
        [
            Rollout(samples[2], 2, 0, ds.prompt_ids[2], [5, 6], [-1.0, -2.5], "length"),
            Rollout(samples[2], 2, 1, ds.prompt_ids[2], [5, 6, 7], [-1.0, 0.0, -0.5], loss_mask=[1, 0, 1]),
        ],
        version=3,
    )
    g.rollouts[0].reward, g.rollouts[0].acc = -1.5, True
    p.queue.groups.append(g)
    p._report.sums.responses, p._report.rounds = 8.0, 2
    state = p.state_dict()
    path = tmp_path / "state.pt"
    torch.save(state, path)
    back = RolloutProducer(None, None, None, ds, lambda: None, None, max_staleness=2)
    back.load_state_dict(torch.load(path, weights_only=True))
    (h,) = back.queue.groups
    x = h.rollouts[0]
    assert h.key == (7, 1) and h.version == 3 and x.sample is samples[2] and x.prompt_ids == ds.prompt_ids[2]
    assert (x.response_ids, x.logprobs, x.finish_reason, x.reward, x.acc) == (
        [5, 6],
        [-1.0, -2.5],
        "length",
        -1.5,
        True,
    )
    assert back._report.sums.responses == 8.0 and back._report.rounds == 2
    assert x.loss_mask is None and h.rollouts[1].loss_mask == [1, 0, 1]
    # a checkpoint from before `Rollout.state`: each rollout a list of 11 values, every token the model's
    old = p.state_dict()
    old["queue"][0][2] = [[r[k] for k in Rollout.LEGACY_STATE[:11]] for r in old["queue"][0][2]]
    back.load_state_dict(old)
    again = back.queue.groups[0].rollouts
    assert (
        [r.loss_mask for r in again] == [None, None]
        and again[0] == x
        and again[1].logprobs == [-1.0, 0.0, -0.5]
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["async_training.max_staleness=-1"], "must be >= 0"),
        (["rollout.n_gpus_per_node=2"], "only asynchronous training"),
        (["async_training.max_staleness=1", "rollout.n_gpus_per_node=0"], "must be >= 1"),
        (
            [
                "async_training.max_staleness=1",
                "rollout.n_gpus_per_node=3",
                "data.gen_batch_size=2",
                "data.train_batch_size=2",
                "actor.ppo_mini_batch_size=2",
            ],
            "at least one engine would never sample",
        ),
        (["async_training.max_staleness=1", "trainer.launcher=ray"], "Ray launcher"),
        (["async_training.max_staleness=1", "reward.num_workers=0"], "reward.num_workers >= 1"),
        (["async_training.max_staleness=1"], "CAMPO runs with the synchronous"),
    ],
)
def test_bad_async_settings_name_the_setting(overrides, message):
    recipe = "tiny_campo" if "CAMPO" in message else "tiny_chain_sum"
    with pytest.raises(ConfigError, match=message):
        validate_config(load_config(recipe, overrides))


ASYNC = ("trainer.total_training_steps=4", "trainer.test_freq=2")


def test_the_engines_take_the_gpus_after_the_trainer_ranks(monkeypatch):
    """`rollout.n_gpus_per_node` engines on the visible GPUs after this machine's trainer ranks (`LOCAL_WORLD_SIZE`);
    too few GPUs is refused with the numbers."""
    from dapo_rl.trainer import _engine_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "6")
    assert _engine_gpus(torch.device("cuda", 3), 2) == ["6", "7"]
    assert _engine_gpus(torch.device("cpu"), 2) == [None, None]
    with pytest.raises(ConfigError, match="6 trainer rank.*8 GPU"):
        _engine_gpus(torch.device("cuda", 0), 3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert _engine_gpus(torch.device("cuda", 0), 1) == ["5"]  # one trainer process: the second visible GPU


@pytest.mark.slow
def test_k0_is_the_synchronous_loop_exactly(base_model, tmp_path):
    """`max_staleness=0` (the default) runs today's loop: the same metrics as a run that never names it, no
    engine process and no `async/*` metric."""
    ref, k0 = tmp_path / "ref", tmp_path / "k0"
    short = ("trainer.total_training_steps=2", "trainer.test_freq=2")
    r = dapo(*run_args(base_model, ref, *short))
    assert r.returncode == 0, r.stderr[-3000:]
    r = dapo(*run_args(base_model, k0, *short, "async_training.max_staleness=0"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "own process" not in r.stdout + r.stderr
    got, want = rows_of(k0), rows_of(ref)
    assert not any(k.startswith("async/") for row in got for k in row)
    assert_same_metrics(got, want)


@pytest.mark.slow
def test_k1_trains_groups_at_most_one_version_old_and_resumes_after_sigkill(base_model, tmp_path):
    """K = 1 on two trainer ranks (FSDP2, gloo) with two engine processes: the engines sample ahead, no trained
    group is more than one version behind the policy, both engines hold the actor's exact weights at every
    validation (the gather and the transport), and a run whose rank 0 is SIGKILLed in step 3 leaves no engine
    process behind and resumes from step 2's checkpoint with its queue, on one rank and one engine."""
    import re

    run = tmp_path / "run"
    args = run_args(base_model, run, *ASYNC, "async_training.max_staleness=1")
    two = ["trainer.nproc_per_node=2", "rollout.n_gpus_per_node=2"]
    r = dapo(
        *args, *two, env_extra={FAULT: "update:3@0"}
    )  # rank 0 killed in step 3, after its optimizer steps
    assert r.returncode == 128 + signal.SIGKILL, r.stderr[-3000:]
    assert "rank 0 was killed by SIGKILL" in r.stderr
    line = re.search(r"runs in 2 process\(es\) of its own \(pid ([\d, ]+)", r.stdout + r.stderr)
    pids = [int(p) for p in line.group(1).split(", ")]
    assert len(pids) == 2 and all(gone(p) for p in pids), f"engine processes {pids} outlived their trainer"
    state = torch.load(run / "checkpoints" / "global_step_2" / "trainer_state.pt", weights_only=True)
    queued = [version for _, version, _ in state["async"]["queue"]]
    assert all(v <= 2 for v in queued)
    assert [x["step"] for x in rows_of(run)] == [0, 1, 2]

    r = dapo(*args, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(run)
    assert [x["step"] for x in rows] == [0, 1, 2, 3, 4]
    train = rows[1:]
    staleness = [x["async/staleness_max"] for x in train]
    print(
        "K=1 staleness max per step",
        staleness,
        "dropped",
        [x["async/dropped_stale_groups"] for x in train],
        "overlap",
        [round(x["async/overlap_ratio"], 2) for x in train],
        "sync gap",
        [x["rollout_corr/sync_logprob_gap"] for x in rows if "rollout_corr/sync_logprob_gap" in x],
        "queued at step 2",
        queued,
    )
    assert max(staleness) <= 1 and max(staleness) == 1  # it ran ahead, never more than one version
    assert all(x["train/kept_groups"] == 8 for x in train)
    # the resumed step 3 trains what step 2's checkpoint queued (and what the engine adds): version 1 or later
    assert train[2]["async/staleness_max"] <= 1
    gaps = [x["rollout_corr/sync_logprob_gap"] for x in rows if "rollout_corr/sync_logprob_gap" in x]
    assert len(gaps) == 3 and max(gaps) < 1e-4  # steps 0, 2, 4: the engines sample with the actor's weights


def test_the_engine_process_samples_the_pushed_weights_and_ignores_sigterm(model_dir):
    """The engine process (the `hf` engine on the tiny model, one thread) samples exactly what the same engine in
    this process samples on the weights pushed through the gloo group, and keeps serving after a SIGTERM (the
    trainer alone decides when to stop); `close` ends it."""
    import os

    from dapo_rl.config import RolloutConfig
    from dapo_rl.models.hf import load_tokenizer
    from dapo_rl.models.tiny import build_tiny_model
    from dapo_rl.rollout import HFRolloutEngine, SamplingParams
    from dapo_rl.rollout.remote import EngineSpec, RemoteEngine

    engine = RemoteEngine(EngineSpec(RolloutConfig(name="hf"), str(model_dir), 64, num_threads=1))
    threads = torch.get_num_threads()
    try:
        assert engine.num_threads == 1
        os.kill(engine.proc.pid, signal.SIGTERM)
        params = SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=11)
        before = engine.generate([[5, 6, 7, 8]], params)[0]
        assert engine.proc.is_alive()
        other = build_tiny_model(seed=4)
        engine.update_weights(other.named_parameters())
        got = engine.generate([[5, 6, 7, 8]], params)[0]
        torch.set_num_threads(1)  # the same kernels as the engine process's
        want = HFRolloutEngine(other, load_tokenizer(str(model_dir))).generate([[5, 6, 7, 8]], params)[0]
    finally:
        torch.set_num_threads(threads)
        proc = engine.proc
        engine.close()
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.logprobs for o in got] == [o.logprobs for o in want]
    assert [o.logprobs for o in got] != [o.logprobs for o in before]  # the push changed the policy
    assert not proc.is_alive()


def test_several_engine_processes_split_a_call_and_sample_what_one_samples(model_dir):
    """`RemoteEngines.generate` over 2 engine processes (the `hf` engine, one prompt per micro-batch): consecutive
    shares sampled side by side, each seeded as its first prompt is in one engine's call, give exactly what one
    engine process gives for the whole call, stop strings included (their `stop_reason` crosses the pipe); a call
    smaller than the group leaves an engine idle; an abort reaches both and the next call samples as before."""
    import re
    import time
    from dataclasses import replace

    from dapo_rl.config import RolloutConfig
    from dapo_rl.models.hf import load_tokenizer
    from dapo_rl.rollout import SamplingParams
    from dapo_rl.rollout.base import GenerationAborted
    from dapo_rl.rollout.remote import EngineSpec, RemoteEngines

    spec = EngineSpec(RolloutConfig(name="hf", micro_batch_size=2), str(model_dir), 64, num_threads=1)
    t0 = time.monotonic()
    engines = RemoteEngines([spec, spec])
    started = time.monotonic() - t0
    tok = load_tokenizer(str(model_dir))
    prompts = [[5 + i, 6, 7, 8, 9][: 2 + i % 3] for i in range(5)]  # shares of 2 and 3 prompts
    params = SamplingParams(n=2, temperature=1.0, max_tokens=24, seed=11)

    def flat(groups):
        return [(o.token_ids, o.logprobs, o.finish_reason, o.stop_reason) for g in groups for o in g]

    try:
        assert len(engines.engines) == 2
        t0 = time.monotonic()
        split = engines.generate(prompts, params)
        took = time.monotonic() - t0
        one = engines.engines[0].generate(prompts, params)
        assert [len(g) for g in split] == [2] * 5
        assert flat(split) == flat(one)
        assert flat(engines.generate(prompts, replace(params, seed=12))) != flat(one)  # the seed is used
        assert flat(engines.generate(prompts[:1], params)) == flat(one[:1])  # the second engine sits it out
        assert engines.generate([], params) == []
        texts = [tok.decode(o.token_ids, skip_special_tokens=True) for g in one for o in g]
        stop = next(
            m for t in texts[4:] for m in re.findall(r"[A-Za-z0-9]", t)
        )  # in the second engine's share
        stopped = engines.generate(prompts, replace(params, stop=[stop]))
        assert flat(stopped) == flat(engines.engines[0].generate(prompts, replace(params, stop=[stop])))
        assert stop in [o.stop_reason for g in stopped[2:] for o in g]
        engines.abort()
        with pytest.raises(GenerationAborted):
            engines.generate(prompts, params)
        assert flat(engines.generate(prompts, params)) == flat(one)
    finally:
        engines.close()
    print(f"2 engine processes: started in {started:.1f} s, a call of 5 prompts x 2 in {took:.1f} s")


def test_a_round_crosses_the_pipe_as_arrays_and_comes_back_as_the_same_lists():
    """`pack_round` (the engine process) and `unpack_round` (the trainer): flat arrays on the wire (review async-lora
    m6), the same Python ints and floats back, empty prompts' groups, a served model's text-only answer and a stop
    string's `stop_reason` kept."""
    import numpy as np

    from dapo_rl.rollout.base import GenerationOutput as Out
    from dapo_rl.rollout.remote import pack_round, unpack_round

    outputs = [
        [Out([1, 2, 151643], [-0.1, -0.2, -0.30000000000000004], "stop"), Out([], [], "length", "42", 7)],
        [],
        [
            Out([2**31 - 1], [-1e-300], "length"),
            Out([60, 47, 62], [-1.0, -2.0, -3.0], "stop", stop_reason="</"),
        ],
    ]
    counts, lengths, meta, ids, lps = pack_round(outputs)
    assert counts == [2, 0, 2] and lengths.tolist() == [[3, 3], [0, 0], [1, 1], [3, 3]]
    assert ids.dtype == np.int32 and ids.tolist() == [1, 2, 151643, 2**31 - 1, 60, 47, 62]
    assert lps.dtype == np.float64 and meta[1] == ("length", "42", 7, None) and meta[3][3] == "</"
    back = unpack_round((counts, lengths, meta, ids, lps))
    assert back == outputs
    assert type(back[0][0].token_ids[0]) is int and type(back[0][0].logprobs[2]) is float
    assert unpack_round(pack_round([])) == []


def test_an_engine_process_that_fails_to_start_reports_its_error(model_dir):
    """A child that fails to build its engine (here: CUDA asked for on a CPU build of torch) is reported with its
    traceback at once; with several engines, the first failure stops them all (no engine process left)."""
    import multiprocessing

    from dapo_rl.config import RolloutConfig
    from dapo_rl.rollout.remote import EngineSpec, RemoteEngine, RemoteEngines

    with pytest.raises(RuntimeError, match="CUDA|cuda"):
        RemoteEngine(EngineSpec(RolloutConfig(name="hf"), str(model_dir), 64, device="cuda"))
    with pytest.raises(ValueError, match="/nonexistent: no such directory"):  # a refusal stays a ValueError
        RemoteEngine(EngineSpec(RolloutConfig(name="hf"), "/nonexistent", 64))
    good = EngineSpec(RolloutConfig(name="hf"), str(model_dir), 64, num_threads=1)
    bad = EngineSpec(RolloutConfig(name="hf"), str(model_dir), 64, device="cuda")
    with pytest.raises(RuntimeError, match="CUDA|cuda"):
        RemoteEngines([good, bad])
    assert not [p for p in multiprocessing.active_children() if p.name == "dapo-engine"]


def test_a_partial_batch_splits_evenly_over_the_trainer_ranks():
    """`on_exhausted: partial` under asynchronous training on 2 ranks: of 3 queued groups of 3 responses, 2 train
    (6 sequences split over 2 ranks; 9 would not)."""
    from dapo_rl.collect import prompt_policy

    cfg = load_config("tiny_chain_sum", ["rollout.n=3", "algorithm.filter_groups.on_exhausted=partial"])
    policy = prompt_policy(cfg.algorithm.filter_groups)
    notes = []
    p = RolloutProducer(None, None, None, None, lambda: cfg, policy, 1, log=notes.append, world_size=2)
    p.queue.groups.extend(_group(0, i) for i in range(3))
    p._exhausted = True
    batch, stats = p.next_batch(8, 0)
    assert [g.key for g in batch] == [(1, 0), (1, 1)] and len(p.queue) == 1
    assert stats["train/kept_groups"] == 2 and notes == [
        "dynamic sampling: 3/8 groups queued after 0 rounds."
    ]


def test_the_host_staging_slots_are_reused_and_the_pushed_one_is_never_written():
    """Review m2: the weights published each step go into the staging slot the producer is not pushing, and a slot
    written again reuses its buffers (same storage, new values)."""
    from dapo_rl.rollout.remote import HostStaging

    staging = HostStaging()
    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    a = staging.copy(0, "w", w)
    b = staging.copy(1, "w", w + 1)
    again = staging.copy(0, "w", w * 2)
    assert again.data_ptr() == a.data_ptr() != b.data_ptr()
    assert again.tolist() == (w * 2).tolist() and b.tolist() == (w + 1).tolist()
    assert staging.copy(0, "w", w.double()).dtype == torch.float64  # a changed dtype: a new buffer

    p = RolloutProducer(None, None, None, None, lambda: None, None, max_staleness=1)
    assert p.discard_pending() == 0  # nothing being pushed: any slot
    p.publish([("w", a)], 1, slot=0)
    p._pushing = 0  # the producer's thread took slot 0 and is pushing it
    assert p.discard_pending() == 1 and p._pending is None
    p._pushing = 1
    assert p.discard_pending() == 0
