"""`actor.lm_head_fp32` (ScaleRL's float32 LM head): the head computes in float32 under bf16 autocast, with float32
weights when untied; the KL term's copy keeps it; under FSDP2 an untied head is its own float32 group (2 real gloo
ranks); LoRA on the head is refused."""

import copy
import os

import pytest
import torch
import torch.multiprocessing as mp
from ranks import free_port, join_gloo

from dapo_rl.actor import Actor, TrainBatch
from dapo_rl.config import ActorConfig, AlgorithmConfig, ConfigError, LoraConfig, load_config
from dapo_rl.distributed import shutdown
from dapo_rl.models.lm_head import head_is_tied, is_fp32_head, lm_head_in_fp32
from dapo_rl.models.tiny import build_tiny_tokenizer


def _untied(seed: int = 3):
    from dapo_rl.models.tiny import build_tiny_model

    return build_tiny_model(
        seed=seed, hidden_size=64, num_layers=2, intermediate_size=128, tie_word_embeddings=False
    )


def _save_untied(path, dtype=torch.float32):
    _untied().to(dtype).save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)


def _batch():
    return TrainBatch.build(
        [[1, 2, 3], [1, 2, 3], [4, 5]],
        [[6, 7, 8], [9, 10], [11, 12, 13]],
        torch.tensor([1.0, -1.0, 0.5]),
        torch.ones(3),
        257,
    )


