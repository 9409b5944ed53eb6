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


def test_fake_measurement_equals_a_real_two_rank_update(tmp_path):
    """The update measured on fake tensors at 2 fake ranks against the same FSDPMemTracker around a real 2-rank gloo
    update of the same batch (the embedded model, checkpointing, bf16 compute). Measured: 0.9986 of the real peak
    (the real run also counts the batch's host-side slices, which live on the same CPU there); resident state equal.
    """
    import torch.multiprocessing as mp
    from transformers import AutoModelForCausalLM

    from dapo_rl.plan import model_config
    from dapo_rl.plan_measure import measure_update

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
    fake = measure_update(cfg, model_config(cfg), world_size=2)
    assert not torch.distributed.is_initialized()  # the fake process group is gone
    ratio = fake["update_peak"]["total"] / real["update_peak"]["total"]
    print(
        f"update peak per rank: fake {fake['update_peak']['total']:,} B, real {real['update_peak']['total']:,} B, "
        f"fake / real {ratio:.4f}; resident {fake['resident']['total']:,} B vs {real['resident']['total']:,} B"
    )
    assert ratio == pytest.approx(1.0, abs=0.01)
    assert fake["resident"]["total"] == pytest.approx(real["resident"]["total"], rel=1e-3)
    for kind in ("params", "grads", "optimizer", "temporaries"):  # the host-side slices are activations
        assert fake["update_peak"][kind] == pytest.approx(real["update_peak"][kind], rel=1e-3), kind


def test_fake_measurement_equals_a_real_one_process_update(tmp_path):
    """One process (no FSDP2, `MemTracker`, bf16 autocast): the fake measurement against the real update."""
    from transformers import AutoModelForCausalLM

    from dapo_rl.actor import Actor
    from dapo_rl.plan import model_config
    from dapo_rl.plan_measure import measure_setup, measure_update, tracked_update

    cfg = load_config("tiny_chain_sum", ["actor.autocast_dtype=bfloat16", "actor.ppo_micro_batch_size=16"])
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
