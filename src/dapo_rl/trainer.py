"""The DAPO training loop (paper Algorithm 1), as DESIGN.md draws it:

prompts -> rollout engine -> responses + log-probs + finish reason -> verifier (score, acc) -> overlong shaping
-> groups of n -> dynamic sampling (keep groups whose acc varies; sample more rounds) -> group-normalised
advantages -> actor update (token-level clipped loss) -> weight sync -> metrics, checkpoint

SPMD: under a launcher every rank runs this same loop on its own share of the prompts (`dapo_rl.collect`); rank 0
alone writes metrics, logs, the plot and the checkpoint index. Asynchronous training (`async_training`) is the
exception: rank 0 alone samples (its rollout producer and engine processes) and every rank trains on its rows of
rank 0's batches.

SIGTERM and Ctrl-C stop the run at the next step boundary with a checkpoint; a second Ctrl-C quits at once
(`dapo_rl.stopping`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch
from omegaconf import OmegaConf

from dapo_rl.actor import Actor, NonFiniteWeights, TrainBatch
from dapo_rl.algo.policy_loss_variants import clip_bounds_warning
from dapo_rl.algo.rollout_correction import truncated_sampling_bias
from dapo_rl.campo import CampoSchedule
from dapo_rl.checkpoint import (
    check_resumable,
    incomplete_checkpoints,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    seed_everything,
    truncate_metrics,
)
from dapo_rl.collect import (
    DynamicSamplingExhausted,
    PromptGroup,
    collect_batch,
    make_train_batch,
    prompt_policy,
)
from dapo_rl.collect.producer import RolloutProducer
from dapo_rl.config import Config, ConfigError, resume_config_diff, to_yaml
from dapo_rl.data import (
    EpochSampler,
    PromptDataset,
    apply_prompt_template,
    load_samples,
    reasoning_gym_samples,
)
from dapo_rl.data.dataset import DataError
from dapo_rl.distributed import (
    DistContext,
    all_gather_objects,
    all_reduce,
    barrier,
    broadcast_object,
    launched_rank,
)
from dapo_rl.episode import build_episode
from dapo_rl.episode.chat_tools import prompt_tools
from dapo_rl.models.hf import load_tokenizer, model_context_length
from dapo_rl.models.lm_head import lm_head_fp32_note
from dapo_rl.perf import choose_attn_implementation, choose_autocast_dtype, matmul_peak_flops, training_mfu
from dapo_rl.rollout import (
    SamplingParams,
    build_engine,
    check_engine,
    engine_settings,
    push_keeps_fp32_head,
    with_lora,
)
from dapo_rl.rollout.remote import EngineSpec, HostStaging, RemoteEngines
from dapo_rl.rollout.seeds import Stream, round_seed
from dapo_rl.stopping import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    CtrlC,
    Interrupted,
    TrainingStopped,
    catch_sigterm,
    resume_command,
    say_interrupted,
    say_sigterm_at_startup,
)
from dapo_rl.summary import closing_summary
from dapo_rl.tracking import Tracking, check_trackers

__all__ = [
    "EXIT_DYNAMIC_SAMPLING_EXHAUSTED",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "EXIT_TRAINING_DIVERGED",
    "DynamicSamplingExhausted",
    "Trainer",
    "TrainingDiverged",
    "TrainingStopped",
    "run",
    "truncate_metrics",
]

EXIT_CONFIG = 2
"""Exit code of `dapo` for a bad configuration or data."""

EXIT_DYNAMIC_SAMPLING_EXHAUSTED = 3
"""Exit code of `dapo train` when dynamic sampling could not fill a batch within `max_num_gen_batches` rounds."""

EXIT_TRAINING_DIVERGED = 4
"""Exit code of `dapo train` after `trainer.max_consecutive_bad_steps` steps in a row with a non-finite update."""


class TrainingDiverged(RuntimeError):
    """`trainer.max_consecutive_bad_steps` steps in a row had a non-finite loss or gradient."""


def _quiet(_msg: str) -> None:
    """The log of ranks other than 0."""


class Trainer:
    """Runs DAPO from a `Config`: set up everything, then `fit()`. The same object runs on every rank.

    Args:
        cfg: the resolved configuration.
        resume: continue from the latest checkpoint in `trainer.output_dir`.
        log: where one-line messages go on rank 0 (the CLI passes a tqdm-aware printer).
        ctx: this rank (`dapo_rl.distributed.init_distributed`); None: one process on `trainer.device`.

    Raises:
        ConfigError: bad model path, data that cannot form a batch, a batch that does not split over the ranks, an
            output directory that already holds a run (without `resume`), or `resume` with no checkpoint.
        DataError: unreadable or malformed data files.
    """

    def __init__(self, cfg: Config, resume: bool = False, log=print, ctx: DistContext | None = None):
        self.engine = self.episode = self.producer = None
        try:
            self._build(cfg, resume, log, ctx)
        except BaseException:  # a failed start leaves no process behind (review async-lora M1)
            self.close()
            raise

    def close(self) -> None:
        """Stop what this trainer started, each part even if another failed: the rollout producer (told to stop,
        not waited for: `fit` waits for its round on a normal exit; here its engines' end ends its round), the
        episode's reward pool, the rollout engine(s), then the producer's thread (5 s at most). Idempotent.

        Raises:
            RuntimeError: a part did not stop cleanly (the others were still stopped; the first error is raised).
        """
        producer, episode, engine = self.producer, self.episode, self.engine
        self.producer = self.episode = self.engine = None
        steps = (
            (lambda: producer.stop(0.0)) if producer is not None else None,
            episode.close if episode is not None else None,
            engine.close if engine is not None else None,
            (lambda: producer.stop(5.0)) if producer is not None else None,
        )
        first: BaseException | None = None
        for stop in steps:
            if stop is None:
                continue
            try:
                stop()
            except Exception as e:  # noqa: BLE001 (the next part must still stop)
                first = first or e
        if first is not None:
            raise RuntimeError(f"{type(first).__name__}: {first}") from first

    def _build(self, cfg: Config, resume: bool, log, ctx: DistContext | None) -> None:
        if ctx is None:
            from dapo_rl.distributed import resolve_device

            ctx = DistContext(device=resolve_device(cfg.trainer.device))
        self.cfg, self.ctx = cfg, ctx
        self.log = log if ctx.is_main else _quiet
        self.out = Path(cfg.trainer.output_dir)
        self.metrics_path = self.out / "metrics.jsonl"
        self.step = 0
        self.warmup_seconds = 0.0
        """Seconds this process spent building the embedded base model (0 when it was cached or not used)."""
        self.bad_streak = 0
        self.gen_samples_total = 0
        self.prompt_policy = prompt_policy(cfg.algorithm.filter_groups)  # checkpointed as "dynamic_sampling"
        # `carry_surplus`: kept groups for the next step (not checkpointed: a resumed run starts without them)
        self.carry: list[PromptGroup] = []
        # SIGTERM (`fit`'s handler) or SIGINT (`run`'s first Ctrl-C): stop at the next step boundary
        self.stop_signal = 0
        self.async_k = cfg.async_training.max_staleness
        rc = cfg.algorithm.rollout_correction
        bias = truncated_sampling_bias(
            cfg.rollout.name,
            cfg.rollout.top_p,
            cfg.rollout.top_k,
            engine_logprobs_stand_in=self.async_k > 0
            or rc.bypass_mode
            or bool(rc.rollout_is or rc.rollout_rs),
        )
        if bias is not None:
            self.log(f"warning: {bias}")
        a = cfg.algorithm
        bounds = clip_bounds_warning(a.policy_loss.loss_mode, a.clip_ratio_low, a.clip_ratio_high)
        if bounds is not None:
            self.log(f"warning: {bounds}")
        self.producer: RolloutProducer | None = None  # asynchronous training's rollout thread (K >= 1)
        self._async_state: dict | None = None  # its checkpointed state, on resume
        n_engines = cfg.rollout.n_gpus_per_node
        # asynchronous: rank 0 holds the engine processes and the producer; the other ranks only train
        engine_here = self.async_k == 0 or ctx.rank == 0
        engine_gpus = (  # GPUs of their own, before any loading
            _engine_gpus(ctx.device, n_engines) if self.async_k > 0 and engine_here else [None] * n_engines
        )
        self._check_split()
        check_trackers(cfg.trainer.logger)
        try:
            check_engine(cfg.rollout, ctx)
        except ValueError as e:
            raise ConfigError(str(e)) from e
        ckpt = self._setup_run_dir(resume)
        if ckpt is not None:
            check_resumable(ckpt, ctx)  # before the tokenizer and the engine read its model/
        self.engine_threads = 0
        # asynchronous on CPU: the engine processes and the trainer (rank 0's) share the cores
        if self.async_k > 0 and engine_here and ctx.device.type == "cpu":
            cores = torch.get_num_threads()
            self.engine_threads = cfg.async_training.rollout_num_threads or max(1, cores // 2)
            if cfg.trainer.num_threads == 0:
                torch.set_num_threads(max(1, cores - self.engine_threads))
        if cfg.trainer.num_threads > 0:
            torch.set_num_threads(cfg.trainer.num_threads)
        seed_everything(cfg.trainer.seed + ctx.rank)
        data_first = ckpt is None and cfg.model.path == "embedded"
        if data_first:  # its byte-level tokenizer needs no model: bad data fails before minutes of warm-up
            from dapo_rl.models.tiny import build_tiny_tokenizer

            self.tokenizer = build_tiny_tokenizer()
            self._setup_data()
        lora = cfg.actor.lora.rank > 0
        # under LoRA the actor and the engine start from the base model: a checkpoint holds the adapters, and its
        # merged model/ only at the run's end
        load_path = str(ckpt / "model") if ckpt is not None and not lora else self._base_model_path()
        self._setup_tokenizer(load_path)
        if not data_first:
            self._setup_data()
        autocast, reason = choose_autocast_dtype(cfg.actor.autocast_dtype, ctx.device)
        # every rank must compute alike: bf16 only if it is the choice everywhere
        if all_reduce([float(autocast == "none")], ctx, op="max")[0] > 0:
            autocast = "none"
        self.autocast_dtype = autocast
        if ctx.rank == 0 and cfg.actor.autocast_dtype == "auto":
            self.log(f"actor: {reason}")
        if ctx.rank == 0 and cfg.actor.lm_head_fp32:
            self.log(lm_head_fp32_note(autocast, cfg.model.dtype, cfg.rollout.name))
        self.attn_implementation = self._choose_attention(load_path, autocast)
        algo = cfg.algorithm
        if algo.loss_scale_factor is None:  # Dr. GRPO's constant: the generation budget
            algo = replace(algo, loss_scale_factor=float(cfg.data.max_response_length))
        self.actor = Actor(
            load_path,
            replace(cfg.actor, autocast_dtype=autocast),
            algo,
            ctx,
            dtype=cfg.model.dtype,
            trust_remote_code=cfg.model.trust_remote_code,
            temperature=cfg.rollout.temperature,
            attn_implementation=self.attn_implementation,
            load_weights=ckpt is None,  # resume: DCP's shards fill the parameters; model/ is for the engine
            seed=cfg.trainer.seed,  # of the LoRA adapters' initialisation
        )
        self.n_params = sum(
            p.numel() for p in self.actor.model.parameters()
        )  # DTensors count their full size
        self.n_trainable = sum(p.numel() for p in self.actor.trainable)
        if lora:
            lo = cfg.actor.lora
            base = self.n_params - self.n_trainable
            self.log(
                f"actor: LoRA rank {lo.rank}, alpha {lo.alpha:g} on {', '.join(lo.target_modules)}: "
                f"{self.n_trainable:,} trainable parameters ({100 * self.n_trainable / base:.2f}% of the {base:,} "
                "frozen ones)"
            )
        bf16 = (
            autocast == "bfloat16" or cfg.model.dtype == "bfloat16"
        )  # bf16 parameters compute in bf16 anyway
        self.peak_flops = (
            matmul_peak_flops(ctx.device, torch.bfloat16 if bf16 else torch.float32) * ctx.world_size
        )
        engine_kwargs = engine_settings(cfg, autocast, self.attn_implementation)
        self.engine = None  # asynchronous training: only rank 0 has one (the engine processes)
        # LoRA: the engine applies the adapters unmerged and only they travel (lora.py, "the adapter push")
        self.push_adapters = lora and not cfg.actor.lora.merge
        rollout_cfg = with_lora(cfg.rollout, cfg.actor.lora) if self.push_adapters else cfg.rollout
        try:
            if self.async_k > 0 and engine_here:
                spec = EngineSpec(
                    # the engine never sleeps and takes most of its device: the device is its own (review async-lora m5)
                    replace(
                        rollout_cfg,
                        sleep_level=0,
                        gpu_memory_utilization=cfg.rollout.memory_share(own_gpu=True),
                    ),
                    load_path,
                    device=ctx.device.type,
                    num_threads=max(1, self.engine_threads // n_engines) if self.engine_threads else 0,
                    **engine_kwargs,
                )
                self.engine = RemoteEngines([replace(spec, cuda_visible_devices=g) for g in engine_gpus])
                procs = self.engine.engines
                self.log(
                    f"async: the rollout engine runs in {len(procs)} process(es) of its own (pid "
                    + ", ".join(str(e.proc.pid) for e in procs)
                    + (
                        f"; torch threads: {procs[0].num_threads} in each, {torch.get_num_threads()} here"
                        if ctx.device.type == "cpu"
                        else f"; GPU {', '.join(str(g) for g in engine_gpus)}"
                    )
                    + f"); trained groups lag the policy by at most async_training.max_staleness={self.async_k}"
                )
            elif self.async_k == 0:
                self.engine = build_engine(rollout_cfg, load_path, self.tokenizer, ctx=ctx, **engine_kwargs)
        except ValueError as e:
            raise ConfigError(str(e)) from e
        # the engine holds bf16 weights under bf16 compute: push bf16 (half the all-gather traffic under FSDP2)
        self._push_dtype = torch.bfloat16 if bf16 else None
        # checkpoints' model/ in what the engine samples with; a LoRA run's merged model/ in float32, exact as
        # `dapo export`'s (W + delta rounded to bf16 would lose the small deltas, review async-lora M2)
        self.actor.export_dtype = torch.float32 if lora else self._push_dtype
        if lora and cfg.actor.lora.merge and bf16 and ctx.rank == 0:
            self.log(
                "WARNING: actor.lora.merge=true with a bfloat16 engine: LoRA merged into bf16 weights loses every "
                "adapter update below half a bf16 step of W, so the engine samples a policy lagging the trainer's "
                "(docs/lora.md); actor.lora.merge=false pushes the adapters instead"
            )
        if self.engine is not None:  # every pushed name lands in the engine, every engine parameter gets one
            try:
                self.engine.check_weight_names(
                    self.actor.engine_adapter_names()
                    if self.push_adapters
                    else self.actor.engine_weight_names()
                )
            except ValueError as e:
                raise ConfigError(f"rollout.name={cfg.rollout.name}: {e}") from e
        # vLLM seeds the process-wide generators with its engine seed (`Worker.init_device`), the same on every rank
        # of a tensor-parallel group: give each rank its own stream back
        seed_everything(cfg.trainer.seed + ctx.rank)
        try:
            self.episode = build_episode(cfg, self.tokenizer, self.log)
        except ValueError as e:  # a bad episode type or reward setting that passed the config check
            raise ConfigError(f"episode: {e}") from e
        self.campo = CampoSchedule(cfg.algorithm.campo) if cfg.algorithm.campo.enable else None
        if ckpt is not None:
            self._resume_from(ckpt)
            if lora:  # the engine holds the base model: give it the resumed adapters, merged
                self._push_weights()
        if self.async_k > 0 and self.engine is not None:
            self._staging = HostStaging()  # rank 0's two host copies of the weights, reused every step
            self.producer = RolloutProducer(
                self.engine,
                self.episode,
                self.sampler,
                self.train_data,
                lambda: self.step_cfg,
                self.prompt_policy,
                self.async_k,
                version=self.step,
                log=self.log,
                world_size=ctx.world_size,
            )
            if self._async_state is not None:
                self.producer.load_state_dict(self._async_state)
        self._apply_stage()
        self.tracking = None
        failed: ConfigError | None = None
        if ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.yaml").write_text(to_yaml(cfg))
            try:
                self.tracking = self._start_tracking(resumed=ckpt is not None)
            except ConfigError as e:
                failed = e
        # a tracker that did not start on rank 0 stops every rank (none waits for it at a barrier)
        if all_reduce([float(failed is not None)], ctx, op="max")[0] > 0:
            raise failed or ConfigError(
                "trainer.logger: the trackers did not start on rank 0 (its message says why)"
            )
        barrier(ctx)

    # ----------------------------------------------------------------------------------------------- set-up
    def _apply_stage(self) -> None:
        """The settings of the next steps: the run's, or the current CAMPO stage's length limit and clip bounds
        (`dapo_rl.campo`). They reach sampling and the overlong penalty as each round's `SamplingParams.max_tokens`
        (`round_params`), and the loss as `train_step`'s `Actor.update(clip_ratio=...)`."""
        self.step_cfg = self.campo.stage_config(self.cfg) if self.campo is not None else self.cfg

    def _start_tracking(self, resumed: bool) -> Tracking | None:
        """The trackers of `trainer.logger` beyond console and jsonl (None when there are none)."""
        t = self.cfg.trainer
        if not set(t.logger) - {"console", "jsonl"}:
            return None
        return Tracking(
            t.logger,
            t.project_name,
            t.experiment_name or self.out.resolve().name,
            OmegaConf.to_container(OmegaConf.structured(self.cfg)),
            self.out,
            resume_step=self.step if resumed else None,
        )

    def _check_split(self) -> None:
        """Each mini-batch must split evenly over the ranks (FSDP2 needs the same number of passes on each)."""
        c, world = self.cfg, self.ctx.world_size
        seqs = c.actor.ppo_mini_batch_size * c.rollout.n
        if seqs % world:
            raise ConfigError(
                f"actor.ppo_mini_batch_size x rollout.n = {seqs} sequences per optimizer step cannot be split evenly "
                f"over {world} ranks; make it a multiple of the world size"
            )

    def _setup_run_dir(self, resume: bool) -> Path | None:
        """The checkpoint to resume from (None: a new run), after checking the run directory. Rank 0 looks and every
        rank takes its answer (a collective), so all ranks check, load and refuse alike."""
        found = latest_checkpoint(self.out) if self.ctx.rank == 0 else None
        found = broadcast_object(None if found is None else str(found), self.ctx)
        ckpt = None if found is None else Path(found)
        passed = incomplete_checkpoints(self.out) if resume and self.ctx.rank == 0 else []
        if resume and ckpt is None:
            raise ConfigError(
                f"--resume: no checkpoint under {self.out / 'checkpoints'}"
                + (f" ({', '.join(p.name for p in passed)}: no trainer_state.pt, damaged)" if passed else "")
            )
        if passed:
            self.log(
                f"warning: --resume passes over {', '.join(p.name for p in passed)} (no trainer_state.pt: damaged "
                f"after it was written) and resumes from {ckpt.name}"
            )
        if not resume and self.metrics_path.exists():
            if ckpt is not None:
                raise ConfigError(
                    f"trainer.output_dir={self.out} already holds a run; pass --resume to continue it from "
                    f"{ckpt.name}, or choose another trainer.output_dir"
                )
            raise ConfigError(
                f"trainer.output_dir={self.out} holds the metrics of an earlier run that saved no checkpoint, so there "
                "is nothing to resume; remove that directory or choose another trainer.output_dir"
            )
        if ckpt is not None and (self.out / "config.yaml").is_file():
            refused, harmless = resume_config_diff(self.out / "config.yaml", self.cfg)
            if refused:
                raise ConfigError(
                    f"--resume: {len(refused)} setting(s) differ from the run's saved config and change what it "
                    f"trains: {'; '.join(refused)}. Resume with the saved values (`dapo train --resume "
                    f"trainer.output_dir={self.out}` with no recipe reads {self.out / 'config.yaml'}) or start a "
                    "new trainer.output_dir"
                )
            if harmless:
                self.log(f"warning: --resume with changed settings: {'; '.join(harmless)}")
        barrier(self.ctx)  # every rank has looked before rank 0 writes anything
        return ckpt

    def _base_model_path(self) -> str:
        """`model.path`, or the checkpoint `embedded` or a model alias (`smollm2-135m-instruct`) stands for (built
        once per machine by local rank 0, the others wait)."""
        from dapo_rl.models.smollm2 import MODEL_ALIASES, resolve_model_alias
        from dapo_rl.sft import ensure_embedded_model

        path = self.cfg.model.path
        if path != "embedded" and path not in MODEL_ALIASES:
            return path

        def build() -> str:
            if path == "embedded":
                return str(ensure_embedded_model(self.cfg.sft, log=self.log))
            return resolve_model_alias(path, self.log)

        if self.ctx.local_rank == 0:
            t0 = time.perf_counter()
            local = build()
            self.warmup_seconds = time.perf_counter() - t0  # ~0 when cached
        barrier(self.ctx)
        if self.ctx.local_rank != 0:
            local = build()  # cached by now
        return local

    def _setup_tokenizer(self, load_path: str) -> None:
        c = self.cfg
        self.tokenizer = load_tokenizer(load_path, c.model.trust_remote_code)
        need = c.data.max_prompt_length + c.data.max_response_length
        ctx_len = model_context_length(load_path, c.model.trust_remote_code)
        if ctx_len is not None and need > ctx_len:
            raise ConfigError(
                f"data.max_prompt_length + data.max_response_length = {need} tokens exceeds the model's context "
                f"(max_position_embeddings={ctx_len} in {load_path}/config.json)"
            )

    def _choose_attention(self, load_path: str, autocast: str) -> str:
        """`model.attn_implementation` resolved for this run (`dapo_rl.perf.choose_attn_implementation`): probed at
        the training micro-batch's shape (rows x the longest prompt + response) in the compute dtype; rank 0's
        choice holds on every rank, and `auto` logs why."""
        from transformers import AutoConfig

        cfg, ctx = self.cfg, self.ctx
        seq_len = cfg.data.max_prompt_length + cfg.data.max_response_length
        hf = AutoConfig.from_pretrained(load_path, trust_remote_code=cfg.model.trust_remote_code)
        heads = int(getattr(hf, "num_attention_heads", 1) or 1)
        head_dim = int(getattr(hf, "head_dim", None) or getattr(hf, "hidden_size", 64) // heads)
        a = cfg.actor
        rows = a.ppo_max_token_len_per_gpu // seq_len if a.use_dynamic_bsz else a.ppo_micro_batch_size
        bf16 = autocast == "bfloat16" or cfg.model.dtype == "bfloat16"
        impl, reason = choose_attn_implementation(
            cfg.model.attn_implementation,
            ctx.device,
            torch.bfloat16 if bf16 else torch.float32,
            heads=heads,
            head_dim=head_dim,
            rows=max(rows, 1),
            seq_len=seq_len,
        )
        impl, reason = all_gather_objects((impl, reason), ctx)[0]
        if ctx.rank == 0:
            self.log(
                f"model: {impl} attention ({reason})"
                if cfg.model.attn_implementation != "auto"
                else f"model: {reason}"
            )
        return impl

    def _setup_data(self) -> None:
        d = self.cfg.data
        try:  # a tool in the chat template's format: every prompt lists it
            self.prompt_tools = prompt_tools(self.cfg.episode, self.tokenizer)
        except ValueError as e:
            raise ConfigError(f"episode: {e}") from e
        skipped: list[DataError] | None = [] if d.skip_invalid else None  # None: raise on a bad row
        if d.train_files:
            samples = [s for f in d.train_files for s in load_samples(f, d.prompt_template, skipped)]
            self.train_data = PromptDataset(
                samples, self.tokenizer, d.max_prompt_length, Path(d.train_files[0]).stem, self.prompt_tools
            )
        else:
            self.train_data = self._reasoning_gym(d.train_reasoning_gym)
        if d.val_files:
            self.val_data = [
                PromptDataset(
                    load_samples(f, d.prompt_template, skipped),
                    self.tokenizer,
                    d.max_prompt_length,
                    Path(f).stem,
                    self.prompt_tools,
                )
                for f in d.val_files
            ]
        else:
            self.val_data = [self._reasoning_gym(d.val_reasoning_gym)]
        seen = {tuple(ids) for ids in self.train_data.prompt_ids}
        embedded = self.cfg.model.path == "embedded"
        if embedded:  # the warm-up's problems were trained on too, with their answers
            seen |= {tuple(ids) for ids in self._reasoning_gym(self.cfg.sft.task, template=False).prompt_ids}
        for ds in self.val_data:
            total = len(ds)
            if d.val_exclude_train_prompts:
                also = ds.drop_prompts(seen)
                what = f"left out (data.val_exclude_train_prompts), {len(ds)} remain"
            else:
                also = ds.count_prompts(seen)
                what = "kept (data.val_exclude_train_prompts=true leaves them out)"
            if also:
                self.log(
                    f"data: {also} of {total} validation prompts of {ds.name} are also training prompts"
                    + (" (RL or the embedded warm-up)" if embedded else "")
                    + f"; {what}"
                )
        if d.val_max_samples > 0:
            for ds in self.val_data:
                ds.samples, ds.prompt_ids = (
                    ds.samples[: d.val_max_samples],
                    ds.prompt_ids[: d.val_max_samples],
                )
        self.skipped_rows = len(skipped or [])
        if skipped:
            shown = "; ".join(str(e) for e in skipped[:3])
            more = f" (and {self.skipped_rows - 3} more)" if self.skipped_rows > 3 else ""
            self.log(
                f"data: skipped {self.skipped_rows} malformed rows (data.skip_invalid=true): {shown}{more}"
            )
        dropped = self.train_data.num_dropped
        if dropped:
            self.log(f"data: dropped {dropped} training prompts over data.max_prompt_length")
        if len(self.train_data) < d.gen_batch_size:
            raise ConfigError(
                f"data.gen_batch_size={d.gen_batch_size} prompts per generation round, but the training data "
                f"({self.train_data.name}) has only {len(self.train_data)} usable prompts"
                + (f" ({dropped} dropped over data.max_prompt_length)" if dropped else "")
                + "; lower data.gen_batch_size and data.train_batch_size or add data"
            )
        # replicated on every rank: each takes its share of every round
        self.sampler = EpochSampler(len(self.train_data), seed=self.cfg.trainer.seed, shuffle=d.shuffle)

    def _reasoning_gym(self, rg, template: bool = True) -> PromptDataset:
        samples = reasoning_gym_samples(rg.task, rg.size, rg.seed, dict(rg.params), rg.strip_instruction)
        if template:
            for s in samples:
                s.prompt = apply_prompt_template(s.prompt, self.cfg.data.prompt_template)
        return PromptDataset(
            samples, self.tokenizer, self.cfg.data.max_prompt_length, rg.task, self.prompt_tools
        )

    def _resume_from(self, ckpt: Path) -> None:
        state = load_checkpoint(ckpt, self.actor, self.ctx)
        self.step = int(state["step"])
        self.bad_streak = int(state.get("bad_streak", 0))
        self.gen_samples_total = int(state.get("gen_samples_total", 0))
        self.prompt_policy.load_state_dict(state.get("dynamic_sampling", {}))
        if self.campo is not None:
            try:
                self.campo.load_state_dict(state.get("campo", {}))
            except ValueError as e:
                raise ConfigError(f"{ckpt}: {e}") from e
        self.sampler.load_state_dict(state["sampler"])
        self._async_state = state.get("async")
        if self.ctx.is_main and self.metrics_path.exists():  # rows written after the checkpoint come again
            truncate_metrics(self.metrics_path, self.step)
        saved_world = int(state.get("world_size", 1))
        note = (
            f" (written by {saved_world} rank(s), resumed on {self.ctx.world_size}: prompts are shared out and "
            "sampled differently, so later metrics differ from the original run's)"
            if saved_world != self.ctx.world_size and self.async_k == 0  # async: rank 0 samples alone anyway
            else ""
        )
        self.log(f"resumed from {ckpt} at step {self.step}{note}")

    # -------------------------------------------------------------------------------------------- validate
    def validate(self) -> dict:
        """Evaluate each validation set with `rollout.val_kwargs` through the same code as `dapo eval`
        (`dapo_rl.evaluate`), each rank taking every `world_size`-th problem (asynchronous training: rank 0's first
        engine process takes them all): `val/<name>/acc` and
        `val/<name>/avg@<n>` (mean correctness over all samples), `val/<name>/pass@k` and `maj@k` when n > 1, and
        `val/<name>/response_length_mean`."""
        vk = self.cfg.rollout.val_kwargs
        params = SamplingParams(
            n=vk.n,
            temperature=vk.temperature,
            top_p=vk.top_p,
            top_k=vk.top_k,
            max_tokens=self.cfg.data.max_response_length,
            seed=self.cfg.trainer.seed,  # evaluate_dataset: round_seed(seed, dataset, chunk, rank, Stream.EVAL)
        )
        verify = self.episode.unshaped()
        out = {}
        with self._engine_current():
            for ds in self.val_data:
                out.update(self._validate_one(ds, params, verify))
            # the engine process holds the actor's weights now: check the transport
            if self.async_k > 0:
                out["rollout_corr/sync_logprob_gap"] = self.sync_logprob_gap()
        return out

    @contextlib.contextmanager
    def _engine_current(self):
        """Inside: the engine holds the actor's latest weights and nothing else uses it (asynchronous training:
        the producer paused at a round boundary and the newest weights pushed)."""
        if self.async_k == 0:
            yield
            return
        with contextlib.ExitStack() as stack:
            # rank 0 pauses its producer and pushes; a failure there (a dead engine) stops every rank alike
            error = None
            if self.producer is not None:
                try:
                    stack.enter_context(self.producer.paused(abort=True))  # the round in flight redone after
                    self.producer.push_pending()
                except Exception as e:
                    error = e
            self._rank0_status(error)
            yield

    def _validate_one(self, ds, params: SamplingParams, verify) -> dict:
        """`validate` on one dataset."""
        from dapo_rl.evaluate import dataset_metrics, evaluate_dataset

        n = self.cfg.rollout.val_kwargs.n
        if self.async_k > 0:  # rank 0's engine processes do all of it (the other ranks have none)
            mine = range(len(ds)) if self.engine is not None else range(0)
        else:
            mine = range(self.ctx.rank, len(ds), self.ctx.world_size)
        local = evaluate_dataset(
            self.engine,
            ds,
            params,
            verify,
            only=mine,
            chunk_problems=max(len(ds), 1),
            rank=self.ctx.rank if self.async_k == 0 else 0,
        )
        # asynchronous: the other ranks wait here while rank 0's engine samples the whole set
        light = [r.light() for r in local]
        records = [r for part in all_gather_objects(light, self.ctx, slow=self.async_k > 0) for r in part]
        m = dataset_metrics(records, n)
        out = {f"val/{ds.name}/acc": m[f"avg@{n}"]}
        keys = [k for k in m if k.startswith(("avg@", "pass@", "maj@"))] if n > 1 else [f"avg@{n}"]
        out.update({f"val/{ds.name}/{k}": m[k] for k in keys if m[k] is not None})  # one problem: no stderr
        out[f"val/{ds.name}/response_length_mean"] = m["response_length_mean"]
        return out

    # ------------------------------------------------------------------------------------------------ loop
    def train_step(self) -> dict:
        """One DAPO step: collect a batch with dynamic sampling, update the actor, push the weights to the engine."""
        ctx = self.ctx
        t0 = time.perf_counter()
        scored_before = self.episode.seconds
        if self.async_k > 0:  # asynchronous: the batch waits in rank 0's producer's queue
            groups, stats = self._next_async_batch()
        else:
            groups, stats = collect_batch(
                self.engine,
                self.episode,
                self.sampler,
                self.train_data,
                self.step_cfg,
                self.step,
                ctx,
                self.log,
                self.prompt_policy,
                self.carry,
            )
        t1 = time.perf_counter()
        batch = make_train_batch(groups, self.step_cfg, self.tokenizer.pad_token_id, self.step, ctx)
        if self.engine is not None:
            self.engine.sleep()
        clip = (self.step_cfg.algorithm.clip_ratio_low, self.step_cfg.algorithm.clip_ratio_high)
        upd = self.actor.update(batch, clip_ratio=clip)
        t2 = time.perf_counter()
        if self.async_k > 0:
            self._publish_weights()
            t3 = time.perf_counter()
            busy = (
                self.producer.busy_seconds(t1, t3) / max(t3 - t1, 1e-9) if self.producer is not None else 0.0
            )
            stats["async/overlap_ratio"] = all_reduce([busy], ctx, op="max")[0]  # rank 0's
            sync_gap = None
        else:
            self._push_weights()
            t3 = time.perf_counter()
            sync_gap = self.sync_logprob_gap()
        tokens = all_reduce([float(batch.attention_mask.sum())], ctx)[0]
        metrics = dict(stats)
        metrics["data/skipped_rows"] = self.skipped_rows
        # the loss's statistics (entropy, pg_loss, pg_clipfrac_*, ppo_kl, and what a loss, the KL term or the
        # off-policy mask adds: pg_cov_clipfrac, kl_loss, ref_reset, opsm_masked_fraction, ...)
        renamed = ("actor/grad_norm", "actor/lr", "actor/num_skipped_steps")
        for k, v in upd.items():
            if k.startswith("actor/") and k not in renamed:
                metrics[f"train/{k[len('actor/') :]}"] = v
        metrics["train/grad_norm"] = upd["actor/grad_norm"]
        metrics["train/lr"] = upd["actor/lr"]
        metrics["train/skipped_updates"] = upd["actor/num_skipped_steps"]
        metrics.update({k: v for k, v in upd.items() if k.startswith("rollout_corr/")})
        if sync_gap is not None:
            metrics["rollout_corr/sync_logprob_gap"] = sync_gap
        # overlaps time/generate_s with reward.overlap; the producer reports its rounds' scoring time itself
        if self.async_k == 0:
            metrics["time/score_s"] = self.episode.seconds - scored_before
        metrics["time/old_log_prob_s"] = upd["time/old_log_prob_s"]
        ref_s = upd.get("time/ref_log_prob_s", 0.0)  # the KL term's reference forward
        if "time/ref_log_prob_s" in upd:
            metrics["time/ref_log_prob_s"] = ref_s
        metrics["time/update_s"] = t2 - t1 - upd["time/old_log_prob_s"] - ref_s
        metrics["time/sync_weights_s"] = t3 - t2
        metrics["perf/tokens_per_s"] = tokens / max(t3 - t0, 1e-9)
        recomputed = tokens if upd["time/old_log_prob_s"] > 0 else 0.0
        metrics["perf/mfu"] = training_mfu(
            self.n_params, tokens, recomputed, t2 - t1, self.peak_flops, self.n_trainable
        )
        if self.campo is not None:
            metrics.update(self.campo.metrics())
            # the bounds this update was given (the stage's: Eq. 10's epsilon_low, epsilon_high)
            metrics["campo/clip_ratio_low"], metrics["campo/clip_ratio_high"] = clip
        return metrics

    def _next_async_batch(self) -> tuple[list[PromptGroup], dict]:
        """Asynchronous training: the step's groups and statistics from rank 0's producer (`next_batch`), on every
        rank: rank 0 keeps its groups whole (`owner` 0), the others get them light (`PromptGroup.light`) and
        `make_train_batch` fetches the rows they train on. A collective.

        Raises:
            DynamicSamplingExhausted: on every rank alike; RuntimeError on the other ranks when rank 0's producer
                failed (rank 0 raises the producer's own error).
        """
        error: BaseException | None = None
        payload = None
        if self.producer is not None:
            try:
                groups, stats = self.producer.next_batch(self.step_cfg.data.train_batch_size, self.step - 1)
                groups = [replace(g, owner=0) for g in groups] if self.ctx.distributed else groups
                payload = ("ok", [g.light() for g in groups] if self.ctx.distributed else None, stats)
            except BaseException as e:
                error = e
                exhausted = isinstance(e, DynamicSamplingExhausted)
                payload = (
                    ("exhausted", None, str(e)) if exhausted else ("failed", None, f"{type(e).__name__}: {e}")
                )
        payload = broadcast_object(payload, self.ctx, slow=True)  # the others wait for rank 0's batch
        if error is not None:
            raise error
        kind, light, stats = payload
        if kind == "exhausted":
            raise DynamicSamplingExhausted(stats)
        if kind == "failed":
            raise RuntimeError(f"rank 0's rollout producer failed ({stats})")
        return (groups if self.producer is not None else light), stats

    def _rank0_status(self, error: BaseException | None) -> None:
        """Asynchronous training: rank 0's producer or engine `error` (None: none) on every rank: rank 0 raises it,
        the others a RuntimeError naming it. A collective (on the slow group: the others may wait for rank 0)."""
        status = broadcast_object(
            None if error is None else f"{type(error).__name__}: {error}", self.ctx, slow=True
        )
        if error is not None:
            raise error
        if status is not None:
            raise RuntimeError(f"rank 0's rollout producer failed ({status})")

    def _engine_payload(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What a push sends: the adapters alone under LoRA with `actor.lora.merge=false` (the engine holds the
        base model it loaded; float32, a few MB), else every weight in the engine's dtype (`Actor.engine_weights`,
        adapted layers merged; an untied float32 head stays float32 for the `hf` engine). A collective under
        FSDP2."""
        if self.push_adapters:
            return self.actor.engine_adapters()
        return self.actor.engine_weights(self._push_dtype, keep_fp32_head=push_keeps_fp32_head(self.cfg))

    def _push_weights(self) -> None:
        """Give the engine the actor's weights now. A collective under FSDP2 (every parameter is gathered): a rank
        without an engine (asynchronous training, rank > 0) takes part and drops them."""
        weights = self._engine_payload()
        if self.engine is None:
            for _ in weights:
                pass
        else:
            self.engine.update_weights(weights)

    def _publish_weights(self) -> None:
        """Asynchronous training, after the update: a copy of the weights for rank 0's producer to push between its
        rounds while the next step goes on. An older copy not taken by the producer yet is dropped first; one being
        pushed stays until its push ends (at most two copies: `HostStaging`'s two slots, reused every step). The copy
        is in host memory, so the trainer's GPU never holds the model twice. A collective (see `_push_weights`)."""
        slot = self.producer.discard_pending() if self.producer is not None else 0
        weights = []
        for name, t in self._engine_payload():
            if self.producer is not None:
                weights.append((name, self._staging.copy(slot, name, t)))
        if self.producer is not None:
            self.producer.publish(weights, self.step, slot)

    def sync_logprob_gap(self, max_tokens: int = 8) -> float:
        """After a weight push: the largest |engine - actor| log-prob over a few tokens the engine samples for the
        first training prompt (cut to 64 tokens), the max over ranks (each rank probes its own engine; asynchronous
        training: over rank 0's engine processes, each probed). Near 0 (float32: ~1e-5; bfloat16: ~1e-2) when the
        engine holds the actor's weights; a push that left stale or misplaced weights shows as a gap of order 1.
        Logged as `rollout_corr/sync_logprob_gap`. A collective."""
        prompt = self.train_data.prompt_ids[0][:64] if len(self.train_data.prompt_ids) else []
        gap = 0.0
        if prompt:
            params = SamplingParams(
                n=1,
                temperature=self.cfg.rollout.temperature,
                max_tokens=max_tokens,
                seed=round_seed(self.cfg.trainer.seed, 0, 0, 0, Stream.PROBE),  # the same on every rank
            )
            samples = []
            if self.engine is not None:
                for e in self.engine.engines:
                    out = e.generate([prompt], params)[0][0]
                    samples.append((out.token_ids, out.logprobs))
            if self.async_k > 0:  # asynchronous: rank 0's engines' samples on every rank
                samples = broadcast_object(samples, self.ctx)
            for ids, logprobs in samples:
                # every rank runs the actor's forward (a collective under FSDP2), even with nothing to compare
                response = ids or [self.tokenizer.eos_token_id]
                probe = TrainBatch.build(
                    [prompt], [response], torch.zeros(1), torch.ones(1), self.tokenizer.pad_token_id
                )
                actor = self.actor.compute_log_prob(probe)[0, : len(ids)]
                if ids:
                    gap = max(gap, float((actor - torch.tensor(logprobs, dtype=torch.float32)).abs().max()))
        return all_reduce([gap], self.ctx, op="max")[0]

    def fit(self) -> list[dict]:
        """Train `trainer.total_training_steps` steps (from the resumed step), validating and checkpointing as
        configured; rank 0 writes `metrics.jsonl` and `training_dynamics.png`. Returns the metrics rows of this
        call (the same on every rank).

        Raises:
            DynamicSamplingExhausted, TrainingDiverged: on every rank alike.
        """
        from tqdm import tqdm

        from dapo_rl.plotting import plot_training_dynamics

        t = self.cfg.trainer
        main = self.ctx.is_main
        console = "console" in t.logger
        rows = []
        validating = t.test_freq > 0 or t.test_freq_samples > 0
        if self.step == 0 and t.val_before_train and validating:
            row = {"step": 0, **self.validate()}
            self._write_metrics(row)
            rows.append(row)
            if console:
                self.log(self._format(row))
        bar = tqdm(
            total=t.total_training_steps,
            initial=self.step,
            desc="dapo train",
            disable=None if t.progress_bar and main else True,  # None: a bar only on a terminal
            dynamic_ncols=True,
        )
        write = bar.write if main else _quiet
        previous_handler = catch_sigterm(self, self.ctx.is_main)
        if self.producer is not None:
            self.producer.start()
        try:
            while self.step < t.total_training_steps and not self.budget_spent():
                t0 = time.perf_counter()
                self.step += 1
                row = {"step": self.step, **self.train_step()}
                before = self.gen_samples_total
                self.gen_samples_total += int(row["train/gen_samples"])
                row["train/gen_samples_total"] = self.gen_samples_total
                if self.campo is not None and "train/response_clip_ratio" in row:  # a step that sampled
                    length = row.get("tool/context_length_mean", row["train/response_length_mean"])
                    note = self.campo.observe(self.step, row["train/response_clip_ratio"], length)
                    if note:
                        write(note)
                        self._apply_stage()
                last = self.step == t.total_training_steps or self.budget_spent()
                if last and self.producer is not None:  # no more batches: nothing more to sample
                    self.producer.stop()
                due = (t.test_freq > 0 and self.step % t.test_freq == 0) or (
                    t.test_freq_samples > 0
                    and self.gen_samples_total // t.test_freq_samples > before // t.test_freq_samples
                )
                if due or (last and validating):
                    row.update(self.validate())
                row["time/step_s"] = time.perf_counter() - t0
                self._write_metrics(row)
                rows.append(row)
                skipped = row["train/skipped_updates"]
                self.bad_streak = self.bad_streak + 1 if skipped else 0
                if skipped:
                    write(
                        f"step {self.step}: skipped {skipped} optimizer step(s) with a non-finite loss or gradient "
                        f"({self.bad_streak} bad step(s) in a row); the weights were not changed by them"
                    )
                if t.max_consecutive_bad_steps > 0 and self.bad_streak >= t.max_consecutive_bad_steps:
                    raise TrainingDiverged(
                        f"{self.bad_streak} steps in a row (trainer.max_consecutive_bad_steps="
                        f"{t.max_consecutive_bad_steps}) had a non-finite loss or gradient, so their updates were "
                        f"skipped; stopping at step {self.step}. The last checkpoint holds finite weights; lower "
                        "actor.lr, check the rewards (train/reward_mean) and the data, or resume with a higher "
                        "trainer.max_consecutive_bad_steps"
                    )
                saved = None
                if last or (t.save_freq > 0 and self.step % t.save_freq == 0):
                    saved = self.save_checkpoint(final=last)
                bar.update(1)
                if console:
                    write(self._format(row))
                # the safe point: this step's update and weight sync are done, the next rollout has not begun
                if not last and (signum := self.stop_requested()):
                    raise TrainingStopped(self.step, saved or self.save_checkpoint(), signum)
        finally:
            if previous_handler is not None:
                signal.signal(signal.SIGTERM, previous_handler)
            bar.close()
            if self.producer is not None:
                # a normal end or a SIGTERM stop lets the round in flight finish; on an error the engines' end (in
                # `close`) ends it, rather than a stuck engine's generate deadline (review of issue 42, M3)
                failing = sys.exc_info()[0] is not None and not issubclass(sys.exc_info()[0], TrainingStopped)
                self.producer.stop(0.0 if failing else None)
            self.episode.close()
            if self.tracking is not None:
                self.tracking.finish()
            quitting = isinstance(sys.exc_info()[1], Interrupted)  # a second Ctrl-C: no figure, quit at once
            if main and self.metrics_path.exists() and not quitting:
                plot_training_dynamics(self.metrics_path, self.out / "training_dynamics.png")
        return rows

    def stop_requested(self) -> int:
        """The stop signal any rank received (SIGTERM before SIGINT when ranks differ), or 0: an all-reduce at the
        step boundary, so every rank stops after the same step with the same exit code. A collective: every rank
        calls it."""
        return int(all_reduce([float(self.stop_signal)], self.ctx, op="max")[0])

    def budget_spent(self) -> bool:
        """Whether `trainer.max_generated_samples` (when set) responses have been sampled."""
        cap = self.cfg.trainer.max_generated_samples
        return cap > 0 and self.gen_samples_total >= cap

    def save_checkpoint(self, final: bool = False) -> Path:
        """Write `checkpoints/global_step_<step>/` (see `dapo_rl.checkpoint`); prune old ones. Under LoRA the merged
        `model/` is written only when `final` (the run's last step).

        Raises:
            TrainingDiverged: the weights are not finite (the previous checkpoint is kept).
        """
        # asynchronous: the producer pauses at a round boundary, so the sampler, the prompt policy and the queue
        # agree (the round in flight is aborted and its draw undone: it is redone after, or on resume)
        with (
            self.producer.paused(raise_error=False, abort=True)
            if self.producer is not None
            else contextlib.nullcontext()
        ):
            state = {
                "step": self.step,
                "bad_streak": self.bad_streak,
                "gen_samples_total": self.gen_samples_total,
                "sampler": self.sampler.state_dict(),
                "dynamic_sampling": self.prompt_policy.state_dict(),
                "campo": self.campo.state_dict() if self.campo is not None else {},
            }
            if self.producer is not None:
                state["async"] = self.producer.state_dict()
        if (
            self.async_k > 0
        ):  # the other ranks wait here, not in a short-timeout collective, while rank 0 pauses
            barrier(self.ctx, checkpoint=True)
        try:
            return save_checkpoint(
                self.out,
                self.step,
                self.actor,
                self.tokenizer,
                state,
                self.ctx,
                self.cfg.trainer.max_ckpt_to_keep,
                export_model=final,
            )
        except NonFiniteWeights as e:
            raise TrainingDiverged(
                f"step {self.step}: refusing to checkpoint {e}; the previous checkpoint is kept"
            ) from e
        finally:
            if (
                self.async_k > 0
            ):  # the checkpoint is written; now the producer's failure, if any, on every rank
                self._rank0_status(self.producer.error if self.producer is not None else None)

    @staticmethod
    def _format(row: dict) -> str:
        keys = [
            ("train/acc_mean", "acc", "{:.3f}"),
            ("train/reward_mean", "reward", "{:+.3f}"),
            ("train/response_length_mean", "len", "{:.1f}"),
            ("train/entropy", "entropy", "{:.3f}"),
            ("tool/used_ratio", "tool", "{:.3f}"),  # tool runs: the share of trajectories that called it
            ("train/kept_groups", "kept", "{}"),
            ("train/num_gen_batches", "gen_batches", "{}"),
            ("async/staleness_mean", "stale", "{:.2f}"),
            ("async/dropped_stale_groups", "dropped", "{}"),
            ("time/step_s", "step_s", "{:.2f}"),
        ]
        parts = [f"step {row['step']}"]
        parts += [f"{label} {fmt.format(row[k])}" for k, label, fmt in keys if k in row]
        parts += [f"{k} {v:.3f}" for k, v in row.items() if k.startswith("val/") and k.endswith("/acc")]
        return "  ".join(parts)

    def _write_metrics(self, row: dict) -> None:
        if not self.ctx.is_main:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        if self.tracking is not None:
            self.tracking.log(row, row["step"])


def _engine_gpus(device: torch.device, n: int) -> list[str | None]:
    """`CUDA_VISIBLE_DEVICES` of each of the `n` engine processes (`rollout.n_gpus_per_node`): the visible GPUs after
    the ones this machine's trainer ranks take (`cuda:<local rank>`, `LOCAL_WORLD_SIZE` of them); None each on CPU.

    Raises:
        ConfigError: fewer than trainer ranks + `n` GPUs are visible.
    """
    if device.type != "cuda":
        return [None] * n
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if (
        "LOCAL_WORLD_SIZE" not in os.environ
        and "WORLD_SIZE" in os.environ
        and os.environ["WORLD_SIZE"] != "1"
    ):
        raise ConfigError(
            "async_training.max_staleness >= 1 puts the rollout engines on the GPUs after this machine's trainer "
            "ranks, and the launcher did not say how many those are (LOCAL_WORLD_SIZE is unset); launch with "
            "torchrun or `dapo train trainer.nproc_per_node=N`, or set LOCAL_WORLD_SIZE"
        )
    local = max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), (device.index or 0) + 1)
    if local + n > len(gpus):
        raise ConfigError(
            f"async_training.max_staleness >= 1 puts the {n} rollout engine(s) (rollout.n_gpus_per_node={n}) on GPUs "
            f"of their own after this machine's {local} trainer rank(s), and {len(gpus)} GPU(s) are visible; lower "
            "trainer.nproc_per_node or rollout.n_gpus_per_node, make more GPUs visible (CUDA_VISIBLE_DEVICES), or "
            "set async_training.max_staleness=0"
        )
    return gpus[local : local + n]


def run(cfg: Config, resume: bool = False, log=print, command: list[str] | None = None) -> int:
    """`dapo train` on this process: join the launcher's job (or run alone), train, and return the exit code.

    Every rank returns the same code (0, 2, 3, 4 or 143); rank 0 prints the message, the others stay quiet unless
    the error is theirs alone (a bad configuration or data on one machine).

    SIGTERM before training has begun ends the process with a line that says so (nothing to save yet); once it
    has begun, SIGTERM stops the run after the step in progress with a checkpoint (`Trainer.fit`);
    rank 0 then names the checkpoint and the command that resumes (`resume_command`). Ctrl-C (SIGINT) does the
    same, with `EXIT_INTERRUPTED`; a second Ctrl-C (or one before training began) quits at once, naming the newest
    checkpoint and the command that resumes from it (`dapo_rl.stopping.CtrlC`); the teardown that follows ignores further presses
    and waits on nothing without a deadline. Under torchrun, which
    forwards SIGTERM to the ranks and kills them after its shutdown timeout (torchrun `--shutdown-timeout`, env
    `TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, default 30 s), that timeout must exceed a step's length.

    Args:
        command: the `dapo` arguments of this run (`train ...`), for the resume command in that message.

    Returns:
        0 done; `EXIT_CONFIG`; `EXIT_DYNAMIC_SAMPLING_EXHAUSTED`; `EXIT_TRAINING_DIVERGED`; `EXIT_TERMINATED`
        (143 = 128 + SIGTERM) stopped by SIGTERM after saving a checkpoint; `EXIT_INTERRUPTED` (130 = 128 +
        SIGINT) stopped by Ctrl-C, with a checkpoint (once) or at once (twice).
    """
    from dapo_rl.distributed import init_distributed, shutdown

    ctx = None
    trainer = None
    start = time.perf_counter()
    startup_handler = say_sigterm_at_startup()
    ctrl_c = CtrlC()

    def resume_hint() -> str:
        # several ranks without the trainer.nproc_per_node shorthand: the user's own torchrun
        return resume_command(
            command, ctx is not None and ctx.distributed and cfg.trainer.nproc_per_node == 1
        )

    try:
        ctx = init_distributed(cfg.trainer.device)
        trainer = Trainer(cfg, resume=resume, log=log, ctx=ctx)
        ctrl_c.trainer = trainer
        if ctx.is_main:
            print(f"dapo train: run directory {trainer.out}", flush=True)
        first_step = trainer.step  # > 0 after --resume
        trainer.fit()
        if ctx.is_main:
            warmup = trainer.warmup_seconds
            summary = closing_summary(
                trainer.out,
                trainer.metrics_path,
                latest_checkpoint(trainer.out),
                trainer.out / "training_dynamics.png",
                time.perf_counter() - start,
                trainer.step,
                warmup if warmup >= 1.0 else 0.0,
                resumed_at=first_step,
            )
            print(summary, flush=True)
        return 0
    except TrainingStopped as e:
        ctrl_c.closing = True
        if ctx.is_main:
            print(f"dapo train: {e}. To continue from it: {resume_hint()}", file=sys.stderr, flush=True)
        return e.exit_code
    except Interrupted as e:
        ctrl_c.closing = True
        if launched_rank() == 0:
            say_interrupted(e, None if trainer is None else (trainer.out, trainer.step), resume_hint())
        return EXIT_INTERRUPTED
    except (DynamicSamplingExhausted, TrainingDiverged) as e:
        if ctx is None or ctx.is_main:
            print(f"dapo train: stopped at step {trainer.step if trainer else 0}: {e}", file=sys.stderr)
        return (
            EXIT_DYNAMIC_SAMPLING_EXHAUSTED
            if isinstance(e, DynamicSamplingExhausted)
            else EXIT_TRAINING_DIVERGED
        )
    except (ConfigError, DataError) as e:
        prefix = f"[rank {ctx.rank}] " if ctx is not None and ctx.rank > 0 else ""
        print(f"{prefix}dapo: error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as e:
        if trainer is None or not trainer.stop_signal or not ctx.distributed:
            raise
        # the launcher stops the surviving ranks with SIGTERM when one died (one that quit on a second Ctrl-C,
        # say): the next collective fails here
        first = (str(e).strip().splitlines() or [""])[0][:200]
        name = signal.Signals(trainer.stop_signal).name
        print(
            f"[rank {ctx.rank}] dapo train: stopped by {name}; a collective failed before the step boundary, so no "
            f"checkpoint was written ({type(e).__name__}: {first})",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED if trainer.stop_signal == signal.SIGINT else EXIT_TERMINATED
    finally:
        ctrl_c.closing = True  # the teardown below waits on nothing without a deadline: let it finish
        if startup_handler is not None:
            signal.signal(signal.SIGTERM, startup_handler)
        # the producer, the reward pool and the engine (vLLM's teardown also ends torch.distributed's groups;
        # else: a hang at exit); a trainer that failed to start closed its own
        if trainer is not None:
            try:
                trainer.close()
            except Exception as e:  # the run's exit code stands
                print(f"dapo train: the rollout engine did not shut down cleanly ({e})", file=sys.stderr)
        if ctx is not None:
            shutdown(ctx)
        ctrl_c.restore()
