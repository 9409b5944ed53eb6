"""LoRA for the actor, through PEFT: wrapping the model, the merged weights a rollout engine and the Hugging Face export
take, and the adapter in PEFT's own format.

The actor trains the adapters (`lora_A`, `lora_B`) and nothing else; every other parameter is frozen. A rollout
engine gets the adapted policy one of two ways (`actor.lora.merge`):

- the adapter push (default): the engine loads the same base checkpoint and applies the adapters unmerged; after
  each update only the adapters travel (`adapter_weights`, float32, PEFT's file names), loaded by the transformers
  engine into its PEFT model (`wrap_engine_model`, `load_adapter_weights`) and by vLLM from a PEFT adapter directory
  (`write_adapter`) under a new `LoRARequest`. Nothing is rounded onto W's grid (review async-lora M2).
- the merged push: every weight under the base model's Hugging Face names, each adapted layer's merged,
  W + (alpha / r) B A, computed out of place from PEFT's `get_delta_weight` (the base weights are never changed, so
  no merge/unmerge round trip rounds them step after step) in float32 and rounded once to the engine's dtype. In
  bfloat16 that loses every |delta| below half a bf16 step of W. Under FSDP2 the adapted layers' FSDP units are
  all-gathered one at a time (`FSDPModule.unshard`) for that computation. The checkpoints' merged `model/` and
  `dapo export` use it in float32, where it is exact.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

from dapo_rl.config import ConfigError, LoraConfig

ADAPTER = "default"
"""The name of the one adapter PEFT holds (its default name)."""


def _peft():
    try:
        import peft
    except ImportError as e:
        raise ConfigError(
            "actor.lora.rank > 0 trains adapters through PEFT, which is not installed: pip install 'dapo-rl[lora]'"
        ) from e
    return peft


def wrap_model(model, cfg: LoraConfig, seed: int, base_path: str | None = None):
    """Give `model` LoRA adapters (PEFT's `get_peft_model`, in place) and freeze everything else.

    The adapters are initialised from their own generator seeded with `seed` (the caller's global generators are
    left as they were), so one process and every rank of FSDP2 build the same adapters. Adapters are fp32 even
    on a bf16 base (PEFT's `autocast_adapter_dtype`).

    Args:
        model: a transformers causal LM (on any device, `meta` included: then the adapters are on `meta` too).
        cfg: `actor.lora` (rank > 0).
        seed: seed of the adapters' initialisation (`lora_A`; `lora_B` starts at zero).
        base_path: the base checkpoint, recorded in `adapter_config.json` (`base_model_name_or_path`).

    Returns:
        The `peft.PeftModel`; `model` itself (its `get_base_model()`) now holds the adapted layers.

    Raises:
        ConfigError: PEFT is not installed, `target_modules` matches no module of the model, or it names a module
            whose weight is tied to another's (the LM head of a model with `tie_word_embeddings`: the engine and the
            export hold one tensor for both names, so a merged head would change the embedding too).
    """
    peft = _peft()
    shared: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(p), []).append(name)
    tied = {id_: names for id_, names in shared.items() if len(names) > 1}
    targets = (
        cfg.target_modules[0] if list(cfg.target_modules) == ["all-linear"] else list(cfg.target_modules)
    )
    config = peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        init_lora_weights=True if cfg.init == "default" else cfg.init,
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            wrapped = peft.get_peft_model(model, config)
        except ValueError as e:
            raise ConfigError(f"actor.lora.target_modules={list(cfg.target_modules)}: {e}") from e
    clash = [
        f"{name} ({' = '.join(tied[id(p)])})"
        for name, layer in lora_layers(model).items()
        for p in layer.base_layer.parameters(recurse=False)
        if id(p) in tied
    ]
    if clash:
        raise ConfigError(
            f"actor.lora.target_modules={list(cfg.target_modules)}: {'; '.join(clash)} is one weight under two "
            "names (tied embeddings); adapters on a tied weight are not supported: leave that module out "
            "(all-linear does)"
        )
    if base_path is not None:  # absolute, so that `dapo export` finds it from any directory
        wrapped.peft_config[ADAPTER].base_model_name_or_path = (
            os.path.abspath(base_path) if os.path.isdir(base_path) else base_path
        )
    return wrapped


def lora_layers(model) -> dict[str, torch.nn.Module]:
    """`{module name: PEFT LoRA layer}` of a wrapped model's base (`PeftModel.get_base_model()`), in module order."""
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def is_adapter_name(name: str) -> bool:
    """Whether a state-dict name is an adapter's (`...lora_A.default.weight`, `...lora_B...`), not a base weight."""
    return ".lora_" in name


def hf_name(name: str) -> str:
    """The base model's Hugging Face name of a wrapped model's parameter: `q_proj.base_layer.weight` -> `q_proj.weight`
    (PEFT moves the adapted layer's own weights under `base_layer`)."""
    return name.replace(".base_layer.", ".")


def merged_layer_weights(
    model, dtype: torch.dtype | None = None, sharded: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """`(Hugging Face name, W + delta)` for the weight of every LoRA layer of `model`, one at a time, where delta is
    PEFT's `get_delta_weight` (alpha / r * B A, in W's layout), computed out of place.

    Under FSDP2 (`sharded`), the layers are taken unit by unit: each FSDP unit holding LoRA layers (a decoder layer,
    or the root) is all-gathered (`unshard`, in the mixed-precision policy's dtype), its merged weights computed and
    yielded, and resharded; a collective: every rank consumes the iterator to the end.

    Args:
        model: the wrapped model's base (`PeftModel.get_base_model()`), sharded or not.
        dtype: the merged weights' dtype (None: W's dtype). W + delta is formed in float32 and rounded once to it;
            in bfloat16 every |delta| below half a bf16 step of W is lost (review async-lora M2): the engine's
            adapter push (`adapter_weights`) avoids that.
        sharded: the model is FSDP2-sharded.

    Returns:
        Full tensors `(out, in)`, detached, in the model's module order within each unit.
    """
    layers = lora_layers(model)
    if not sharded:
        groups: list[tuple[torch.nn.Module | None, list[str]]] = [(None, list(layers))]
    else:
        from torch.distributed.fsdp import FSDPModule

        units = {n: m for n, m in model.named_modules() if isinstance(m, FSDPModule)}
        by_unit: dict[str, list[str]] = {}
        for name in layers:  # the nearest FSDP unit above the layer (the root's name is "")
            owner = max((u for u in units if u == "" or name.startswith(u + ".")), key=len)
            by_unit.setdefault(owner, []).append(name)
        groups = [(units[u], names) for u, names in by_unit.items()]
    with torch.no_grad():
        for unit, names in groups:
            if unit is not None:
                unit.unshard()
            try:
                for name in names:
                    layer = layers[name]
                    w = layer.base_layer.weight
                    # in fp32, then one rounding to the output dtype: a bf16 W + delta formed in bf16 would round
                    # the delta to W's grid first (bit-equal to today's fp32 merge when W is fp32)
                    merged = w.float() + layer.get_delta_weight(ADAPTER).float()
                    merged = merged.to(dtype if dtype is not None else w.dtype)
                    yield f"{name}.weight", merged.detach()
            finally:
                if unit is not None:
                    unit.reshard()


def adapter_state(peft_model) -> Iterator[tuple[str, torch.Tensor]]:
    """`(PeftModel state-dict name, full tensor)` of every adapter parameter, one at a time (under FSDP2 each is
    all-gathered: a collective, every rank consumes it to the end); the input `PeftModel.save_pretrained` takes as
    `state_dict`."""
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if is_adapter_name(name):
                yield name, (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()


def export_merged(checkpoint: str, output: str | None = None, dtype: str = "float32") -> str:
    """Write the merged model of a LoRA checkpoint as a plain Hugging Face checkpoint (`dapo export`): the base model
    that `adapter/adapter_config.json` names, its adapter merged in (PEFT's `merge_and_unload`), and the base's
    tokenizer.

    Args:
        checkpoint: a `global_step_N` directory holding `adapter/`.
        output: where to write (default: `<checkpoint>/model`).
        dtype: `float32` or `bfloat16`, the written weights' dtype (the merge itself is computed in it too).

    Returns:
        The output directory.

    Raises:
        ConfigError: no `adapter/` in `checkpoint`, or its base model cannot be loaded.
    """
    from pathlib import Path

    from dapo_rl.models.hf import load_model, load_tokenizer

    peft = _peft()
    ckpt = Path(checkpoint)
    adapter = ckpt / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        raise ConfigError(
            f"{ckpt}: no adapter/adapter_config.json (not a checkpoint of a run with actor.lora)"
        )
    base = peft.PeftConfig.from_pretrained(str(adapter)).base_model_name_or_path
    if not base:
        raise ConfigError(f"{adapter / 'adapter_config.json'}: no base_model_name_or_path")
    out = Path(output) if output else ckpt / "model"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out={out}: cannot create that directory ({e.strerror or e})") from e
    tokenizer = load_tokenizer(base, setting=f"{adapter}/adapter_config.json base_model_name_or_path")
    model = load_model(base, dtype, setting=f"{adapter}/adapter_config.json base_model_name_or_path")
    merged = peft.PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return str(out)


# ---------------------------------------------------------------------------------------------- the adapter push
# Under `actor.lora.merge=false` (the default) a rollout engine holds the base model (loaded from the same base
# checkpoint as the actor) and the adapters, unmerged: only the adapters travel after each update, and the engine
# computes W x + s B A x as the actor does, so no adapter update is rounded away on W's bf16 grid (review async-lora
# M2; verl's adapter sync: `verl/utils/fsdp_utils.py::collect_lora_params`, `verl/workers/fsdp_workers.py`
# `base_sync_done`, loaded by `verl/workers/rollout/vllm_rollout/utils.py` with `TensorLoRARequest`).

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM 0.32 takes for `max_lora_rank` (`vllm/config/lora.py`, `MaxLoRARanks`)."""


def saved_name(name: str) -> str:
    """PEFT's file name of an adapter parameter (`get_peft_model_state_dict`'s convention): the adapter's own name
    dropped, `...q_proj.lora_A.default.weight` -> `...q_proj.lora_A.weight`."""
    return name.replace(f".{ADAPTER}.", ".")


def adapter_weights(peft_model) -> Iterator[tuple[str, torch.Tensor]]:
    """`(PEFT file name, full float32 tensor)` of every adapter (`lora_A`: (r, in), `lora_B`: (out, r)), one at a
    time: what the actor pushes to an engine that applies the adapters unmerged. Under FSDP2 each is all-gathered
    (a collective: every rank consumes the iterator to the end). Names as in `adapter_model.safetensors`:
    `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`."""
    for name, t in adapter_state(peft_model):
        yield saved_name(name), t.float()


def target_modules_of(names) -> list[str]:
    """The module leaf names (`q_proj`, `down_proj`, ...) that adapter file names adapt, sorted: the explicit
    `target_modules` an engine's adapter config needs (the actor's `all-linear` resolved)."""
    return sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n in names if is_adapter_name(n)})


def wrap_engine_model(model, cfg: LoraConfig):
    """The transformers engine's model with the actor's adapters, unmerged (PEFT's `get_peft_model`, in eval mode,
    dropout off): `lora_B` starts at zero, so it samples the base model until the first `load_adapter_weights`.

    Raises:
        ConfigError: as `wrap_model` (PEFT missing, unknown or tied `target_modules`).
    """
    from dataclasses import replace

    return wrap_model(model, replace(cfg, dropout=0.0), seed=0).eval()


def load_adapter_weights(peft_model, named_tensors) -> None:
    """Copy adapters given under PEFT's file names (`adapter_weights`) into `peft_model`'s, in place (cast to their
    dtype). Every adapter of the model must come, and nothing else.

    Raises:
        ValueError: a name the model has no adapter for, or adapters left without a value (both listed).
    """
    params = {
        saved_name(n): p for n, p in peft_model.named_parameters() if is_adapter_name(n)
    }  # the adapters of the one adapter PEFT holds
    unknown: list[str] = []
    seen: set[str] = set()
    with torch.no_grad():
        for name, t in named_tensors:
            p = params.get(name)
            if p is None:
                unknown.append(name)
                continue
            p.copy_(t)
            seen.add(name)
    missing = sorted(set(params) - seen)
    if unknown or missing:
        raise ValueError(
            "the adapter push does not match the engine's adapters: "
            + "; ".join(
                part
                for part in (
                    f"{len(unknown)} unknown: {', '.join(unknown[:4])}" if unknown else "",
                    f"{len(missing)} not pushed: {', '.join(missing[:4])}" if missing else "",
                )
                if part
            )
        )


def write_adapter(path: str, named_tensors, cfg: LoraConfig) -> list[str]:
    """Write adapters (PEFT file names, as `adapter_weights` yields them) as a PEFT adapter directory that vLLM's
    `LoRARequest(name, id, path)` loads: `adapter_model.safetensors` and `adapter_config.json` (r, lora_alpha,
    the adapted module names listed explicitly: vLLM does not resolve `all-linear`).

    Returns:
        The adapted module leaf names (`target_modules`).
    """
    import json

    from safetensors.torch import save_file

    tensors = {n: t.detach().contiguous().cpu() for n, t in named_tensors}
    targets = target_modules_of(tensors)
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": 0.0,
        "target_modules": targets,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "fan_in_fan_out": False,
    }
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return targets


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM takes that holds `rank`.

    Raises:
        ValueError: `rank` is above vLLM's largest (512).
    """
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"actor.lora.rank={rank}: vLLM serves adapters up to rank {VLLM_LORA_RANKS[-1]}")
