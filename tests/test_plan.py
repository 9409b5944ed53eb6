"""`dapo plan`: every shipped recipe plans; hand-computed numbers; parameter counts checked against transformers."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from ranks import free_port, join_gloo
from transformers import AutoModelForCausalLM, Qwen2Config

from dapo_rl.cli import main
from dapo_rl.config import ConfigError, load_config
from dapo_rl.plan import GIB, QWEN25_SHAPES, format_plan, plan_recipe, qwen2_param_counts

CONFIGS = Path(__file__).resolve().parents[1] / "src" / "dapo_rl" / "configs"
RECIPES = sorted(p.stem for p in CONFIGS.glob("*.yaml"))
QWEN25_32B_PARAMS = 32_763_876_352  # Qwen2.5-32B, untied embeddings


def _meta_counts(shape: dict) -> tuple[int, int]:
    """(total, one decoder layer) of the transformers model built from `shape` on the meta device."""
    fields = {k: v for k, v in shape.items() if k != "name"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**fields))
    total = sum(p.numel() for p in model.parameters())
    return total, sum(p.numel() for p in model.model.layers[0].parameters())


def test_the_paper_recipes_are_shipped():
    for name in ("dapo_qwen2.5_32b", "grpo_qwen2.5_32b", "dapo_qwen2.5_7b_math", "tiny_chain_sum"):
        assert name in RECIPES


@pytest.mark.parametrize("name", RECIPES)
def test_every_shipped_recipe_loads_and_plans(name, capsys):
    load_config(name)
    assert main(["plan", name]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"dapo plan: {name}")
    assert "parameters" in out and "verdict" in out and " rank" in out


def test_32b_recipe_numbers_by_hand():
    plan = plan_recipe(load_config("dapo_qwen2.5_32b"))
    hw, b, mem = plan["hardware"], plan["batch"], plan["memory"]
    assert (hw["nnodes"], hw["ranks_per_node"], hw["world_size"], hw["device"]) == (16, 8, 128, "cuda")
    assert b["optimizer_steps_per_step"] == 512 // 32 == 16
    assert b["tokens_per_step"] == 512 * 16 * (2048 + 20480)
    assert b["tokens_per_rank_per_step"] == 512 * 16 * (2048 + 20480) / 128
    assert b["gen_prompts_per_rank"] == 1536 / 128 == 12
    assert b["gen_sequences_per_rank"] == 12 * 16
    assert b["train_prompts_per_rank"] == 4 and b["train_sequences_per_rank"] == 64
    assert b["mini_batch_sequences_per_rank"] == 32 * 16 / 128 == 4
    assert b["micro_batch_sequences"] == 1 and b["tokens_per_micro_batch"] == 22528
    assert b["max_gen_rounds"] == 10
    assert plan["model"]["num_params"] == QWEN25_32B_PARAMS
    assert mem["params"] == QWEN25_32B_PARAMS * 4 // 128  # fp32 master weights
    assert mem["grads"] == mem["params"]
    assert mem["optimizer"] == QWEN25_32B_PARAMS * 8 // 128  # AdamW: two fp32 moments
    assert mem["engine"] == int(0.8 * 80 * GIB)  # vLLM's share of an 80 GiB GPU
    assert (
        mem["rollout_phase"] == mem["params"] + mem["optimizer"] + mem["engine"]
    )  # the update frees the grads
    # the response positions' logits: the fp32 copy kept for the backward (the bf16 ones are dropped once cast);
    # the entropy's three fp32 temporaries over 1,024 positions at a time
    assert mem["act_logits"] == 20480 * 152064 * 4 + 3 * 1024 * 152064 * 4
    assert mem["peak"] == max(mem["rollout_phase"], mem["update_phase"])
    assert mem["fits"] is True
    text = format_plan(plan)
    assert "16 nodes x 8 GPUs = 128 ranks, device cuda" in text
    assert "verdict   FITS 128 x 80 GiB GPUs" in text
    assert "32,763,876,352 parameters" in text


def test_the_kl_terms_reference_is_one_more_sharded_copy_of_the_weights():
    """`algorithm.use_kl_loss`: the 32B recipe with the KL term holds a frozen fp32 copy of the weights, sharded over
    its 128 ranks, in both phases; the text names it."""
    base = plan_recipe(load_config("dapo_qwen2.5_32b"))["memory"]
    plan = plan_recipe(load_config("dapo_qwen2.5_32b", ["algorithm.use_kl_loss=true"]))
    mem = plan["memory"]
    assert base["reference"] == 0 and mem["reference"] == -(-QWEN25_32B_PARAMS * 4 // 128)
    assert mem["rollout_phase"] == base["rollout_phase"] + mem["reference"]
    assert mem["update_phase"] == base["update_phase"] + mem["reference"]
    assert "KL reference" in format_plan(plan) and "KL reference" not in format_plan(
        plan_recipe(load_config(None))
    )


def test_grpo_recipe_is_table_1_first_row():
    a, d = load_config("grpo_qwen2.5_32b"), load_config("dapo_qwen2.5_32b")
    assert (a.algorithm.clip_ratio_low, a.algorithm.clip_ratio_high) == (0.2, 0.2)
    assert a.algorithm.loss_agg_mode == "seq-mean-token-mean"
    assert not a.algorithm.overlong_buffer.enable and not a.algorithm.filter_groups.enable
    assert a.data.gen_batch_size == a.data.train_batch_size == 512
    assert (a.model, a.rollout, a.actor, a.data.max_response_length) == (
        d.model,
        d.rollout,
        d.actor,
        d.data.max_response_length,
    )


def test_retool_recipe_numbers_by_hand():
    cfg = load_config("retool_qwen2.5_32b")
    assert (cfg.episode.name, cfg.episode.tool.max_calls, cfg.episode.tool.timeout_s) == ("tool", 7, 30.0)
    assert cfg.episode.tool.format == "chat_template"
    assert (cfg.algorithm.clip_ratio_low, cfg.algorithm.clip_ratio_high, cfg.algorithm.clip_ratio_c) == (
        0.2,
        0.28,
        10.0,
    )
    assert not cfg.algorithm.filter_groups.enable and cfg.rollout.tensor_model_parallel_size == 1
    plan = plan_recipe(cfg)
    b, mem = plan["batch"], plan["memory"]
    assert plan["hardware"]["world_size"] == 64
    assert b["optimizer_steps_per_step"] == 512 // 64 == 8
    assert b["tokens_per_micro_batch"] == 2048 + 16384
    assert mem["params"] == QWEN25_32B_PARAMS * 4 // 64 and mem["optimizer"] == QWEN25_32B_PARAMS * 8 // 64
    assert mem["engine"] == int(0.85 * 80 * GIB)
    assert mem["peak"] == mem["rollout_phase"] == mem["params"] + mem["optimizer"] + mem["engine"]
    assert round(mem["peak"] / GIB, 2) == 73.72 and mem["fits"] is True


def test_a_smaller_gpu_changes_the_verdict():
    cfg = load_config("dapo_qwen2.5_32b")
    assert plan_recipe(cfg, gpu_memory_gib=40)["memory"]["fits"] is False
    assert "DOES NOT FIT" in format_plan(plan_recipe(cfg, gpu_memory_gib=40))


@pytest.mark.parametrize("hint", sorted(QWEN25_SHAPES))
def test_size_hint_counts_equal_transformers_on_meta(hint):
    shape = QWEN25_SHAPES[hint]
    total, layer = _meta_counts(shape)
    counts = qwen2_param_counts(shape)
    assert counts["total"] == total
    assert counts["layer"] == layer
    if hint == "32b":
        assert total == QWEN25_32B_PARAMS


def test_embedded_model_count_equals_the_built_model():
    from dapo_rl.models.tiny import build_tiny_model

    cfg = load_config("tiny_chain_sum")
    s = cfg.sft
    model = build_tiny_model(
        hidden_size=s.hidden_size,
        num_layers=s.num_layers,
        num_heads=s.num_heads,
        intermediate_size=s.intermediate_size,
        max_position_embeddings=s.max_position_embeddings,
    )
    assert plan_recipe(cfg)["model"]["num_params"] == sum(p.numel() for p in model.parameters())


def test_config_json_is_read_exactly(tmp_path, capsys):
    shape = {k: v for k, v in QWEN25_SHAPES["0.5b"].items() if k != "name"}
    shape.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", **shape}))
    plan = plan_recipe(load_config("dapo_qwen2.5_0.5b_gsm8k", [f"model.path={tmp_path}"]))
    assert plan["model"]["num_params"] == qwen2_param_counts(shape)["total"]
    assert plan["model"]["num_layers"] == 2
    assert "config.json" in plan["model"]["source"]
    assert main(["plan", "dapo_qwen2.5_0.5b_gsm8k", f"model.path={tmp_path}"]) == 0
    assert "built on the meta device" in capsys.readouterr().out


def test_world_size_from_the_torchrun_shorthand():
    plan = plan_recipe(load_config("dapo_qwen2.5_1.5b_math", ["trainer.nproc_per_node=4"]))
    assert plan["hardware"]["world_size"] == 4
    assert plan["batch"]["gen_prompts_per_rank"] == 192 / 4
    assert plan["memory"]["params"] == -(-plan["model"]["num_params"] * 4 // 4)


def test_context_overflow_is_a_warning():
    plan = plan_recipe(load_config("dapo_qwen2.5_7b_math", ["data.max_response_length=8192"]))
    assert any("max_position_embeddings 4,096" in w for w in plan["warnings"])


def test_typo_override_exits_2_with_a_suggestion(capsys):
    assert main(["plan", "dapo_qwen2.5_32b", "actor.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert "did you mean actor.lr" in err and "Traceback" not in err


def test_unknown_recipe_exits_2_listing_the_recipes(capsys):
    assert main(["plan", "no_such_recipe"]) == 2
    err = capsys.readouterr().err
    assert "no recipe named 'no_such_recipe'" in err and "dapo_qwen2.5_32b" in err
    assert "Traceback" not in err


def test_no_model_path_nor_size_hint_is_one_line(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model:\n  path: {tmp_path / 'absent'}\n")
    assert main(["plan", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.path" in err and "model.size_hint" in err
    with pytest.raises(ConfigError, match="model.size_hint='64b' is not one of"):
        plan_recipe(load_config("dapo_qwen2.5_32b", ["model.size_hint=64b"]))


def test_plans_a_vllm_recipe_where_vllm_is_absent(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    assert main(["plan", "dapo_qwen2.5_32b"]) == 0
    out = capsys.readouterr().out
    assert (
        "vLLM engine" in out
        and "vLLM is not installed; pip install vllm" in out
        and "planned as written" in out
    )


def test_smollm2_alias_plans_from_its_published_shape_before_conversion(monkeypatch, tmp_path):
    from transformers import LlamaConfig

    from dapo_rl.plan import SMOLLM2_135M_SHAPE

    monkeypatch.setenv("DAPO_RL_CACHE", str(tmp_path))  # nothing converted here: no download for a plan
    plan = plan_recipe(load_config("smollm2_chain_sum"))
    assert plan["model"]["num_params"] == 134_515_008  # 30 x 3,540,096 + 49,152 x 576 + 576, by hand
    assert "not converted yet" in plan["model"]["source"]
    fields = {k: v for k, v in SMOLLM2_135M_SHAPE.items() if k != "name"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**fields))
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert not any(tmp_path.iterdir())


def test_packed_and_padded_forwards_keep_the_same_logits():
    """The padded forward selects the response positions by indexing (no `gather` keeping the bf16 logits)."""
    padded = plan_recipe(load_config("dapo_qwen2.5_32b"))["memory"]["act_logits"]
    packed = plan_recipe(load_config("dapo_qwen2.5_32b", ["actor.use_remove_padding=true"]))["memory"][
        "act_logits"
    ]
    assert padded == packed == 20480 * 152064 * 4 + 3 * 1024 * 152064 * 4


def test_vllm_cpu_engine_is_awake_through_the_update():
    mem = plan_recipe(load_config("smollm2_chain_sum", ["trainer.device=cpu"]))["memory"]
    assert mem["engine_asleep_in_update"] is False
    assert mem["update_phase"] == mem["states"] + mem["compute_copies"] + mem["activations"] + mem["engine"]


# ---------------------------------------------------------------------------------------------- dapo plan --measure
MEASURE_OVERRIDES = [
    "actor.gradient_checkpointing=true",
    "actor.autocast_dtype=bfloat16",
    "actor.ppo_micro_batch_size=8",
]
"""The embedded model as the GPU recipes train: activation checkpointing, FSDP2 with bf16 compute, two micro-batches
per mini-batch and rank (the second with the first's gradients resident)."""


def _real_update_rank(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    """One rank of a real gloo job: the measured batch through `Actor.update` under `FSDPMemTracker`."""
    from dapo_rl.actor import Actor
    from dapo_rl.distributed import shutdown
    from dapo_rl.plan import model_config
    from dapo_rl.plan_measure import measure_setup, tracked_update

    cfg = load_config("tiny_chain_sum", MEASURE_OVERRIDES)
    ctx = join_gloo(rank, world, port)
    try:
        actor_cfg, batch, _, micro_batches = measure_setup(cfg, world, model_config(cfg).vocab_size)
        assert micro_batches == 2
        actor = Actor(
            model_dir,
            actor_cfg,
            cfg.algorithm,
            ctx,
            dtype=cfg.model.dtype,
            temperature=cfg.rollout.temperature,
            attn_implementation="sdpa",
        )
        result = tracked_update(actor, batch)
        if ctx.is_main:
            torch.save(result, out)
    finally:
        shutdown(ctx)


def _fake_update(_: int, out: str) -> None:
    """`measure_update` at 2 fake ranks in a process of its own, as `dapo plan --measure` runs it: the test process
    holds earlier tests' objects (one failing run counted ~0.8 MB more than the real update, with a vLLM
    finalizer run under the fake mode; not reproduced in isolation)."""
    from dapo_rl.plan import model_config
    from dapo_rl.plan_measure import measure_update

    cfg = load_config("tiny_chain_sum", MEASURE_OVERRIDES)
    fake = measure_update(cfg, model_config(cfg), world_size=2)
    assert not torch.distributed.is_initialized()  # the fake process group is gone
    torch.save(fake, out)


def test_fake_measurement_equals_a_real_two_rank_update(tmp_path):
    """The update measured on fake tensors at 2 fake ranks against the same FSDPMemTracker around a real 2-rank gloo
    update of the same batch (the embedded model, checkpointing, bf16 compute). Measured: 0.9986 of the real peak
    (the real run also counts the batch's host-side slices, which live on the same CPU there); resident state equal.
    """
    import torch.multiprocessing as mp
    from transformers import AutoModelForCausalLM

    from dapo_rl.plan import model_config

    cfg = load_config("tiny_chain_sum", MEASURE_OVERRIDES)
    AutoModelForCausalLM.from_config(model_config(cfg)).save_pretrained(tmp_path / "model")
    out = tmp_path / "real.pt"
    mp.start_processes(
        _real_update_rank,
        args=(2, free_port(), str(tmp_path / "model"), str(out)),
        nprocs=2,
        start_method="spawn",
    )
    real = torch.load(out, weights_only=False)
    mp.start_processes(_fake_update, args=(str(tmp_path / "fake.pt"),), nprocs=1, start_method="spawn")
    fake = torch.load(tmp_path / "fake.pt", weights_only=False)
    ratio = fake["update_peak"]["total"] / real["update_peak"]["total"]
    print(
        f"update peak per rank: fake {fake['update_peak']['total']:,} B, real {real['update_peak']['total']:,} B, "
        f"fake / real {ratio:.4f}; resident {fake['resident']['total']:,} B vs {real['resident']['total']:,} B"
    )
    assert ratio == pytest.approx(1.0, abs=0.01)
    assert fake["resident"]["total"] == pytest.approx(real["resident"]["total"], rel=1e-3)
    for kind in ("params", "grads", "optimizer", "temporaries"):  # the host-side slices are activations
        assert fake["update_peak"][kind] == pytest.approx(real["update_peak"][kind], rel=1e-3), kind


@pytest.mark.parametrize("lora", [[], ["actor.lora.rank=8"]], ids=["full", "lora"])
def test_fake_measurement_equals_a_real_one_process_update(tmp_path, lora):
    """One process (no FSDP2, `MemTracker`, bf16 autocast): the fake measurement against the real update; under
    LoRA too (the actor builds and wraps its model on a real meta device, outside the fake mode)."""
    from transformers import AutoModelForCausalLM

    from dapo_rl.actor import Actor
    from dapo_rl.plan import model_config
    from dapo_rl.plan_measure import measure_setup, measure_update, tracked_update

    cfg = load_config(
        "tiny_chain_sum", ["actor.autocast_dtype=bfloat16", "actor.ppo_micro_batch_size=16", *lora]
    )
    AutoModelForCausalLM.from_config(model_config(cfg)).save_pretrained(tmp_path)
    actor_cfg, batch, _, micro_batches = measure_setup(cfg, 1, model_config(cfg).vocab_size)
    assert micro_batches == 2
    actor = Actor(str(tmp_path), actor_cfg, cfg.algorithm, dtype=cfg.model.dtype, attn_implementation="sdpa")
    real = tracked_update(actor, batch)
    fake = measure_update(cfg, model_config(cfg), world_size=1)
    ratio = fake["update_peak"]["total"] / real["update_peak"]["total"]
    print(f"one process: fake / real update peak {ratio:.4f}")
    assert ratio == pytest.approx(1.0, abs=0.01)
    assert fake["resident"]["total"] == real["resident"]["total"]
    if lora:  # AdamW state of the adapters alone (plus its step counters), as the plan estimates it
        plan = plan_recipe(cfg)
        assert 0 <= real["resident"]["optimizer"] - plan["memory"]["optimizer"] < 1000


def test_plan_measure_prints_the_measured_memory(capsys):
    assert main(["plan", "tiny_chain_sum", "trainer.n_gpus_per_node=2", "--measure"]) == 0
    out = capsys.readouterr().out
    assert "measured per GPU (GiB; the real Actor.update on fake tensors" in out
    assert "2 fake ranks, FSDPMemTracker" in out
    for row in ("update phase", "loading", "rollout phase", "temporaries"):
        assert f"\n  {row}" in out
    assert "verdict   FITS 2 x 80 GiB GPUs (1 x 2): measured peak" in out
    assert not torch.distributed.is_initialized()


def test_measured_phases_by_hand():
    from dapo_rl.plan import add_measurement

    plan = plan_recipe(load_config("dapo_qwen2.5_32b"))
    zero = dict.fromkeys(("params", "grads", "optimizer", "activations", "temporaries"), 0)
    measured = {
        "update_peak": {**zero, "total": 70 * GIB, "tracker": {}},
        "resident": {**zero, "params": GIB, "optimizer": 2 * GIB, "total": 3 * GIB, "tracker": {}},
        "world_size": 128,
        "largest_param_bytes": 3 * GIB,
    }
    ms = add_measurement(plan, measured)["measured"]
    assert ms["update"] == 70 * GIB  # vLLM asleep at sleep_level 2
    assert ms["loading"] == GIB + 3 * GIB  # shards + the full parameter in flight
    assert ms["loading_host"] == QWEN25_32B_PARAMS * 4  # rank 0 reads the fp32 model into host memory
    assert ms["rollout"] == 3 * GIB + int(0.8 * 80 * GIB)
    assert ms["peak"] == 70 * GIB and ms["fits"] is True
    awake = add_measurement(plan_recipe(load_config("dapo_qwen2.5_32b", ["rollout.sleep_level=0"])), measured)
    assert awake["measured"]["update"] == 70 * GIB + int(0.8 * 80 * GIB)
    assert awake["measured"]["fits"] is False


def test_measured_micro_batch_follows_the_recipe():
    from dapo_rl.plan_measure import measure_setup, micro_batch_rows

    assert micro_batch_rows(load_config("dapo_qwen2.5_32b"), 128) == 1
    assert micro_batch_rows(load_config("dapo_qwen2.5_1.5b_math"), 1) == 4
    actor_cfg, batch, rows, micro_batches = measure_setup(load_config("dapo_qwen2.5_1.5b_math"), 1, 100)
    assert (rows, micro_batches, actor_cfg.ppo_micro_batch_size, actor_cfg.autocast_dtype) == (
        4,
        2,
        4,
        "bfloat16",
    )
    assert batch.input_ids.shape == (8, 1024 + 3072) and bool(batch.attention_mask.all())
    # tiny_chain_sum: a rank's 64-sequence mini-batch is one micro-batch (ppo_micro_batch_size 256)
    _, batch, rows, micro_batches = measure_setup(load_config("tiny_chain_sum"), 1, 258)
    assert (rows, micro_batches, len(batch)) == (64, 1, 64)
    assert (
        micro_batch_rows(load_config("tiny_chain_sum"), 2) == 32
    )  # the rank's share of a mini-batch: 8 x 8 / 2
    dyn = load_config(
        "dapo_qwen2.5_1.5b_math", ["actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=9000"]
    )
    assert micro_batch_rows(dyn, 1) == 2  # two 4,096-token rows in a 9,000-token budget


# ------------------------------------------------------------------------------------------------------------- LoRA
QWEN25_05B_LORA8 = 24 * 8 * (2 * (896 + 896) + 2 * (896 + 128) + 3 * (896 + 4864))
"""Qwen2.5-0.5B, rank 8, all-linear, by hand: h 896, 14 heads of 64 (q and o: 896 wide), 2 key/value heads (k and
v: 128 wide), MLP 4,864. Per layer r x (in + out): q 8 x 1,792, k 8 x 1,024, v 8 x 1,024, o 8 x 1,792, gate, up and
down 8 x 5,760 each: 8 x 22,912 = 183,296; x 24 layers = 4,399,104 (the LM head is left out)."""


def _peft_counts(cfg, target_modules, dtype=torch.float32):
    """(trainable parameters, adapted modules, adapter dtypes, frozen dtypes) of the recipe's model wrapped by PEFT on
    the meta device, as the Actor wraps it (`all-linear` passed as PEFT's string shorthand)."""
    import peft

    from dapo_rl.plan import model_config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config(cfg), dtype=dtype)
    targets = "all-linear" if target_modules == ["all-linear"] else target_modules
    model = peft.get_peft_model(
        model, peft.LoraConfig(r=cfg.actor.lora.rank, target_modules=targets, task_type="CAUSAL_LM")
    )
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    adapted = sum(isinstance(m, peft.tuners.lora.LoraLayer) for m in model.modules())
    return sum(p.numel() for p in trainable), adapted, {p.dtype for p in trainable}, {p.dtype for p in frozen}


@pytest.mark.filterwarnings(
    "ignore:Model has `tie_word_embeddings=True`"
)  # PEFT, on adapting the tied embedding
@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "v_proj"], ["embed_tokens", "down_proj"]])
@pytest.mark.parametrize("source", ["embedded", "size_hint", "smollm2_shape", "config_json"])
def test_lora_count_equals_peft_on_meta(source, targets, monkeypatch, tmp_path):
    """The plan's adapter count against PEFT's own (`requires_grad` parameters after `get_peft_model`), for every
    source of the model's shape: the embedded Qwen2, a Qwen2.5 size hint, SmolLM2's Llama shape, and a config.json
    (built on the meta device, grouped-query attention with an explicit head_dim)."""
    overrides = [
        f"actor.lora.rank={16 if source == 'smollm2_shape' else 8}",
        f"actor.lora.target_modules={targets}",
    ]
    recipe = {
        "embedded": "tiny_chain_sum",
        "size_hint": "dapo_qwen2.5_0.5b_gsm8k",
        "smollm2_shape": "smollm2_chain_sum",
        "config_json": "dapo_qwen2.5_0.5b_gsm8k",
    }[source]
    if source == "smollm2_shape":
        monkeypatch.setenv("DAPO_RL_CACHE", str(tmp_path))  # its published shape, not a converted checkpoint
    if source == "config_json":
        shape = {k: v for k, v in QWEN25_SHAPES["0.5b"].items() if k != "name"}
        shape.update(
            hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, head_dim=32
        )
        (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", **shape}))
        overrides.append(f"model.path={tmp_path}")
    cfg = load_config(recipe, overrides)
    plan = plan_recipe(cfg)
    trainable, adapted, adapter_dtypes, _ = _peft_counts(cfg, targets)
    assert plan["lora"]["trainable_params"] == trainable
    assert plan["lora"]["num_modules"] == adapted
    assert plan["memory"]["trainable_params"] == trainable
    assert plan["memory"]["total_params"] == plan["model"]["num_params"] + trainable
    assert adapter_dtypes == {torch.float32}
    if source == "size_hint" and targets == ["all-linear"]:
        assert trainable == QWEN25_05B_LORA8 == 4_399_104


def test_peft_keeps_adapters_in_fp32_on_a_bf16_base():
    """What `ADAPTER_BYTES` stands on: the adapters are fp32 while the frozen base stays bf16."""
    from dapo_rl.plan import ADAPTER_BYTES

    cfg = load_config("dapo_qwen2.5_0.5b_gsm8k", ["actor.lora.rank=8", "model.dtype=bfloat16"])
    trainable, _, adapter_dtypes, frozen_dtypes = _peft_counts(cfg, ["all-linear"], dtype=torch.bfloat16)
    assert trainable == QWEN25_05B_LORA8
    assert adapter_dtypes == {torch.float32} and frozen_dtypes == {torch.bfloat16}
    assert ADAPTER_BYTES == 4


def test_lora_memory_of_qwen25_05b_by_hand():
    base = 494_032_768  # Qwen2.5-0.5B (test_size_hint_counts_equal_transformers_on_meta)
    plan = plan_recipe(
        load_config("dapo_qwen2.5_0.5b_gsm8k", ["actor.lora.rank=8"])
    )  # 1 GPU, fp32, bf16 autocast
    mem, lora = plan["memory"], plan["lora"]
    assert lora["trainable_params"] == QWEN25_05B_LORA8 == 4_399_104
    assert lora["num_modules"] == 24 * 7 == 168
    assert mem["params"] == (base + 4_399_104) * 4 == 1_993_727_488  # frozen fp32 base + fp32 adapters
    assert mem["grads"] == 4_399_104 * 4 == 17_596_416  # the adapters only
    assert mem["optimizer"] == 2 * 4 * 4_399_104 == 35_192_832  # AdamW's two fp32 moments of the adapters
    assert mem["states"] == 1_993_727_488 + 17_596_416 + 35_192_832
    assert mem["compute_copies"] == base * 2  # as for full fine-tuning: a bf16 copy of every weight
    # activations: lora_A's output, r = 8 bf16 values per adapted module and token (168 modules), 12,288 tokens
    assert mem["act_lora"] == 12_288 * 168 * 8 * 2 == 33_030_144
    full = plan_recipe(load_config("dapo_qwen2.5_0.5b_gsm8k"))["memory"]
    assert mem["activations"] == full["activations"] + 33_030_144
    assert full["trainable_params"] == full["total_params"] == base and full["act_lora"] == 0
    # bf16 base over 8 GPUs: the frozen base in 2 bytes, the adapters still in 4; everything / 8
    mem8 = plan_recipe(
        load_config(
            "dapo_qwen2.5_0.5b_gsm8k",
            ["actor.lora.rank=8", "model.dtype=bfloat16", "trainer.n_gpus_per_node=8"],
        )
    )["memory"]
    assert mem8["params"] == (base * 2 + 4_399_104 * 4) // 8 == 125_707_744
    assert mem8["grads"] == 4_399_104 * 4 // 8 == 2_199_552
    assert mem8["optimizer"] == 2 * 4 * 4_399_104 // 8 == 4_399_104
    # dropout 0.1: each adapted module also keeps its dropped input (bf16) and the 1-byte mask: per layer the inputs
    # are q, k, v, gate, up: h = 896 each, o: 896, down: 4,864 -> 10,240 values
    drop = plan_recipe(
        load_config("dapo_qwen2.5_0.5b_gsm8k", ["actor.lora.rank=8", "actor.lora.dropout=0.1"])
    )
    assert drop["lora"]["act_bytes_per_token"] == 24 * (7 * 8 * 2 + 10_240 * (2 + 1)) == 739_968


def test_lora_plan_text():
    text = format_plan(plan_recipe(load_config("dapo_qwen2.5_0.5b_gsm8k", ["actor.lora.rank=8"])))
    assert (
        "adapters  LoRA rank 8 (all-linear): 4,399,104 trainable parameters (0.89% of 494,032,768), frozen base in "
        "float32\n          168 modules adapted, alpha 32, dropout 0;" in text
    )
    assert "  parameters           1.86   (494,032,768 frozen x 4 B + 4,399,104 adapter x 4 B)\n" in text
    assert "  gradients            0.02   the adapters only: 4,399,104 x 4 B\n" in text
    assert "  AdamW moments        0.03   the adapters only: 2 x 4 B per adapter parameter\n" in text
    assert "(estimate; LoRA adapters 0.03 of it)" in text
    full = format_plan(plan_recipe(load_config("dapo_qwen2.5_0.5b_gsm8k")))
    assert "adapters" not in full and "LoRA" not in full
    assert "  gradients            1.84   same as the parameters\n" in full  # 494,032,768 x 4 B
    sharded = format_plan(
        plan_recipe(load_config("dapo_qwen2.5_32b", ["actor.lora.rank=64", "model.dtype=bfloat16"]))
    )
    assert "frozen base in bfloat16" in sharded and "x 4 B) / 128\n" in sharded


def test_lora_explicit_targets_by_hand():
    def lora(*targets):
        cfg = load_config(
            "dapo_qwen2.5_0.5b_gsm8k", ["actor.lora.rank=8", f"actor.lora.target_modules={list(targets)}"]
        )
        return plan_recipe(cfg)

    # q: 8 x (896 + 896) = 14,336; v: 8 x (896 + 128) = 8,192; per layer 22,528, x 24 layers
    assert lora("q_proj", "v_proj")["lora"]["trainable_params"] == 24 * 22_528 == 540_672
    # a full name (PEFT: equal, or ends in "." + the name): layer 0's q projection only
    assert lora("layers.0.self_attn.q_proj")["lora"]["trainable_params"] == 14_336
    # the LM head, named: 8 x (896 + 151,936); all-linear leaves it out
    assert lora("lm_head")["lora"]["trainable_params"] == 8 * (896 + 151_936) == 1_222_656
    plan = lora("q_proj", "no_such_proj")
    assert plan["lora"]["trainable_params"] == 24 * 14_336
    assert any("no_such_proj match no linear layer" in w for w in plan["warnings"])
    with pytest.raises(ConfigError, match="matches no linear layer or embedding of Qwen2.5-0.5B"):
        lora("no_such_proj")
    # in a longer list, all-linear is a module name (as dapo_rl.lora.wrap_model hands a list to PEFT): q only
    mixed = lora("all-linear", "q_proj")
    assert mixed["lora"]["trainable_params"] == 24 * 14_336
    assert any("all-linear match no linear layer" in w for w in mixed["warnings"])


def test_measurement_gives_the_frozen_base_no_gradient():
    """`tracked_update` on a PEFT-wrapped model (the embedded tiny Qwen2, rank 8, AdamW over the adapters, an update
    that runs one forward/backward/step): the frozen base gets no gradient, and the measured states equal the plan's.
    Adapters by hand: per layer q, k, v, o 8 x (192 + 192), gate, up, down 8 x (192 + 576): 30,720; x 3 layers."""
    from types import SimpleNamespace

    import peft

    from dapo_rl.plan import model_config
    from dapo_rl.plan_measure import tracked_update

    cfg = load_config("tiny_chain_sum", ["actor.lora.rank=8"])
    plan = plan_recipe(cfg)
    assert plan["lora"]["trainable_params"] == 3 * 30_720 == 92_160
    torch.manual_seed(0)
    model = peft.get_peft_model(
        AutoModelForCausalLM.from_config(model_config(cfg)),
        peft.LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable)

    grad_bytes = []

    def update(ids):
        model(input_ids=ids).logits.float().mean().backward()
        grad_bytes.append(
            sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
        )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    actor = SimpleNamespace(
        model=model,
        optimizer=optimizer,
        ctx=SimpleNamespace(sharded=False),
        device=torch.device("cpu"),
        update=update,
    )
    result = tracked_update(actor, torch.randint(0, 258, (2, 16)))
    assert all(p.grad is None for p in model.parameters())
    resident, peak, mem = result["resident"], result["update_peak"], plan["memory"]
    assert resident["grads"] == 0
    assert resident["tracker"]["Parameter"] == mem["params"] == (1_490_304 + 92_160) * 4
    assert grad_bytes == [mem["grads"]] == [92_160 * 4]  # after the backward: the adapters' gradients only
    assert 0 < peak["grads"] <= mem["grads"]  # (at the update's peak, in the backward, some of them)
    # AdamW: two fp32 moments per adapter parameter, plus a 4-byte `step` per parameter tensor (42: A and B of 21)
    assert resident["optimizer"] == mem["optimizer"] + 42 * 4 == 2 * 4 * 92_160 + 168


@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "v_proj"]])
def test_lora_count_equals_the_actors_wrapping(targets):
    """The same count through `dapo_rl.lora.wrap_model`, which the Actor calls (its `all-linear` conversion included):
    the embedded tiny Qwen2 at rank 4, on the meta device."""
    from dapo_rl.lora import wrap_model
    from dapo_rl.plan import model_config

    cfg = load_config("tiny_chain_sum", ["actor.lora.rank=4", f"actor.lora.target_modules={targets}"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config(cfg))
    wrapped = wrap_model(model, cfg.actor.lora, seed=0)
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    # by hand, per layer (h 192, 4 heads of 48: k and v 192 wide, MLP 576): all-linear 4 x (4 x 384 + 3 x 768) =
    # 15,360; q and v 4 x (384 + 384) = 3,072; x 3 layers
    assert (
        plan_recipe(cfg)["lora"]["trainable_params"]
        == trainable
        == 3 * (15_360 if targets[0] == "all-linear" else 3_072)
    )
