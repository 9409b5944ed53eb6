"""`dapo plan`: what a recipe asks of the hardware, computed from the configuration alone (no weights, no GPU).

`plan_recipe(cfg)` returns the numbers (a dict: counts, tokens, bytes); `format_plan(plan)` turns them into the text
`dapo plan RECIPE [key=value ...]` prints. The model's size comes from `model.path/config.json` when the checkpoint is
there (exact: the model is built on the `meta` device, which allocates nothing), else from `model.size_hint` (the
Qwen2.5 shapes below), or from the `sft` section for the embedded tiny model.

Memory model, per rank (one GPU), in bytes:

- Resident states, FSDP2 full sharding over the world (`dapo_rl.distributed.fsdp.shard_model`: one group per decoder
  layer plus the root): parameters and gradients in `model.dtype` (4 bytes for float32, 2 for bfloat16) and AdamW's
  two moments (`exp_avg`, `exp_avg_sq`, created by `torch.optim.AdamW` in the parameter's dtype: 2 x 4 bytes per
  parameter for float32), each divided by the world size.
- Compute copies: under FSDP2 a rank all-gathers unsharded parameters in the compute dtype (`actor.autocast_dtype`,
  else `model.dtype`): the root group (embeddings, final norm, lm_head), which FSDP2 keeps gathered from forward to
  backward, and two decoder layers (the one computing and the one prefetched). One process (no FSDP) with bf16
  autocast: autocast's weight-cast cache holds a bf16 copy of every weight through the forward.
- Activations of one micro-batch (`actor.ppo_micro_batch_size` sequences, at most the rank's share of a mini-batch)
  at the maximum lengths, in the compute dtype, assuming flash/SDPA attention (no seq x seq score matrix): per
  decoder layer and token about `6 h + 2 kv + 4 i` values (norm inputs and outputs, q, k, v, attention output; gate,
  up, activation and product of the MLP; h = hidden size, kv = key/value width, i = MLP width); with gradient
  checkpointing only each layer's input (`h`) is kept plus one layer's full set during its recompute.
- Logits, as `Actor.forward` makes them: only the response positions go through the LM head (`logits_to_keep`:
  `max_response_length` per sequence), and each of them keeps `vocab x 4` bytes for the backward: the fp32 logits /
  temperature, which the backward of the log-softmax's logsumexp keeps (the compute-dtype logits are dropped once
  cast; the padded forward selects the response positions by indexing, whose backward keeps only their size).
  The entropy (a metric) is computed without gradient,
  `dapo_rl.actor.ENTROPY_CHUNK_TOKENS` positions at a time: `3 x 1,024 x vocab x 4` bytes of temporaries
  (log-softmax, its exp, their product). Not counted: the backward's own temporaries (the logits' gradients) and
  the moment `.float() / temperature` holds two fp32 copies; `dapo plan --measure` (`dapo_rl.plan_measure`) counts
  them. An estimate for the order of magnitude.
- vLLM (`rollout.name=vllm` on GPUs): `rollout.gpu_memory_utilization x GPU memory`, which vLLM takes whole for its
  weights (bf16, split over `rollout.tensor_model_parallel_size` GPUs) and KV cache. It is resident while
  generating; during the update it sleeps (`rollout.sleep_level` >= 1 frees it) or stays (0).

LoRA (`actor.lora.rank` r > 0; PEFT's `get_peft_model(model, LoraConfig(r=r, target_modules=...))`): every
targeted `nn.Linear(in, out)` gets `lora_A` (r x in) and `lora_B` (out x r), every targeted `nn.Embedding(num, dim)`
`lora_embedding_A` (r x num) and `lora_embedding_B` (dim x r): r x (in + out) trainable parameters each, counted
exactly over the model's modules (`lora_targets`: PEFT's matching rules; `all-linear` is every linear layer but the
output layer, i.e. q/k/v/o and gate/up/down of every decoder layer, not the LM head). PEFT keeps the adapters in
fp32 (`autocast_adapter_dtype`) whatever the base's dtype. Only they train, so per rank, divided by the world size
as above: parameters = base x bytes(`model.dtype`) + adapters x 4; gradients = adapters x 4 (the frozen base has
none); AdamW = 2 x 4 x adapters (the optimizer holds the trainable parameters only). Compute copies are counted as
for full fine-tuning: the forward still runs the whole model (one process with bf16 autocast: the frozen weights are
not in autocast's cache, which keeps only leaves that require gradients, but each bf16 cast is kept for the input's
gradient, the same size without checkpointing); the adapters' own bf16 copies (r x (in + out) x 2 bytes) are left
out. Activations (an estimate, on the high side): as for full fine-tuning, plus per adapted decoder module and token
`lora_A`'s output (r values, which `lora_B`'s gradient needs) and, where the adapter reads a copy of its input, that
copy (`in` values, kept for `lora_A`'s gradient): with `actor.lora.dropout` > 0 (the dropped input, plus its 1-byte
mask), and with a bf16 base without autocast (PEFT casts the input to the fp32 adapters). Left out: what the frozen
base no longer keeps (its linear layers and norms keep no inputs for weight gradients), and the adapters of
embeddings and of the LM head. Measured (the tensors one forward saves for the backward, a 2-layer Qwen2 of hidden
size 448, MLP 2,432, r = 8, against the same model fully trained): LoRA changes the activations by -10% to -11% in
fp32, under bf16 autocast and in bf16 throughout (FSDP2's bf16 compute), where the estimate adds 0%; by +25% to
+33% with dropout 0.1 (estimated +31% to +51%); by +34% for a bf16 base without autocast (estimated +68%), +92%
with dropout (estimated +84%). vLLM receives merged weights (the base's size): its figures do not change.

The peak is the larger of the rollout phase (parameters + AdamW moments + engine: `Actor.update` frees the
gradients at its end) and the update phase (states + compute copies + activations + an awake engine). Not included:
the CUDA context, NCCL buffers and allocator fragmentation (a few GiB).

`dapo plan --measure` measures the update instead of estimating it: `dapo_rl.plan_measure`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dapo_rl.config import DEFAULT_RECIPE, Config, ConfigError, load_config
from dapo_rl.models.smollm2 import ALIAS as SMOLLM2_ALIAS
from dapo_rl.models.smollm2 import smollm2_dir

GIB = 2**30
"""Bytes in a GiB; memory is printed in GiB."""

DEFAULT_GPU_MEMORY_GIB = 80.0
"""The GPU the plan checks against unless told otherwise (an 80 GB A100/H100)."""

QWEN25_SHAPES: dict[str, dict[str, Any]] = {
    # The values of each model's config.json on the Hugging Face hub (Qwen/Qwen2.5-0.5B, Qwen/Qwen2.5-1.5B,
    # Qwen/Qwen2.5-7B, Qwen/Qwen2.5-32B, Qwen/Qwen2.5-Math-7B). The -Instruct models have the same shapes (their
    # max_position_embeddings is 32768). Qwen2 has biases on the q, k and v projections only.
    "0.5b": {
        "name": "Qwen2.5-0.5B",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
    },
    "1.5b": {
        "name": "Qwen2.5-1.5B",
        "vocab_size": 151936,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "max_position_embeddings": 131072,
    },
    "7b": {
        "name": "Qwen2.5-7B",
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
        "max_position_embeddings": 131072,
    },
    "32b": {
        "name": "Qwen2.5-32B",
        "vocab_size": 152064,
        "hidden_size": 5120,
        "intermediate_size": 27648,
        "num_hidden_layers": 64,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "max_position_embeddings": 131072,
    },
}
"""`model.size_hint` -> Qwen2.5 config.json fields (plus a display `name`)."""

SMOLLM2_135M_SHAPE: dict[str, Any] = {
    "name": "SmolLM2-135M-Instruct",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "max_position_embeddings": 8192,
}
"""`model.path=smollm2-135m-instruct` before its checkpoint is converted: the config.json fields of the GGUF file's
model (Llama architecture, 134,515,008 parameters)."""
# Qwen2.5-Math-7B: the 7B shape with a 4,096-token context
QWEN25_SHAPES["7b-math"] = {**QWEN25_SHAPES["7b"], "name": "Qwen2.5-Math-7B", "max_position_embeddings": 4096}

EMBEDDED_VOCAB_SIZE = 258
"""The embedded tiny model's vocabulary: 256 bytes, `<|endoftext|>`, `<|pad|>` (`dapo_rl.models.tiny`)."""

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def qwen2_param_counts(shape: dict[str, Any]) -> dict[str, int]:
    """Parameter counts of a Qwen2 causal LM from its config.json fields, without building it.

    Per decoder layer: q (h x h + h bias), k and v (h x kv + kv bias each, kv = num_key_value_heads x head_dim,
    head_dim = h / num_attention_heads), o (h x h), gate/up/down (3 x h x i), two RMSNorms (2 h). Outside the layers:
    the embedding (vocab x h), the lm_head (vocab x h unless tied) and the final norm (h). Llama-shaped models
    (SmolLM2) are the same without the q/k/v biases (`attention_bias: false`).

    Args:
        shape: `vocab_size`, `hidden_size`, `intermediate_size`, `num_hidden_layers`, `num_attention_heads`,
            `num_key_value_heads`, `tie_word_embeddings`; optional `attention_bias` (default true, Qwen2).

    Returns:
        `{"total", "layer" (one decoder layer), "root" (everything outside the decoder layers), "kv_dim"}`.
    """
    h, i, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    kv = shape["num_key_value_heads"] * (h // shape["num_attention_heads"])
    b = 1 if shape.get("attention_bias", True) else 0
    layer = (h * h + b * h) + 2 * (h * kv + b * kv) + h * h + 3 * h * i + 2 * h
    root = v * h * (1 if shape["tie_word_embeddings"] else 2) + h
    return {"total": layer * shape["num_hidden_layers"] + root, "layer": layer, "root": root, "kv_dim": kv}


def qwen2_modules(shape: dict[str, Any]) -> list[tuple[str, str, int, int]]:
    """The linear layers and embeddings of a Qwen2/Llama causal LM from its config.json fields, named as transformers
    names them (`Qwen2ForCausalLM`, `LlamaForCausalLM`), in `named_modules()` order.

    Per decoder layer k (`model.layers.k.`): `self_attn.q_proj` (h -> heads x head_dim), `self_attn.k_proj` and
    `self_attn.v_proj` (h -> kv), `self_attn.o_proj` (heads x head_dim -> h), `mlp.gate_proj` and `mlp.up_proj`
    (h -> i), `mlp.down_proj` (i -> h); outside them `model.embed_tokens` (vocab x h) and `lm_head` (h -> vocab, a
    module of its own even when its weight is tied to the embedding). head_dim = `head_dim`, else h / heads.

    Returns:
        `(name, kind, in, out)` per module: kind `"linear"` (in/out features) or `"embedding"` (in: the vocabulary,
        out: the embedding width).
    """
    h, i, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    head_dim = shape.get("head_dim") or h // shape["num_attention_heads"]
    q = shape["num_attention_heads"] * head_dim
    kv = shape["num_key_value_heads"] * head_dim
    layer = (
        ("self_attn.q_proj", h, q),
        ("self_attn.k_proj", h, kv),
        ("self_attn.v_proj", h, kv),
        ("self_attn.o_proj", q, h),
        ("mlp.gate_proj", h, i),
        ("mlp.up_proj", h, i),
        ("mlp.down_proj", i, h),
    )
    modules = [("model.embed_tokens", "embedding", v, h)]
    for k in range(shape["num_hidden_layers"]):
        modules += [(f"model.layers.{k}.{name}", "linear", a, b) for name, a, b in layer]
    modules.append(("lm_head", "linear", h, v))
    return modules


def _shape_from_table(shape: dict[str, Any], source: str) -> dict[str, Any]:
    counts = qwen2_param_counts(shape)
    return {
        "name": shape["name"],
        "source": source,
        "num_params": counts["total"],
        "layer_params": counts["layer"],
        "root_params": counts["root"],
        "num_layers": shape["num_hidden_layers"],
        "hidden_size": shape["hidden_size"],
        "intermediate_size": shape["intermediate_size"],
        "kv_dim": counts["kv_dim"],
        "vocab_size": shape["vocab_size"],
        "max_position_embeddings": shape.get("max_position_embeddings"),
        "modules": qwen2_modules(shape),
        "output_layer": "lm_head",
    }


def _shape_from_checkpoint(path: Path, trust_remote_code: bool) -> dict[str, Any]:
    """Exact counts: the model built from `path/config.json` on the meta device (no memory, no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        hf = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf, trust_remote_code=trust_remote_code)
    except Exception as e:  # transformers raises ValueError/OSError/KeyError for unknown or broken configs
        raise ConfigError(f"model.path={path}: cannot build the model from config.json ({e})") from e
    total = sum(p.numel() for p in model.parameters())  # tied weights are one parameter
    names = set(getattr(model, "_no_split_modules", None) or [])  # the decoder-layer class, as FSDP2 wraps it
    layers = [m for m in model.modules() if type(m).__name__ in names]
    layer = sum(p.numel() for p in layers[0].parameters()) if layers else 0
    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    h = getattr(text, "hidden_size", None)
    heads = getattr(text, "num_attention_heads", None)
    head_dim = getattr(text, "head_dim", None) or (h // heads if h and heads else None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return {
        "name": type(model).__name__,
        "source": f"{path / 'config.json'} (built on the meta device)",
        "num_params": total,
        "layer_params": layer,
        "root_params": total - layer * len(layers),
        "num_layers": len(layers),
        "hidden_size": h,
        "intermediate_size": getattr(text, "intermediate_size", None),
        "kv_dim": kv_heads * head_dim if kv_heads and head_dim else None,
        "vocab_size": getattr(text, "vocab_size", None),
        "max_position_embeddings": getattr(text, "max_position_embeddings", None),
        "modules": _module_list(model),
        "output_layer": next((n for n, m in model.named_modules() if m is out_emb), None),
    }


def _module_list(model) -> list[tuple[str, str, int, int]]:
    """`(name, kind, in, out)` of every module LoRA can adapt in a built model, as `qwen2_modules`: `nn.Linear` and
    transformers' `Conv1D` (GPT-2's linear layers, weight in x out) as `"linear"`, `nn.Embedding` as `"embedding"`."""
    import torch
    from transformers.pytorch_utils import Conv1D

    out = []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            out.append((name, "linear", m.in_features, m.out_features))
        elif isinstance(m, Conv1D):
            out.append((name, "linear", m.nx, m.nf))
        elif isinstance(m, torch.nn.Embedding):
            out.append((name, "embedding", m.num_embeddings, m.embedding_dim))
    return out


def model_shape(cfg: Config) -> dict[str, Any]:
    """The policy's size and shape, without its weights.

    Order: `model.path=embedded` (the `sft` section's shape); a directory holding config.json (exact, built on the
    meta device); `model.size_hint` (`QWEN25_SHAPES`).

    Returns:
        `name`, `source` (where the numbers come from), `num_params`, `layer_params` (one decoder layer),
        `root_params` (embeddings, final norm, lm_head), `num_layers`, `hidden_size`, `intermediate_size`, `kv_dim`
        (key/value width: key/value heads x head dim), `vocab_size`, `max_position_embeddings` (None where unknown),
        `modules` (the linear layers and embeddings, `(name, kind, in, out)`: see `qwen2_modules`), `output_layer`
        (the LM head's module name, which PEFT's `all-linear` leaves out; None where the model has none).

    Raises:
        ConfigError: neither a config.json under `model.path` nor a `model.size_hint`, an unknown size hint, or a
            config.json transformers cannot build.
    """
    m = cfg.model
    if m.path == "embedded":
        s = cfg.sft
        shape = {
            "name": "embedded tiny Qwen2",
            "vocab_size": EMBEDDED_VOCAB_SIZE,
            "hidden_size": s.hidden_size,
            "intermediate_size": s.intermediate_size,
            "num_hidden_layers": s.num_layers,
            "num_attention_heads": s.num_heads,
            "num_key_value_heads": s.num_heads,
            "tie_word_embeddings": True,
            "max_position_embeddings": s.max_position_embeddings,
        }
        return _shape_from_table(shape, "the sft section (model.path=embedded)")
    path = Path(m.path)
    if m.path == SMOLLM2_ALIAS:  # the converted checkpoint when it is cached; its published shape otherwise
        if (smollm2_dir() / "config.json").is_file():
            return _shape_from_checkpoint(smollm2_dir(), False)
        return _shape_from_table(SMOLLM2_135M_SHAPE, f"{SMOLLM2_ALIAS}'s shape (not converted yet)")
    if (path / "config.json").is_file():
        return _shape_from_checkpoint(path, m.trust_remote_code)
    hint = m.size_hint.strip().lower()
    if hint:
        if hint not in QWEN25_SHAPES:
            raise ConfigError(f"model.size_hint={m.size_hint!r} is not one of {', '.join(QWEN25_SHAPES)}")
        return _shape_from_table(
            QWEN25_SHAPES[hint], f"model.size_hint={hint}; {m.path}/config.json is not there yet"
        )
    raise ConfigError(
        f"dapo plan needs the model's shape: model.path={m.path} holds no config.json and model.size_hint is empty; "
        f"download the checkpoint there or set model.size_hint to one of {', '.join(QWEN25_SHAPES)}"
    )


def model_config(cfg: Config):
    """The policy's transformers config, from the same sources as `model_shape` (no weights read): the embedded tiny
    model's `Qwen2Config` (`dapo_rl.models.tiny`), a config.json under `model.path`, SmolLM2's published shape
    (`LlamaConfig`) before its conversion, or `model.size_hint`'s Qwen2.5 shape (`Qwen2Config`).

    Raises:
        ConfigError: as `model_shape`.
    """
    from transformers import AutoConfig, LlamaConfig, Qwen2Config

    m = cfg.model
    if m.path == "embedded":
        s = cfg.sft
        return Qwen2Config(
            vocab_size=EMBEDDED_VOCAB_SIZE,
            hidden_size=s.hidden_size,
            num_hidden_layers=s.num_layers,
            num_attention_heads=s.num_heads,
            num_key_value_heads=s.num_heads,
            intermediate_size=s.intermediate_size,
            max_position_embeddings=s.max_position_embeddings,
            tie_word_embeddings=True,
            eos_token_id=EMBEDDED_VOCAB_SIZE - 2,
            pad_token_id=EMBEDDED_VOCAB_SIZE - 1,
            bos_token_id=None,
        )
    path = Path(smollm2_dir() if m.path == SMOLLM2_ALIAS else m.path)
    if (path / "config.json").is_file():
        try:
            return AutoConfig.from_pretrained(path, trust_remote_code=m.trust_remote_code)
        except Exception as e:  # as _shape_from_checkpoint
            raise ConfigError(f"model.path={m.path}: cannot read config.json ({e})") from e
    if m.path == SMOLLM2_ALIAS:
        return LlamaConfig(**{k: v for k, v in SMOLLM2_135M_SHAPE.items() if k != "name"})
    model_shape(cfg)  # the same errors as the plan for a missing or unknown size hint
    shape = QWEN25_SHAPES[m.size_hint.strip().lower()]
    return Qwen2Config(**{k: v for k, v in shape.items() if k != "name"})


def world_layout(cfg: Config) -> tuple[int, int]:
    """`(nodes, ranks per node)` the plan assumes.

    `trainer.nnodes x trainer.n_gpus_per_node` (Ray's workers, verl's names); with `launcher=torchrun` and
    `trainer.nproc_per_node` > 1, the torchrun shorthand's `nproc_per_node` ranks per node.
    """
    t = cfg.trainer
    per_node = t.nproc_per_node if t.launcher == "torchrun" and t.nproc_per_node > 1 else t.n_gpus_per_node
    return t.nnodes, per_node


def load_plan_config(recipe: str | None, overrides: list[str]) -> tuple[Config, list[str]]:
    """`load_config` for planning (the same validation and errors), with a note when the recipe's engine is not
    installed here (`dapo train` would stop on it; planning needs no engine).

    Returns:
        The config and notes for the plan.

    Raises:
        ConfigError: as `load_config`.
    """
    from dapo_rl.rollout import check_engine

    cfg = load_config(recipe, overrides)
    try:
        check_engine(cfg.rollout)
    except ValueError as e:
        return cfg, [f"{e} (planned as written)"]
    return cfg, []


ADAPTER_BYTES = 4
"""Bytes per adapter value: PEFT creates LoRA's adapters in fp32 even on a bf16 base (`get_peft_model(...,
autocast_adapter_dtype=True)`, its default), and their gradients and AdamW moments follow."""

ALL_LINEAR = "all-linear"
"""PEFT's shorthand (`peft.utils.INCLUDE_LINEAR_LAYERS_SHORTHAND`) for every linear layer but the output layer."""


def lora_targets(
    shape: dict[str, Any], target_modules: list[str]
) -> tuple[list[tuple[str, str, int, int]], list[str]]:
    """The modules PEFT adapts for `target_modules`, by its own rules (`peft.tuners.tuners_utils`:
    `check_target_module_exists`, `_maybe_include_all_linear_layers`).

    A name matches a module whose full name equals it or ends in `.name` (`q_proj` matches every
    `model.layers.k.self_attn.q_proj`; `layers.0.self_attn.q_proj` only layer 0's). `["all-linear"]` is every
    `"linear"` module except the output layer (the LM head): `dapo_rl.lora.wrap_model` passes that list to PEFT as
    its `"all-linear"` shorthand; in a longer list `all-linear` is a module name like any other (PEFT's reading of a
    list), which matches nothing.

    Args:
        shape: `model_shape`'s dict (its `modules` and `output_layer`).
        target_modules: `actor.lora.target_modules`.

    Returns:
        `(modules, unmatched)`: the adapted `(name, kind, in, out)` in model order, and the explicit names that match
        no linear layer or embedding.
    """
    names = list(target_modules)
    all_linear = names == [ALL_LINEAR]
    explicit = [] if all_linear else names
    matched: set[str] = set()
    chosen = []
    for module in shape["modules"]:
        name, kind = module[0], module[1]
        hits = [t for t in explicit if name == t or name.endswith(f".{t}")]
        matched.update(hits)
        if hits or (all_linear and kind == "linear" and name != shape["output_layer"]):
            chosen.append(module)
    return chosen, [t for t in explicit if t not in matched]


def _lora_plan(cfg: Config, shape: dict[str, Any], world: int, cbytes: int) -> dict[str, Any] | None:
    """The adapters of `actor.lora` (None when `rank` is 0): counts, and their activations per token (bytes, all
    decoder layers together; see the module docstring for when an adapter keeps a copy of its input).

    Raises:
        ConfigError: no name of `actor.lora.target_modules` matches a linear layer or embedding of the model (as
            `get_peft_model` refuses it).
    """
    lo = cfg.actor.lora
    if lo.rank <= 0:
        return None
    modules, unmatched = lora_targets(shape, lo.target_modules)
    if not modules:
        raise ConfigError(
            f"actor.lora.target_modules={lo.target_modules} matches no linear layer or embedding of {shape['name']}"
            f" (its linear layers end in: {', '.join(sorted({m[0].rsplit('.', 1)[-1] for m in shape['modules']}))})"
        )
    r = lo.rank
    autocast = cfg.actor.autocast_dtype in ("bfloat16", "auto")
    abytes = 2 if autocast else ADAPTER_BYTES  # FSDP2's param_dtype or autocast computes the adapters in bf16
    # an input copy: the dropped input, or PEFT's fp32 cast of a bf16 base's input (no autocast)
    copies = lo.dropout > 0 or abytes != cbytes
    in_decoder = [m for m in modules if m[1] == "linear" and m[0] != shape["output_layer"]]
    act_per_token = sum(
        r * abytes + (m[2] * abytes if copies else 0) + (m[2] if lo.dropout > 0 else 0) for m in in_decoder
    )
    trainable = r * sum(m[2] + m[3] for m in modules)
    return {
        "rank": r,
        "alpha": lo.alpha,
        "dropout": lo.dropout,
        "target_modules": list(lo.target_modules),
        "unmatched": unmatched,
        "num_modules": len(modules),
        "trainable_params": trainable,
        "base_params": shape["num_params"],
        "total_params": shape["num_params"] + trainable,
        "base_dtype": cfg.model.dtype,
        "act_bytes_per_token": act_per_token,
        "input_copies": copies,
    }


def plan_recipe(
    cfg: Config,
    gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB,
    recipe: str | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """The numbers of a recipe's plan: hardware, work per rank, memory per rank.

    Args:
        cfg: a validated `Config`.
        gpu_memory_gib: memory of one GPU in GiB, for vLLM's share and the verdict.
        recipe: the recipe's name, for the heading.
        notes: notes to carry into the plan (e.g. from `load_plan_config`).

    Returns:
        A dict of sections. `hardware`: `nnodes`, `ranks_per_node`, `world_size`, `device`, `launcher`,
        `gpu_memory_bytes`. `model`: see `model_shape`. `batch` (prompts, sequences, tokens): `gen_prompts_per_round`,
        `gen_prompts_per_rank`, `gen_sequences_per_rank`, `max_gen_rounds` (0: unlimited), `train_prompts_per_step`,
        `train_prompts_per_rank`, `train_sequences_per_rank`, `optimizer_steps_per_step`,
        `mini_batch_sequences_per_rank`, `micro_batch_sequences`, `max_sequence_length`, `tokens_per_step`,
        `tokens_per_rank_per_step`, `tokens_per_micro_batch` (per-rank values are floats when uneven). `lora`: None
        for full fine-tuning, else `rank`, `alpha`, `dropout`, `target_modules`, `unmatched` (names that adapt
        nothing), `num_modules` (adapted modules), `trainable_params` (the adapters' parameters), `base_params`,
        `total_params` (base + adapters), `base_dtype`, `act_bytes_per_token` (the adapters' activations per
        token, all decoder layers), `input_copies` (whether each adapter keeps a copy of its input). `memory`
        (bytes per rank): `params` (base and adapters), `grads`, `optimizer`, `states`, `compute_copies`,
        `activations` (and its parts `act_layers`, `act_recompute`, `act_logits`; `act_lora`: the LoRA adapters'
        share of the first two, 0 or None without LoRA), `engine` (vLLM's share or the transformers engine's KV
        cache), `engine_weights`, `engine_kv_tokens` (vLLM KV-cache room in tokens per engine, None otherwise),
        `reference` (the KL term's frozen copy of the weights, `algorithm.use_kl_loss`; 0 without it),
        `rollout_phase`, `update_phase`, `peak`, `fits` (bool; None on CPU), `param_bytes`, `compute_bytes`,
        `trainable_params` (parameters with gradients and AdamW moments: all, or the adapters), `total_params`
        (parameters held, base and adapters; counts, not bytes). `notes`: strings; `warnings`: strings.

    Raises:
        ConfigError: as `model_shape`; `actor.lora.target_modules` adapts nothing.
    """
    d, a, r, act, t = cfg.data, cfg.algorithm, cfg.rollout, cfg.actor, cfg.trainer
    nnodes, per_node = world_layout(cfg)
    world = nnodes * per_node
    shape = model_shape(cfg)
    warnings: list[str] = []
    notes = list(notes or [])

    # --- work per rank -----------------------------------------------------------------------------------------
    max_len = d.max_prompt_length + d.max_response_length
    mini_seqs_rank = act.ppo_mini_batch_size * r.n / world
    micro = max(1, min(act.ppo_micro_batch_size, math.ceil(mini_seqs_rank)))
    max_rounds = (a.filter_groups.max_num_gen_batches if a.filter_groups.enable else 1) or 0
    batch = {
        "gen_prompts_per_round": d.gen_batch_size,
        "gen_prompts_per_rank": d.gen_batch_size / world,
        "gen_sequences_per_rank": d.gen_batch_size * r.n / world,
        "max_gen_rounds": max_rounds,
        "train_prompts_per_step": d.train_batch_size,
        "train_prompts_per_rank": d.train_batch_size / world,
        "train_sequences_per_rank": d.train_batch_size * r.n / world,
        "optimizer_steps_per_step": d.train_batch_size // act.ppo_mini_batch_size * act.ppo_epochs,
        "mini_batch_sequences_per_rank": mini_seqs_rank,
        "micro_batch_sequences": micro,
        "max_sequence_length": max_len,
        "tokens_per_step": d.train_batch_size * r.n * max_len,
        "tokens_per_rank_per_step": d.train_batch_size * r.n * max_len / world,
        "tokens_per_micro_batch": micro * max_len,
    }
    if d.gen_batch_size % world:
        warnings.append(
            f"data.gen_batch_size={d.gen_batch_size} does not divide over {world} ranks: "
            f"ranks get {d.gen_batch_size // world} or {d.gen_batch_size // world + 1} prompts per round"
        )
    if mini_seqs_rank < 1:
        warnings.append(
            f"a mini-batch of {act.ppo_mini_batch_size} prompts x {r.n} = {act.ppo_mini_batch_size * r.n} sequences "
            f"is less than one per rank over {world} ranks: raise actor.ppo_mini_batch_size"
        )
    elif mini_seqs_rank != int(mini_seqs_rank):
        warnings.append(
            f"a mini-batch ({act.ppo_mini_batch_size * r.n} sequences) does not divide over {world} ranks"
        )
    if shape["max_position_embeddings"] and max_len > shape["max_position_embeddings"]:
        warnings.append(
            f"data.max_prompt_length + data.max_response_length = {max_len:,} tokens exceeds the model's context "
            f"(max_position_embeddings {shape['max_position_embeddings']:,})"
        )

    # --- memory per rank ---------------------------------------------------------------------------------------
    n = shape["num_params"]
    pbytes = _DTYPE_BYTES[cfg.model.dtype]
    cbytes = 2 if act.autocast_dtype in ("bfloat16", "auto") else pbytes  # auto: bf16 on a GPU
    lora = _lora_plan(cfg, shape, world, cbytes)
    if lora is None:
        trainable = n
        params = math.ceil(n * pbytes / world)
        grads = params
        optimizer = 2 * params  # AdamW exp_avg + exp_avg_sq, in the parameters' dtype
    else:  # a frozen base in model.dtype; fp32 adapters, their gradients and AdamW moments
        trainable = lora["trainable_params"]
        params = math.ceil((n * pbytes + trainable * ADAPTER_BYTES) / world)
        grads = math.ceil(trainable * ADAPTER_BYTES / world)
        optimizer = math.ceil(2 * ADAPTER_BYTES * trainable / world)
        if lora["unmatched"]:
            warnings.append(
                f"actor.lora.target_modules: {', '.join(lora['unmatched'])} match no linear layer or embedding of "
                f"{shape['name']} (planned without them)"
            )
    states = params + grads + optimizer
    if world > 1:
        compute = (shape["root_params"] + min(2, shape["num_layers"]) * shape["layer_params"]) * cbytes
    else:
        compute = n * cbytes if cbytes != pbytes else 0
    h, i, kv = shape["hidden_size"], shape["intermediate_size"], shape["kv_dim"]
    tokens = micro * max_len
    act_layers = act_recompute = act_logits = act_lora = None
    if h and i and kv and shape["num_layers"]:
        per_token_layer = (6 * h + 2 * kv + 4 * i) * cbytes
        lora_all = lora["act_bytes_per_token"] if lora else 0  # all decoder layers' adapters, per token
        lora_layer = math.ceil(lora_all / shape["num_layers"])
        if act.gradient_checkpointing:
            act_layers = shape["num_layers"] * tokens * h * cbytes
            act_recompute = tokens * (per_token_layer + lora_layer)
            act_lora = tokens * lora_layer
        else:
            act_layers = shape["num_layers"] * tokens * per_token_layer + tokens * lora_all
            act_recompute = 0
            act_lora = tokens * lora_all
    if shape["vocab_size"]:
        from dapo_rl.actor import ENTROPY_CHUNK_TOKENS

        kept = micro * d.max_response_length  # logits_to_keep: the response positions only
        act_logits = kept * shape["vocab_size"] * 4
        act_logits += 3 * min(ENTROPY_CHUNK_TOKENS, kept) * shape["vocab_size"] * 4
    activations = (
        None if act_layers is None or act_logits is None else act_layers + act_recompute + act_logits
    )
    if activations is None:
        notes.append("activations not included (the model's config lacks hidden/intermediate/vocab sizes)")

    device = t.device
    on_gpu = device != "cpu"
    gpu_bytes = int(gpu_memory_gib * GIB)
    kv_per_token = 2 * shape["num_layers"] * (kv or 0)  # K and V values per token, all layers
    engine_weights = engine_kv_tokens = None
    engine_asleep = True
    if r.name == "vllm" and on_gpu:
        tp = r.tensor_model_parallel_size
        engine = int(r.memory_share(own_gpu=False) * gpu_bytes)
        engine_weights = math.ceil(n * 2 / tp)
        kv_room = engine - engine_weights
        if kv_per_token:
            engine_kv_tokens = max(0, kv_room) // max(1, kv_per_token * 2 // tp)
        engine_asleep = r.sleep_level >= 1
        if kv_room <= 0:
            warnings.append(
                f"vLLM's share ({engine / GIB:.1f} GiB) does not hold its bf16 weights ({engine_weights / GIB:.1f} "
                "GiB per GPU): raise rollout.gpu_memory_utilization or rollout.tensor_model_parallel_size"
            )
        elif engine_kv_tokens is not None and engine_kv_tokens < max_len:
            warnings.append(
                f"vLLM's KV cache (~{engine_kv_tokens:,} tokens) cannot hold one sequence of {max_len:,} tokens"
            )
        if world % tp:
            warnings.append(f"rollout.tensor_model_parallel_size={tp} does not divide the world size {world}")
    elif r.name == "vllm":  # vLLM-CPU: a fixed KV cache plus its copy of the weights, no sleep mode
        engine = int(r.kv_cache_gib * GIB) + n * pbytes
        engine_asleep = False
    else:  # transformers generate: the actor's own weights plus the KV cache of one generation batch
        engine = r.micro_batch_size * max_len * kv_per_token * pbytes
    # the KL term's frozen reference: one more copy of the (sharded) weights, for the whole run (LoRA is refused)
    reference = math.ceil(n * pbytes / world) if a.use_kl_loss else 0
    rollout_phase = params + optimizer + engine + reference  # Actor.update frees the gradients at its end
    update_phase = states + compute + (activations or 0) + (0 if engine_asleep else engine) + reference
    peak = max(rollout_phase, update_phase)
    memory = {
        "param_bytes": pbytes,
        "compute_bytes": cbytes,
        "params": params,
        "grads": grads,
        "optimizer": optimizer,
        "states": states,
        "compute_copies": compute,
        "activations": activations,
        "act_layers": act_layers,
        "act_recompute": act_recompute,
        "act_logits": act_logits,
        "act_lora": act_lora,
        "trainable_params": trainable,
        "total_params": n + (lora["trainable_params"] if lora else 0),
        "engine": engine,
        "engine_weights": engine_weights,
        "engine_kv_tokens": engine_kv_tokens,
        "engine_asleep_in_update": engine_asleep,
        "reference": reference,
        "rollout_phase": rollout_phase,
        "update_phase": update_phase,
        "peak": peak,
        "fits": (peak <= gpu_bytes) if on_gpu else None,
    }
    return {
        "recipe": recipe or DEFAULT_RECIPE,
        "output_dir": t.output_dir,
        "hardware": {
            "nnodes": nnodes,
            "ranks_per_node": per_node,
            "world_size": world,
            "device": device,
            "launcher": t.launcher,
            "gpu_memory_bytes": gpu_bytes,
        },
        "model": shape,
        "lora": lora,
        "rollout": {"name": r.name, "n": r.n, "tensor_model_parallel_size": r.tensor_model_parallel_size},
        "batch": batch,
        "memory": memory,
        "notes": notes,
        "warnings": warnings,
        "settings": {
            "model_dtype": cfg.model.dtype,
            "autocast_dtype": act.autocast_dtype,
            "gradient_checkpointing": act.gradient_checkpointing,
            "ppo_mini_batch_size": act.ppo_mini_batch_size,
            "ppo_epochs": act.ppo_epochs,
            "gpu_memory_utilization": r.memory_share(own_gpu=False),
            "sleep_level": r.sleep_level,
            "kv_cache_gib": r.kv_cache_gib,
            "rollout_micro_batch_size": r.micro_batch_size,
        },
    }


def _num(x: float) -> str:
    """12 -> '12', 12.5 -> '12.5', 1234567 -> '1,234,567'."""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}".rstrip("0").rstrip(".")


def _plural(k: int, word: str) -> str:
    return f"{k} {word}{'s' * (k != 1)}"


def _gib(x: float | None) -> str:
    return "n/a" if x is None else f"{x / GIB:7.2f}"


def format_plan(plan: dict[str, Any]) -> str:
    """The plan as text (what `dapo plan` prints): memory in GiB (2**30 bytes), counts with thousands separators."""
    hw, m, b, mem, s = plan["hardware"], plan["model"], plan["batch"], plan["memory"], plan["settings"]
    ro = plan["rollout"]
    world, n = hw["world_size"], ro["n"]
    gpu_gib = hw["gpu_memory_bytes"] / GIB
    unit = "GPU" if hw["device"] != "cpu" else "process"
    device = {"auto": "auto (CUDA when available, else CPU)"}.get(hw["device"], hw["device"])
    lines = [f"dapo plan: {plan['recipe']} (run directory {plan['output_dir']})", ""]
    lines.append(f"model     {m['name']}: {m['num_params']:,} parameters, {m['num_layers']} decoder layers")
    lines.append(f"          from {m['source']}")
    lora = plan.get("lora")
    if lora is not None:
        a, base = lora["trainable_params"], lora["base_params"]
        lines.append(
            f"adapters  LoRA rank {lora['rank']} ({', '.join(lora['target_modules'])}): {a:,} trainable parameters "
            f"({100 * a / base:.2f}% of {base:,}), frozen base in {lora['base_dtype']}"
        )
        lines.append(
            f"          {_plural(lora['num_modules'], 'module')} adapted, alpha {_num(lora['alpha'])}, dropout "
            f"{_num(lora['dropout'])}; the adapters, their gradients and AdamW moments in float32"
        )
    lines.append(
        f"hardware  {hw['nnodes']} node{'s' * (hw['nnodes'] != 1)} x {hw['ranks_per_node']} {unit}"
        f"{'s' * (hw['ranks_per_node'] != 1)} = {world} rank{'s' * (world != 1)}, device {device}, "
        f"launcher {hw['launcher']}"
    )
    lines.append("")
    rounds = (
        "unlimited rounds" if b["max_gen_rounds"] == 0 else f"at most {_plural(b['max_gen_rounds'], 'round')}"
    )
    lines.append(
        f"generation round   {_num(b['gen_prompts_per_round'])} prompts x {n} = "
        f"{_num(b['gen_prompts_per_round'] * n)} sequences; per rank {_num(b['gen_prompts_per_rank'])} prompts, "
        f"{_num(b['gen_sequences_per_rank'])} sequences; {rounds} per step"
    )
    lines.append(
        f"training step      {_num(b['train_prompts_per_step'])} prompts x {n} = "
        f"{_num(b['train_prompts_per_step'] * n)} sequences; per rank {_num(b['train_prompts_per_rank'])} prompts, "
        f"{_num(b['train_sequences_per_rank'])} sequences"
    )
    lines.append(
        f"optimizer steps    {b['optimizer_steps_per_step']} per training step ({_num(b['train_prompts_per_step'])}"
        f" / {s['ppo_mini_batch_size']} prompts per mini-batch x {_plural(s['ppo_epochs'], 'epoch')}); per rank "
        f"{_num(b['mini_batch_sequences_per_rank'])} sequences per mini-batch, {b['micro_batch_sequences']} per "
        "forward/backward pass"
    )
    lines.append(
        f"tokens (max)       {_num(b['tokens_per_step'])} per training step ({_num(b['train_prompts_per_step'] * n)}"
        f" x {b['max_sequence_length']:,}), {_num(b['tokens_per_rank_per_step'])} per rank, "
        f"{b['tokens_per_micro_batch']:,} per pass"
    )
    lines.append("")
    shard = f"FSDP2 full sharding over {world} ranks" if world > 1 else "one process, no sharding"
    lines.append(
        f"memory per {unit} (GiB; {shard}; parameters {s['model_dtype']}, compute "
        f"{s['autocast_dtype'] if s['autocast_dtype'] != 'none' else s['model_dtype']})"
    )
    per = f" / {world}" if world > 1 else ""
    if lora is None:
        lines.append(
            f"  parameters        {_gib(mem['params'])}   {m['num_params']:,} x {mem['param_bytes']} B{per}"
        )
        lines.append(f"  gradients         {_gib(mem['grads'])}   same as the parameters")
        lines.append(
            f"  AdamW moments     {_gib(mem['optimizer'])}   2 x {mem['param_bytes']} B per parameter{per}"
        )
    else:
        a = lora["trainable_params"]
        lines.append(
            f"  parameters        {_gib(mem['params'])}   ({m['num_params']:,} frozen x {mem['param_bytes']} B + "
            f"{a:,} adapter x {ADAPTER_BYTES} B){per}"
        )
        lines.append(
            f"  gradients         {_gib(mem['grads'])}   the adapters only: {a:,} x {ADAPTER_BYTES} B{per}"
        )
        lines.append(
            f"  AdamW moments     {_gib(mem['optimizer'])}   the adapters only: 2 x {ADAPTER_BYTES} B per adapter "
            f"parameter{per}"
        )
    if world > 1:
        what = "unsharded root (embeddings, norm, lm_head) + 2 decoder layers, all-gathered"
    elif mem["compute_copies"]:
        what = "autocast's bf16 copy of every weight"
    else:
        what = "none (computes in the parameters' dtype, one process)"
    lines.append(f"  compute copies    {_gib(mem['compute_copies'])}   {what}")
    if mem["reference"]:
        lines.append(
            f"  KL reference      {_gib(mem['reference'])}   algorithm.use_kl_loss: a frozen copy of the weights, "
            f"{m['num_params']:,} x {mem['param_bytes']} B{per}"
        )
    if mem["activations"] is None:
        lines.append("  activations          n/a   not included")
    else:
        ckpt = "gradient checkpointing" if s["gradient_checkpointing"] else "no gradient checkpointing"
        of_lora = f"; LoRA adapters {mem['act_lora'] / GIB:.2f} of it" if lora is not None else ""
        lines.append(
            f"  activations       {_gib(mem['activations'])}   one pass of {b['tokens_per_micro_batch']:,} tokens, "
            f"{ckpt}: layers {mem['act_layers'] / GIB:.2f} + recompute {mem['act_recompute'] / GIB:.2f} + logits "
            f"{mem['act_logits'] / GIB:.2f} (estimate{of_lora})"
        )
    if ro["name"] == "vllm" and hw["device"] != "cpu":
        kv = mem["engine_kv_tokens"]
        room = (
            f"; KV cache room ~{kv:,} tokens ({kv // b['max_sequence_length']:,} full-length sequences) per engine"
            if kv is not None
            else ""
        )
        lines.append(
            f"  vLLM engine       {_gib(mem['engine'])}   {s['gpu_memory_utilization']} x {gpu_gib:g} GiB; bf16 "
            f"weights {mem['engine_weights'] / GIB:.2f} per GPU (TP {ro['tensor_model_parallel_size']}){room}"
        )
        sleep = (
            f"vLLM asleep (rollout.sleep_level={s['sleep_level']})"
            if mem["engine_asleep_in_update"]
            else "vLLM awake (rollout.sleep_level=0)"
        )
    elif ro["name"] == "vllm":
        lines.append(
            f"  vLLM-CPU engine   {_gib(mem['engine'])}   KV cache {s['kv_cache_gib']} GiB + a copy of the weights"
        )
        sleep = "vLLM-CPU has no sleep mode: counted in both phases"
    else:
        lines.append(
            f"  generation KV     {_gib(mem['engine'])}   transformers engine, {s['rollout_micro_batch_size']} sequences"
            f" x {b['max_sequence_length']:,} tokens"
        )
        sleep = "the transformers engine's KV cache is freed"
    ref = " + KL reference" if mem["reference"] else ""
    lines.append(
        f"  rollout phase     {_gib(mem['rollout_phase'])}   parameters + AdamW moments + engine{ref} (the update "
        "frees the gradients)"
    )
    lines.append(
        f"  update phase      {_gib(mem['update_phase'])}   states + compute copies + activations{ref}; {sleep}"
    )
    lines.append(f"  peak              {_gib(mem['peak'])}")
    lines.append("")
    measured = plan.get("measured")
    if measured is not None:
        lines.extend(_format_measured(plan, unit))
        lines.append("")
    peak = (measured or mem)["peak"] / GIB
    which = "measured peak" if measured is not None else "peak"
    if mem["fits"] is None:
        lines.append(f"verdict   needs ~{peak:.1f} GiB of host memory per process (device cpu; {which})")
    else:
        gpus = f"{world} x {gpu_gib:g} GiB GPUs ({hw['nnodes']} x {hw['ranks_per_node']})"
        if (measured or mem)["fits"]:
            lines.append(
                f"verdict   FITS {gpus}: {which} {peak:.1f} GiB per GPU, {gpu_gib - peak:.1f} GiB to spare"
            )
        else:
            lines.append(
                f"verdict   DOES NOT FIT {gpus}: {which} {peak:.1f} GiB per GPU exceeds {gpu_gib:g} GiB by "
                f"{peak - gpu_gib:.1f} GiB"
            )
        lines.append(
            "          (not included: CUDA context, NCCL buffers, allocator fragmentation: a few GiB)"
        )
    for w in plan["warnings"]:
        lines.append(f"warning   {w}")
    for note in plan["notes"]:
        lines.append(f"note      {note}")
    return "\n".join(lines)


def measurement_attn_implementation(cfg: Config) -> tuple[str, str | None]:
    """The attention kernel `dapo plan --measure` runs the model with, and a note when it is not the configured one:
    `model.attn_implementation` itself, except `auto` (on a GPU `flash_attention_2` or `sdpa`) and `flash_attention_*`
    (CUDA only), which are measured as `sdpa` (the padded forward; flash-attention would pack it)."""
    impl = cfg.model.attn_implementation
    if impl == "auto" or impl.startswith("flash_attention"):
        return (
            "sdpa",
            f"measured with sdpa attention (model.attn_implementation={impl}; no flash-attention here)",
        )
    return impl, None


def add_measurement(plan: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """The plan with a `measured` section: the phases per GPU from a measured update
    (`dapo_rl.plan_measure.measure_update`) and the plan's engine figures.

    - `update`: the update's measured peak, plus the engine when it stays awake (`rollout.sleep_level=0`, vLLM-CPU).
    - `loading`: the device while the actor loads. FSDP2: every rank holds its shards (`resident` parameters) while
      rank 0 broadcasts one full parameter at a time (`set_model_state_dict(broadcast_from_rank0=True)`: the largest,
      `largest_param_bytes`, is in flight on every rank at once). One process: the whole model, moved in from the
      host. `loading_host`: rank 0's host memory, the full model in `model.dtype` (`load_model`).
    - `rollout`: parameters and AdamW state (`resident`: what the update leaves) plus the engine.
    - `peak`: the largest of the three; `fits`: against the GPU (None on CPU).

    Returns:
        A new plan dict; `plan["measured"]` holds `measured`'s fields and `update`, `loading`, `loading_host`,
        `rollout`, `peak`, `fits` (bytes per rank).
    """
    mem, hw = plan["memory"], plan["hardware"]
    resident = measured["resident"]
    engine = mem["engine"]
    update = measured["update_peak"]["total"] + (0 if mem["engine_asleep_in_update"] else engine)
    sharded = measured["world_size"] > 1
    loading = resident["params"] + (measured["largest_param_bytes"] if sharded else 0)
    rollout = resident["total"] + engine
    top = max(update, loading, rollout)
    out = dict(measured)
    out.update(
        update=update,
        loading=loading,
        loading_host=plan["model"]["num_params"] * mem["param_bytes"],
        rollout=rollout,
        peak=top,
        fits=None if mem["fits"] is None else top <= hw["gpu_memory_bytes"],
    )
    return {**plan, "measured": out}


def _format_measured(plan: dict[str, Any], unit: str) -> list[str]:
    """The `--measure` block of `format_plan`: measured GiB per rank beside the estimate's."""
    mem, ms, s = plan["memory"], plan["measured"], plan["settings"]
    peak, resident, world = ms["update_peak"], ms["resident"], ms["world_size"]
    tracker = "FSDPMemTracker" if world > 1 else "MemTracker"
    ranks = f"{world} fake ranks" if world > 1 else "one process"
    micro = f"{ms['micro_batches']} micro-batch{'es' * (ms['micro_batches'] != 1)}"
    lines = [
        f"measured per {unit} (GiB; the real Actor.update on fake tensors: FakeTensorMode on {ms['device']}, {ranks}, "
        f"{tracker}; one mini-batch of {micro} x {ms['rows']} x "
        f"{plan['batch']['max_sequence_length']:,} tokens, {ms['compute_dtype']} compute; {ms['seconds']:.0f} s)",
        " " * 19 + "measured  estimate",
    ]

    def row(name: str, value: int, estimate: int | None, what: str) -> None:
        est = "       -" if estimate is None else f"{estimate / GIB:8.2f}"
        lines.append(f"  {name:<18}{_gib(value)}  {est}   {what}".rstrip())

    def parts(names: tuple[str, ...]) -> str:
        shown = [
            n for n in names if peak["tracker"].get(n, 0) >= GIB / 200
        ]  # what rounds to 0.00 is left out
        return " + ".join(f"{n} {peak['tracker'][n] / GIB:.2f}" for n in shown)

    params = parts(("Sharded Param", "Unsharded Param", "All Gather", "Parameter", "Buffer"))
    row("parameters", peak["params"], mem["params"] + mem["compute_copies"], params)
    grads = parts(("Sharded Grad", "Unsharded Grad", "Reduce Scatter", "Gradient"))
    row("gradients", peak["grads"], mem["grads"], grads)
    row("AdamW moments", peak["optimizer"], mem["optimizer"], "")
    row("activations", peak["activations"], mem["activations"], "the forward's, recomputed ones included")
    row("temporaries", peak["temporaries"], None, "the backward's: gradients of activations and logits")
    if not mem["engine_asleep_in_update"]:
        engine = f" + engine {mem['engine'] / GIB:.2f} (awake)"
    elif plan["rollout"]["name"] == "vllm":
        engine = f"; vLLM asleep (rollout.sleep_level={s['sleep_level']})"
    else:
        engine = "; the engine's KV cache is freed"
    row("update phase", ms["update"], mem["update_phase"], f"the peak above{engine}")
    if world > 1:
        what = (
            f"shards {resident['params'] / GIB:.2f} + the largest full parameter in flight "
            f"{ms['largest_param_bytes'] / GIB:.2f} (rank 0 broadcasts one at a time)"
        )
    else:
        what = "the whole model, moved in from the host"
    row(
        "loading",
        ms["loading"],
        None,
        f"{what}; rank 0's host: {ms['loading_host'] / GIB:.2f} (the full model)",
    )
    row(
        "rollout phase",
        ms["rollout"],
        mem["rollout_phase"],
        f"parameters + AdamW moments {resident['total'] / GIB:.2f} (left by the update) + engine "
        f"{mem['engine'] / GIB:.2f}",
    )
    row("peak", ms["peak"], mem["peak"], "")
    return lines