def _head_io(model):
    """Run `model` under bf16 autocast on fixed ids; returns (the head's input, its output)."""
    seen = {}
    hook = model.get_output_embeddings().register_forward_hook(
        lambda m, args, out: seen.update(x=args[0].detach(), y=out.detach())
    )
    ids = torch.tensor([[5, 17, 99, 3, 250, 42]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids)
    hook.remove()
    return seen["x"], seen["y"]


def test_the_head_computes_float32_logits_from_float32_weights_under_bf16_autocast():
    model = _untied().to(torch.bfloat16)  # bf16 master weights: the untied head becomes float32
    head = lm_head_in_fp32(model)
    assert head.weight.dtype == torch.float32 and model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert is_fp32_head(head) and not head_is_tied(model)
    x, y = _head_io(model)
    assert x.dtype == torch.bfloat16 and y.dtype == torch.float32  # the body stays bf16
    assert torch.equal(y, x.float() @ head.weight.t())  # the float32 product, exactly
    # without it, autocast rounds the same product to bf16
    plain = _untied().to(torch.bfloat16)
    x2, y2 = _head_io(plain)
    assert y2.dtype == torch.bfloat16 and not torch.equal(
        y2.float(), x2.float() @ plain.lm_head.weight.float().t()
    )


def test_a_tied_head_multiplies_the_shared_weight_in_float32_and_stays_tied():
    from dapo_rl.models.tiny import build_tiny_model

    model = build_tiny_model(seed=1, hidden_size=64, num_layers=1, intermediate_size=128)
    head = lm_head_in_fp32(model)
    assert head_is_tied(model) and head.weight.dtype == torch.float32
    x, y = _head_io(model)
    assert y.dtype == torch.float32 and torch.equal(y, x.float() @ model.model.embed_tokens.weight.t())
    # the KL term's reference is a deepcopy: the copy's head runs the float32 forward on the copy's weight
    ref = copy.deepcopy(model)
    assert is_fp32_head(ref.lm_head) and ref.lm_head.forward.__self__ is ref.lm_head and head_is_tied(ref)


def test_the_actors_log_probs_are_the_float32_heads_and_its_reference_keeps_it(tmp_path):
    """The actor's forward under bf16 autocast: log-probs = log_softmax(fp32 head(hidden) / T) with the hidden
    states of the bf16 body; the reference (KL term) has the same head."""
    _save_untied(tmp_path)
    cfg = ActorConfig(autocast_dtype="bfloat16", lm_head_fp32=True, ppo_micro_batch_size=4)
    actor = Actor(str(tmp_path), cfg, AlgorithmConfig(use_kl_loss=True), temperature=0.7)
    assert is_fp32_head(actor.model.lm_head) and is_fp32_head(actor.reference.model.lm_head)
    batch = _batch()
    got = actor.compute_log_prob(batch)
    hidden = {}
    hook = actor.model.lm_head.register_forward_hook(lambda m, a, o: hidden.update(x=a[0].detach()))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        actor.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    hook.remove()
    logp = torch.log_softmax((hidden["x"].float() @ actor.model.lm_head.weight.t()) / 0.7, -1)
    for i in range(len(batch)):
        p, n = int(batch.prompt_lens[i]), int(batch.response_mask[i].sum())
        want = logp[i, p - 1 : p - 1 + n].gather(1, batch.input_ids[i, p : p + n, None]).squeeze(1)
        torch.testing.assert_close(got[i, :n], want, rtol=0, atol=2e-6)
    m = actor.update(batch)
    assert (
        torch.isfinite(torch.tensor(m["actor/pg_loss"])) and actor.model.lm_head.weight.dtype == torch.float32
    )


def test_lora_on_the_head_is_refused():
    with pytest.raises(ConfigError, match="lm_head in actor.lora.target_modules"):
        load_config(
            None, ["actor.lm_head_fp32=true", "actor.lora.rank=4", "actor.lora.target_modules=[lm_head]"]
        )
    from dapo_rl.lora import wrap_model

    model = _untied()
    wrap_model(model, LoraConfig(rank=2, target_modules=["lm_head"]), seed=0)
    with pytest.raises(ConfigError, match="LoRA adapter on the LM head"):
        lm_head_in_fp32(model)


# ------------------------------------------------------------------------------------------------ FSDP2, 2 ranks
def _fsdp_rank_main(rank: int, world: int, port: int, model_dir: str, out_dir: str):
    ctx = join_gloo(rank, world, port)
    try:
        cfg = ActorConfig(autocast_dtype="bfloat16", lm_head_fp32=True, ppo_micro_batch_size=4, lr=1e-3)
        actor = Actor(model_dir, cfg, AlgorithmConfig(use_kl_loss=True), ctx, dtype="bfloat16")
        head, ref_head = actor.model.lm_head, actor.reference.model.lm_head
        seen = {}
        hook = head.register_forward_hook(lambda m, a, o: seen.update(x=a[0].detach(), y=o.detach()))
        actor.compute_log_prob(_batch())
        hook.remove()
        full = head.weight.full_tensor()
        out = {
            "policies": [
                (type(m).__name__, m._get_fsdp_state()._mp_policy.param_dtype)
                for m in (head, actor.model, ref_head, actor.reference.model)
            ],
            "weight_dtype": head.weight.dtype,
            "full": full,
            "exact": torch.equal(seen["y"], seen["x"].float() @ full.t()),
            "y_dtype": seen["y"].dtype,
        }
        actor.update(_batch())
        out["after"] = head.weight.full_tensor()
        del actor
        # a tied head stays in the root group (FSDP2 refuses a parameter in two groups) and still gives float32
        # logits; an all-float32 run makes no group for an untied head
        for key, path, bf16 in (("tied", "tied", True), ("fp32_run", "untied_fp32", False)):
            cfg = ActorConfig(
                autocast_dtype="bfloat16" if bf16 else "none", lm_head_fp32=True, ppo_micro_batch_size=4
            )
            other = Actor(os.path.join(out_dir, path), cfg, AlgorithmConfig(), ctx)
            seen.clear()
            hook = other.model.lm_head.register_forward_hook(lambda m, a, o: seen.update(y=o.detach()))
            other.update(_batch())
            hook.remove()
            out[key] = (
                type(other.model.lm_head).__name__,
                seen["y"].dtype,
                is_fp32_head(other.model.lm_head),
            )
        torch.save(out, os.path.join(out_dir, f"r{rank}.pt"))
    finally:
        shutdown(ctx)


def test_under_fsdp2_an_untied_head_is_its_own_float32_group(tmp_path):
    """bf16 master weights, bf16 compute: every rank's untied head (and its KL reference's) is a float32 group,
    its weights arrive from rank 0 exactly (the checkpoint's bf16 values, held in float32), its logits are the
    float32 product of its input and the gathered float32 weight, and an update keeps them float32. A tied head stays
    in the root group with float32 logits; in an all-float32 run an untied head needs no group of its own."""
    from dapo_rl.models.tiny import save_tiny_checkpoint

    model_dir = tmp_path / "model"
    _save_untied(model_dir, torch.bfloat16)
    _save_untied(tmp_path / "untied_fp32")
    save_tiny_checkpoint(tmp_path / "tied", seed=2, hidden_size=64, num_layers=2, intermediate_size=128)
    want = _untied().to(torch.bfloat16).lm_head.weight.float()
    mp.start_processes(
        _fsdp_rank_main, args=(2, free_port(), str(model_dir), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    for r in (0, 1):
        got = torch.load(tmp_path / f"r{r}.pt", weights_only=False)
        assert [dt for _, dt in got["policies"]] == [torch.float32, torch.bfloat16] * 2, got["policies"]
        assert got["weight_dtype"] == torch.float32 and got["y_dtype"] == torch.float32
        assert torch.equal(got["full"], want) and got["exact"]
        assert got["after"].dtype == torch.float32 and not torch.equal(got["after"], want)
        assert got["tied"] == ("Linear", torch.float32, True) and got["fp32_run"] == (
            "Linear",
            torch.float32,
            True,
        )


def test_the_hf_engine_keeps_a_float32_head_and_receives_it_unrounded(tmp_path):
    """`build_engine(..., lm_head_fp32=True)`: the `hf` engine's head computes in float32; the trainer's bf16 push to
    it (`engine_weights(torch.bfloat16, keep_fp32_head=True)`) keeps the untied head float32 and exact, and rounds
    the rest."""
    from dapo_rl.config import RolloutConfig
    from dapo_rl.rollout import build_engine

    _save_untied(tmp_path)
    kw = dict(max_model_len=64, dtype="bfloat16")
    engine = build_engine(
        RolloutConfig(name="hf"), str(tmp_path), build_tiny_tokenizer(), lm_head_fp32=True, **kw
    )
    assert is_fp32_head(engine.model.lm_head) and engine.model.lm_head.weight.dtype == torch.float32
    actor = Actor(str(tmp_path), ActorConfig(autocast_dtype="bfloat16", lm_head_fp32=True), AlgorithmConfig())
    with torch.no_grad():
        for p in actor.model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)  # values bf16 cannot hold
    # what the trainer sends the hf engine (`push_keeps_fp32_head`); by default, and so in exports, one dtype
    assert dict(actor.engine_weights(torch.bfloat16))["lm_head.weight"].dtype == torch.bfloat16
    pushed = dict(actor.engine_weights(torch.bfloat16, keep_fp32_head=True))
    assert pushed["lm_head.weight"].dtype == torch.float32
    assert pushed["model.embed_tokens.weight"].dtype == torch.bfloat16
    engine.update_weights(pushed.items())
    assert torch.equal(engine.model.lm_head.weight, actor.model.lm_head.weight)
    x, y = _head_io(engine.model)
    assert y.dtype == torch.float32 and torch.equal(y, x.float() @ actor.model.lm_head.weight.t())
    plain = build_engine(RolloutConfig(name="hf"), str(tmp_path), build_tiny_tokenizer(), **kw)
    assert not is_fp32_head(plain.model.lm_head) and plain.model.lm_head.weight.dtype == torch.bfloat16


def test_the_run_config_reaches_both_engines_and_the_push():
    """The trainer's engine settings (also its asynchronous engine's `EngineSpec`) carry the setting; only a push to
    the `hf` engine keeps the float32 head."""
    from dapo_rl.rollout import engine_settings, push_keeps_fp32_head
    from dapo_rl.rollout.remote import EngineSpec

    on = ["actor.lm_head_fp32=true", "actor.autocast_dtype=bfloat16"]
    cfg = load_config(None, on + ["rollout.name=hf"])
    settings = engine_settings(cfg, "bfloat16", None)
    assert settings["lm_head_fp32"] is True and settings["dtype"] == "bfloat16"
    assert EngineSpec(cfg.rollout, "m", **settings).lm_head_fp32 is True
    assert push_keeps_fp32_head(cfg)
    assert not push_keeps_fp32_head(load_config(None, on + ["rollout.name=vllm"]))
    off = load_config(None, ["rollout.name=hf"])
    assert engine_settings(off, "none", None)["lm_head_fp32"] is False and not push_keeps_fp32_head(off)


def test_it_works_on_fake_tensors_for_dapo_plan_measure():
    """`dapo plan --measure` builds the model under `FakeTensorMode`, where `Module.float()` cannot swap parameters:
    the head's new float32 parameters are made without it (an untied bf16 head; a float32 one is left alone)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dapo_rl.actor import model_from_config

    config = _untied().config
    with FakeTensorMode():
        model = model_from_config(config, "bfloat16", device="cpu")  # as `Actor(config=...)` builds it
        assert model.lm_head.weight.dtype == torch.bfloat16
        lm_head_in_fp32(model)
        assert model.lm_head.weight.dtype == torch.float32 and model.lm_head.weight.requires_grad
        same = model_from_config(config, "float32", device="cpu")
        before = same.lm_head.weight
        lm_head_in_fp32(same)
        assert same.lm_head.weight is before


def test_the_start_up_line_says_what_the_setting_does_or_that_it_does_nothing():
    from dapo_rl.models.lm_head import lm_head_fp32_note

    assert lm_head_fp32_note("none", "float32", "hf").startswith(
        "warning: actor.lm_head_fp32=true changes nothing"
    )
    assert "vLLM's head_dtype=float32" in lm_head_fp32_note("bfloat16", "float32", "vllm")
    assert "the hf engine (the same float32 head)" in lm_head_fp32_note("none", "bfloat16", "hf")
