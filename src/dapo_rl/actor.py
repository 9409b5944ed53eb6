"""The actor: a transformers causal LM (FSDP2-sharded across ranks), its per-token log-probs and entropy, and the
DAPO policy update. The trainer talks to it only through `compute_log_prob`, `update`, `engine_weights`, `save` and
`load`."""

from __future__ import annotations

import contextlib
import inspect
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dapo_rl.algo import (
    entropy_from_logits,
    get_policy_loss,
    logprobs_from_logits,
    loss_hyperparameters,
    masked_mean,
)
from dapo_rl.algo.kl import kl_penalty
from dapo_rl.algo.policy_loss import agg_loss
from dapo_rl.algo.rollout_correction import (
    MismatchStats,
    compute_rollout_correction,
    off_policy_sequence_mask,
)
from dapo_rl.config import KL_WITH_LORA, ActorConfig, AlgorithmConfig, ConfigError
from dapo_rl.distributed import DistContext, all_gather_objects, all_reduce, barrier
from dapo_rl.distributed.balance import token_budget_bins
from dapo_rl.lora import hf_name, is_adapter_name, lora_layers, merged_layer_weights, wrap_model
from dapo_rl.models.hf import DTYPES, load_model
from dapo_rl.models.lm_head import fp32_head_names, lm_head_in_fp32
from dapo_rl.perf import choose_autocast_dtype
from dapo_rl.reference import ReferencePolicy

SHARED_PREFIX_MIN_SAVING = 0.1
"""`actor.shared_prefix` takes its two-pass forward for a micro-batch only when repeated prompts are at least this
share of the micro-batch's tokens."""


@dataclass
class TrainBatch:
    """What the actor consumes: B sequences (prompt + response), right-padded; under N ranks, this rank's share.

    Attributes:
        input_ids: `(B, L)` long, prompt then response then padding.
        attention_mask: `(B, L)` long, 1 on real tokens.
        prompt_lens: `(B,)` long, tokens of each prompt.
        response_mask: `(B, T)` float, 1 on response tokens that enter the loss (T = longest response): not past the
            response, not in a response that overlong filtering dropped, not a token the model did not sample.
        advantages: `(B,)` float.
        old_log_prob: `(B, T)` float log-probs of the behaviour policy, or None to take the current policy's
            (exactly on-policy: one epoch, one mini-batch).
        rollout_log_prob: `(B, T)` float log-probs the rollout engine sampled with (0 past each response), or None.
        minibatch: `(B,)` long, the optimizer step (mini-batch) each row belongs to, numbered from 0 on every rank.
        num_minibatches: optimizer steps per epoch (the same on every rank).
        rollout_is_weights: `(B, T)` float importance weights of the rollout correction, or None (set by
            `Actor.update`).
        stale: `(B,)` bool, rows sampled by an earlier policy (groups carried over by zero-waste dynamic
            sampling; asynchronous groups of an older version): their pi_old is the engine's recorded log-probs,
            not a recompute (with `algorithm.rollout_correction`: the recompute, and the correction's weights
            against the recorded log-probs). None: none.
        ref_log_prob: `(B, T)` float log-probs of the reference policy (`algorithm.use_kl_loss`; set by
            `Actor.update`), or None.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_lens: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    old_log_prob: torch.Tensor | None = None
    rollout_log_prob: torch.Tensor | None = None
    minibatch: torch.Tensor | None = None
    num_minibatches: int = 1
    rollout_is_weights: torch.Tensor | None = None
    stale: torch.Tensor | None = None
    ref_log_prob: torch.Tensor | None = None

    @staticmethod
    def build(
        prompts: list[list[int]],
        responses: list[list[int]],
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        pad_id: int,
        rollout_logprobs: list[list[float]] | None = None,
        minibatch: list[int] | None = None,
        stale: list[bool] | None = None,
        token_masks: list[list[int] | None] | None = None,
    ) -> TrainBatch:
        """Pack token lists; `loss_mask` `(B,)` zeroes whole responses (overlong filtering); `token_masks` (one per
        row, `len(responses[i])` 0/1 each, or None for all ones; `Rollout.loss_mask`) zeroes single tokens, those the
        model did not sample; `response_mask[i, t] = loss_mask[i] * token_masks[i][t]`. `minibatch` numbers the
        optimizer step of each row (default: all in one); `stale` flags rows sampled by an earlier policy.

        Raises:
            ValueError: a token mask whose length is not its response's."""
        lens = [len(p) + len(r) for p, r in zip(prompts, responses)]
        b, width, t = len(prompts), max(lens), max(max(len(r) for r in responses), 1)
        ids = torch.full((b, width), pad_id, dtype=torch.long)
        attn = torch.zeros((b, width), dtype=torch.long)
        resp_mask = torch.zeros((b, t), dtype=torch.float32)
        roll = None if rollout_logprobs is None else torch.zeros((b, t), dtype=torch.float32)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            ids[i, : lens[i]] = torch.tensor(p + r, dtype=torch.long)
            attn[i, : lens[i]] = 1
            resp_mask[i, : len(r)] = float(loss_mask[i])
            token_mask = None if token_masks is None else token_masks[i]
            if token_mask is not None:
                if len(token_mask) != len(r):
                    raise ValueError(
                        f"row {i}: a token mask of {len(token_mask)} for a response of {len(r)} tokens"
                    )
                resp_mask[i, : len(r)] *= torch.tensor(token_mask, dtype=torch.float32)
            if roll is not None:
                roll[i, : len(r)] = torch.tensor(rollout_logprobs[i][: len(r)], dtype=torch.float32)
        mb = (
            torch.zeros(b, dtype=torch.long)
            if minibatch is None
            else torch.tensor(minibatch, dtype=torch.long)
        )
        return TrainBatch(
            ids,
            attn,
            torch.tensor([len(p) for p in prompts]),
            resp_mask,
            advantages.float(),
            None,
            roll,
            mb,
            int(mb.max()) + 1 if b else 1,
            stale=None if stale is None else torch.tensor(stale, dtype=torch.bool),
        )

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, idx: torch.Tensor) -> TrainBatch:
        """Rows `idx`, with the padding both batches no longer need trimmed away."""
        attn = self.attention_mask[idx]
        width = int(attn.sum(1).max())
        resp_len = (attn.sum(1) - self.prompt_lens[idx]).max()
        t = max(int(resp_len), 1)

        def cut(x):
            return None if x is None else x[idx, :t]

        return TrainBatch(
            self.input_ids[idx, :width],
            attn[:, :width],
            self.prompt_lens[idx],
            self.response_mask[idx, :t],
            self.advantages[idx],
            cut(self.old_log_prob),
            cut(self.rollout_log_prob),
            None if self.minibatch is None else self.minibatch[idx],
            self.num_minibatches,
            cut(self.rollout_is_weights),
            None if self.stale is None else self.stale[idx],
            cut(self.ref_log_prob),
        )


class NonFiniteWeights(RuntimeError):
    """`Actor.save` refused to write weights holding NaN or inf."""


class Actor:
    """The policy: model, AdamW optimizer and warm-up-then-constant learning rate, on this rank's device, sharded
    with FSDP2 across the data-parallel ranks when there are several.

    Args:
        model_path: a local Hugging Face checkpoint directory (the trainer's `model.path`, or a checkpoint's
            `model/` on resume).
        cfg: `actor.*` settings.
        algo: `algorithm.*` settings (policy loss, clip ratios, loss aggregation).
        ctx: this rank: device and the data-parallel mesh (`dapo_rl.distributed.init_distributed`).
        dtype: parameter dtype (`model.dtype`).
        trust_remote_code: `model.trust_remote_code`.
        temperature: rollout temperature; log-probs are computed from logits / temperature so that they are
            those of the sampling distribution (verl does the same).
        attn_implementation: transformers' attention kernel (`model.attn_implementation` resolved by the trainer;
            None: transformers' default).
        load_weights: False: read only `model_path`'s config.json and leave the parameters uninitialised, for
            `load` to fill from a checkpoint's `dcp/` (the trainer's `--resume`: no rank reads the Hugging Face
            weights that DCP overwrites). The buffers outside the state dict (rotary `inv_freq`) are computed from
            the config as transformers' `_init_weights` does; a model with other such buffers is read as usual.
        config: a transformers config to build the model from instead of reading `model_path` (which is then
            only a label): no weights are read or broadcast; the parameters are transformers' random initialisation
            (one process) or whatever `Module.to_empty` leaves (FSDP2). For measuring memory (`dapo plan --measure`
            runs this under `FakeTensorMode`), never for training.
        seed: seed of the LoRA adapters' initialisation (`actor.lora`; the trainer passes `trainer.seed`).

    With `cfg.lora.rank > 0` the model gets PEFT's LoRA adapters (`dapo_rl.lora`) before it is sharded: the optimizer
    holds the adapters alone, `engine_weights` yields merged weights under the base model's names, and `save` /
    `load` checkpoint the adapters (and their optimizer state) instead of every weight; `load_weights` must be True
    (the frozen base is read from `model_path`, the base checkpoint).

    Raises:
        ConfigError: the weights cannot be loaded; LoRA without PEFT installed or with target modules the model
            does not have.
    """

    def __init__(
        self,
        model_path: str,
        cfg: ActorConfig,
        algo: AlgorithmConfig,
        ctx: DistContext | None = None,
        *,
        dtype: str = "float32",
        trust_remote_code: bool = False,
        temperature: float = 1.0,
        attn_implementation: str | None = None,
        load_weights: bool = True,
        config=None,
        seed: int = 0,
    ):
        self.cfg, self.algo = cfg, algo
        lora = cfg.lora if cfg.lora.rank > 0 else None
        # a LoRA checkpoint's dcp/ holds no base weight: the base is always read from model_path
        load_weights = load_weights or lora is not None
        self.peft = None
        """The `peft.PeftModel` around `self.model` under LoRA, else None."""
        self.ctx = ctx or DistContext()
        self.temperature = temperature if temperature > 0 else 1.0
        self.policy_loss = get_policy_loss(algo.policy_loss.loss_mode)
        # the loss's own hyperparameters (clip_cov_ratio, tau_pos, ...) from `algorithm.policy_loss`
        self.policy_loss_params = loss_hyperparameters(self.policy_loss, algo.policy_loss)
        # dtype of the Hugging Face export `save` writes (None: the parameters'); the trainer sets the engine's
        self.export_dtype: torch.dtype | None = None
        if cfg.autocast_dtype == "auto":  # the trainer resolves it first (and logs why); a direct caller here
            cfg = replace(cfg, autocast_dtype=choose_autocast_dtype("auto", self.ctx.device)[0])
            self.cfg = cfg
        bf16 = cfg.autocast_dtype == "bfloat16"
        # how this actor's model is sharded (and the KL term's reference alike)
        shard_args = (model_path, self.ctx, dtype, trust_remote_code, attn_implementation)
        compute_dtype = torch.bfloat16 if bf16 else None
        if self.ctx.sharded:
            model = load_sharded_model(
                *shard_args,
                compute_dtype=compute_dtype,
                lm_head_fp32=cfg.lm_head_fp32,
                gradient_checkpointing=cfg.gradient_checkpointing,
                load_weights=load_weights,
                config=config,
                lora=lora,
                lora_seed=seed,
            )
            if lora is not None:
                self.peft, model = model, model.get_base_model()
        else:
            model = None
            if config is not None and lora is not None:  # memory measurement of a LoRA actor
                with _real_meta():  # PEFT moves modules (`.to`), which fake parameters refuse in torch 2.13
                    model = model_from_config(config, dtype, trust_remote_code, attn_implementation)
                    self.peft = wrap_model(model, lora, seed, model_path)
                model.to_empty(device=self.ctx.device)
                model.tie_weights()
                _init_buffers(model)
            elif config is not None:  # no weights: memory measurement
                model = model_from_config(
                    config, dtype, trust_remote_code, attn_implementation, self.ctx.device
                )
            elif not load_weights and (
                resume := _resume_config(model_path, dtype, trust_remote_code, attn_implementation)
            ):  # `load` fills the parameters from DCP
                model = model_from_config(resume, dtype, trust_remote_code, attn_implementation)
                model.to_empty(device=self.ctx.device)
                model.tie_weights()  # to_empty gives each module its own tensor
                _init_buffers(model)
            if model is None:
                model = load_model(
                    model_path, dtype, trust_remote_code, attn_implementation=attn_implementation
                ).to(self.ctx.device)
            if cfg.gradient_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if lora is not None and self.peft is None:
                self.peft = wrap_model(model, lora, seed, model_path)
            if cfg.lm_head_fp32:
                lm_head_in_fp32(model)
        # One process autocasts; under FSDP2 the mixed-precision policy casts parameters for compute instead.
        self._autocast_dtype = torch.bfloat16 if bf16 and not self.ctx.sharded else None
        self.model = model
        attn = str(getattr(model.config, "_attn_implementation", "") or "")
        self.remove_padding = (
            cfg.use_remove_padding
            if cfg.use_remove_padding is not None
            else attn.startswith("flash_attention")
        )
        if cfg.shared_prefix and (self.remove_padding or cfg.gradient_checkpointing):
            raise ConfigError(
                "actor.shared_prefix=true needs the padded forward (actor.use_remove_padding=false) and no "
                "actor.gradient_checkpointing"
            )
        self.shared_prefix = (
            cfg.shared_prefix
            if cfg.shared_prefix is not None
            else not (self.remove_padding or cfg.gradient_checkpointing)
        )
        # transformers >= 5.24 names the cache argument `cache` (`past_key_values` warns, and goes in 5.40)
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        """The parameters the optimizer updates: all of them, or the LoRA adapters alone."""
        self.optimizer = torch.optim.AdamW(
            self.trainable, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        warm = max(cfg.lr_warmup_steps, 0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warm) if warm > 0 else 1.0
        )
        self.reference: ReferencePolicy | None = None
        """The KL term's frozen reference policy (`algorithm.use_kl_loss`), else None."""
        if algo.use_kl_loss:
            if self.peft is not None:
                raise ConfigError(KL_WITH_LORA)
            build = None
            if self.ctx.sharded:

                def build():  # the same sharding as the actor's; the weights come from it
                    return load_sharded_model(
                        *shard_args,
                        compute_dtype=compute_dtype,
                        lm_head_fp32=cfg.lm_head_fp32,
                        load_weights=False,
                        config=config,
                    )

            self.reference = ReferencePolicy(model, build)

    @property
    def device(self) -> torch.device:
        return self.ctx.device

    def _autocast(self):
        if self._autocast_dtype is not None:
            return torch.autocast(device_type=self.device.type, dtype=self._autocast_dtype)
        return contextlib.nullcontext()

    def forward(self, mb: TrainBatch, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs `(b, T)` float32 of the response tokens (and their entropy `(b, T)` when asked), on
        the actor's device; 0 past each response.

        Logits at position p predict token p+1, so response token t of row i (absolute position
        prompt_len_i + t) is scored by the logits at prompt_len_i + t - 1. Only those positions go through the
        LM head (`logits_to_keep`): with a 150k-token vocabulary the prompt's logits would cost as much as the
        rest of the forward. Padded (`attention_mask`) or packed into one row (`self.remove_padding`: sequences
        back to back, `position_ids` restarting at 0, no padding at all); both give the same values.
        """
        if self.shared_prefix:
            distinct, owner = self._distinct_prompts(mb)
            if self._prefix_pays(mb, distinct):
                return self._forward_shared_prefix(mb, with_entropy, distinct, owner)
        dev = self.device
        lens = mb.attention_mask.sum(1)
        t = mb.response_mask.shape[1]
        steps = torch.arange(t)
        if self.remove_padding:
            starts = torch.cumsum(lens, 0) - lens
            ids = torch.cat([mb.input_ids[i, : int(n)] for i, n in enumerate(lens)]).unsqueeze(0)
            positions = torch.cat([torch.arange(int(n)) for n in lens]).unsqueeze(0)
            # logits at row start + prompt_len - 1 + t, clamped inside each row (the clamped ones are masked)
            last = (starts + lens - 2).unsqueeze(1)
            pos = torch.minimum(starts.unsqueeze(1) + mb.prompt_lens.unsqueeze(1) - 1 + steps, last)
            keep = pos.flatten()
            with self._autocast():
                logits = self.model(
                    input_ids=ids.to(dev),
                    position_ids=positions.to(dev),
                    use_cache=False,
                    logits_to_keep=keep.to(dev),
                ).logits[0]
            resp_logits = logits.view(len(lens), t, -1).float() / self.temperature
            labels = ids[0, pos + 1]
        else:
            width = mb.input_ids.shape[1]
            pos = (mb.prompt_lens.unsqueeze(1) - 1 + steps).clamp(max=width - 2)
            first = int(pos.min()) if pos.numel() else 0
            keep = torch.arange(first, width - 1)
            with self._autocast():
                logits = self.model(
                    input_ids=mb.input_ids.to(dev),
                    attention_mask=mb.attention_mask.to(dev),
                    use_cache=False,
                    logits_to_keep=keep.to(dev),
                ).logits
            rel = (pos - first).to(dev)
            rows = torch.arange(len(lens), device=dev).unsqueeze(1)
            # advanced indexing, not `gather`: its backward keeps only the logits' size, where `gather`'s keeps the
            # whole (B, width, V) compute-dtype logits alive until backward (5.8 GiB at the 32B recipe)
            resp_logits = logits[rows, rel].float() / self.temperature
            labels = mb.input_ids.gather(1, pos + 1)
        del logits  # the compute-dtype logits are not needed any more (nothing saved them for the backward)
        labels = labels.to(dev)
        inside = (steps < (lens - mb.prompt_lens).unsqueeze(1)).to(dev)  # positions past a response hold 0
        logp = torch.where(inside, logprobs_from_logits(resp_logits, labels), 0.0)
        ent = chunked_entropy(resp_logits) if with_entropy else None
        return logp, ent

    @staticmethod
    def _distinct_prompts(mb: TrainBatch) -> tuple[dict[tuple[int, ...], int], torch.Tensor]:
        """The micro-batch's distinct prompts (token tuple -> number, in order of first appearance) and `(B,)` long:
        the number of each row's prompt."""
        distinct: dict[tuple[int, ...], int] = {}
        owner = [
            distinct.setdefault(tuple(mb.input_ids[i, :n].tolist()), len(distinct))
            for i, n in enumerate(mb.prompt_lens.tolist())
        ]
        return distinct, torch.tensor(owner, dtype=torch.long)

    def _prefix_pays(self, mb: TrainBatch, distinct: dict[tuple[int, ...], int]) -> bool:
        """Whether the shared-prefix forward saves enough here: repeated prompts hold at least
        :data:`SHARED_PREFIX_MIN_SAVING` of the micro-batch's tokens (with every prompt distinct its second pass is
        pure overhead). Under FSDP2 the ranks must run the same forward calls, so they agree (any rank that saves
        takes all ranks down the shared path, which is exact everywhere)."""
        saved = float(mb.prompt_lens.sum()) - sum(len(p) for p in distinct)
        pays = saved >= SHARED_PREFIX_MIN_SAVING * float(mb.attention_mask.sum())
        if self.ctx.distributed:
            pays = all_reduce([float(pays)], self.ctx, op="max")[0] > 0
        return pays

    def _forward_shared_prefix(
        self, mb: TrainBatch, with_entropy: bool, distinct: dict[tuple[int, ...], int], owner: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward` with each distinct prompt computed once (`actor.shared_prefix`; `distinct`, `owner` from
        `_distinct_prompts`).

        The U distinct prompts of the micro-batch go through the model left-padded, `(U, P)`, filling a
        `DynamicCache` whose keys and values keep their autograd graph; the cache is indexed out to the B rows
        (`batch_select_indices`) and the responses, `(B, T)` right-padded, run on top of it with their true
        positions (prompt_len + t). Response token 0 is scored by the prompt pass's last logits, token t > 0 by the
        response pass's position t - 1. The gradient reaching the prompt's activations is the sum over its rows,
        exactly what the full forward accumulates.
        """
        from transformers import DynamicCache

        dev = self.device
        lens = mb.attention_mask.sum(1)
        plens = mb.prompt_lens
        t = mb.response_mask.shape[1]
        steps = torch.arange(t)
        width = int(plens.max())
        p_ids = torch.zeros((len(distinct), width), dtype=torch.long)  # left padding: any id, masked
        p_mask = torch.zeros((len(distinct), width), dtype=torch.long)
        for prompt, u in distinct.items():
            p_ids[u, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            p_mask[u, width - len(prompt) :] = 1
        p_pos = (p_mask.cumsum(1) - 1).clamp(min=0)
        r_idx = (plens.unsqueeze(1) + steps).clamp(max=mb.input_ids.shape[1] - 1)
        r_ids = mb.input_ids.gather(1, r_idx)
        inside = steps < (lens - plens).unsqueeze(1)  # positions past a response hold 0
        mask = torch.cat([p_mask[owner], inside.long()], dim=1)
        cache = DynamicCache(config=self.model.config)
        with self._autocast():
            first = self.model(
                input_ids=p_ids.to(dev),
                attention_mask=p_mask.to(dev),
                position_ids=p_pos.to(dev),
                use_cache=True,
                **{self._cache_arg: cache},
                logits_to_keep=1,
            ).logits[:, -1]
            cache.batch_select_indices(owner.to(dev))
            rest = (
                self.model(
                    input_ids=r_ids.to(dev),
                    attention_mask=mask.to(dev),
                    position_ids=(plens.unsqueeze(1) + steps).to(dev),
                    use_cache=True,
                    **{self._cache_arg: cache},
                    logits_to_keep=torch.arange(t - 1, device=dev),
                ).logits
                if t > 1
                else first.new_zeros((len(owner), 0, first.shape[-1]))
            )
        resp_logits = torch.cat([first[owner.to(dev)].unsqueeze(1), rest], dim=1).float() / self.temperature
        logp = torch.where(inside.to(dev), logprobs_from_logits(resp_logits, r_ids.to(dev)), 0.0)
        ent = chunked_entropy(resp_logits) if with_entropy else None
        return logp, ent

    def micro_batches(
        self, batch: TrainBatch, rows: torch.Tensor, budget: int
    ) -> list[tuple[torch.Tensor, bool]]:
        """Split `rows` of `batch` into micro-batches: `(indices, dummy)` pairs.

        `actor.ppo_micro_batch_size` rows at a time, or with `actor.use_dynamic_bsz` by token budget
        (`dapo_rl.distributed.balance.token_budget_bins`; padded cost unless the forward is packed). Under FSDP2
        every rank must run the same number of forward passes, so the count is all-reduced (max); a rank with
        too few rows to split further runs `dummy` passes over one row whose loss is multiplied by 0.
        """
        if not self.cfg.use_dynamic_bsz:
            size = self.cfg.ppo_micro_batch_size
            return [(rows[s : s + size], False) for s in range(0, len(rows), size)]
        lengths = batch.attention_mask[rows].sum(1).tolist()
        bins = token_budget_bins(lengths, budget, padded=not self.remove_padding)
        want = int(all_reduce([float(len(bins))], self.ctx, op="max")[0])
        if want > len(bins):
            bins = token_budget_bins(lengths, budget, padded=not self.remove_padding, num_bins=want)
        out = [(rows[torch.tensor(b, dtype=torch.long)], False) for b in bins]
        while len(out) < want and len(rows):
            out.append((rows[:1], True))
        return out

    @torch.no_grad()
    def compute_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        """Log-probs `(B, T)` float32 (on the CPU) of the current policy for every response token of this rank's
        batch, without gradients, in `actor.ppo_micro_batch_size` chunks (or `log_prob_max_token_len_per_gpu`
        tokens with `use_dynamic_bsz`). Under FSDP2 every rank must call it (the trainer's split guarantees it).
        In eval mode (no dropout: pi_old is deterministic, as verl's `compute_log_prob`); `update` sets train mode."""
        self.model.eval()
        out = torch.zeros_like(batch.response_mask)
        for idx, _dummy in self.micro_batches(
            batch, torch.arange(len(batch)), self.cfg.log_prob_max_token_len_per_gpu
        ):
            logp, _ = self.forward(batch.slice(idx))
            out[idx, : logp.shape[1]] = logp.cpu()
        return out

    def update(self, batch: TrainBatch, clip_ratio: tuple[float, float] | None = None) -> dict:
        """One DAPO policy update over this rank's share of a training batch (paper Eq. 8-12; verl's
        `update_policy`).

        Rows carry their mini-batch number (`batch.minibatch`); each mini-batch is one optimizer step, for
        `actor.ppo_epochs` passes, accumulated over `actor.ppo_micro_batch_size`-row micro-batches. Each mini-batch's
        loss is normalised by its *global* token count (token-mean, Eq. 12) or sequence count (seq-mean modes),
        all-reduced over the ranks, and scaled by the world size because FSDP2 averages gradients over ranks: the
        gradient equals the one-process gradient of the whole mini-batch whatever the split over ranks and micro-
        batches (verl PR#906 and TRL#5619 were bugs here). With exactly one mini-batch and one epoch the update is
        on-policy and the old log-probs are the current ones (ratio 1), which saves a forward pass; otherwise they
        are recomputed first, or taken from the engine (`algorithm.rollout_correction.bypass_mode`).

        Rollout correction (`algorithm.rollout_correction`, `dapo_rl.algo.rollout_correction`): with `rollout_is` or
        `rollout_rs` the old log-probs are always recomputed, the IS weights multiply each token's loss and rejected
        tokens leave the loss and its token count. Whenever the batch carries the engine's log-probs, the
        `rollout_corr/*` mismatch metrics are returned (pi_train = the old log-probs, or pi_theta during the first
        epoch where there are none to compare).

        Args:
            batch: this rank's rows; every rank has the same number of rows in each mini-batch.
            clip_ratio: `(clip_ratio_low, clip_ratio_high)` of this update (Eq. 10's epsilon_low, epsilon_high: the
                current CAMPO stage's, `dapo_rl.campo`); None: `algorithm.clip_ratio_low/high`.

        Returns:
            Metrics over all ranks: `actor/pg_loss`, `actor/pg_clipfrac_lower|upper|dual`, `actor/ppo_kl`,
            `actor/entropy` (token means), `actor/grad_norm` (mean over the optimizer steps taken), `actor/lr`,
            `actor/num_skipped_steps` (steps with a non-finite gradient norm: skipped on every rank alike),
            `rollout_corr/*` (see `MismatchStats`), `time/old_log_prob_s` (the recompute forward; 0 when skipped).

        Raises:
            ValueError: `bypass_mode`, `rollout_is` or `rollout_rs` without the batch's rollout log-probs.
        """
        cfg = self.cfg
        algo = self.algo
        if clip_ratio is not None:
            algo = replace(algo, clip_ratio_low=clip_ratio[0], clip_ratio_high=clip_ratio[1])
        rc = algo.rollout_correction
        world = self.ctx.world_size
        n_minis = batch.num_minibatches
        on_policy = n_minis == 1 and cfg.ppo_epochs == 1
        mu = batch.rollout_log_prob
        correct = bool(rc.rollout_is or rc.rollout_rs)
        if (rc.bypass_mode or correct) and mu is None:
            raise ValueError(
                "algorithm.rollout_correction needs the engine's sampling log-probs, and the batch has none"
            )
        stale = (
            batch.stale
        )  # set on every rank when the step's batch holds carried rows (the recompute is collective)
        if stale is not None and mu is None:
            raise ValueError("rows carried from an earlier step need the engine's sampling log-probs")
        t_old = 0.0
        if rc.bypass_mode:
            batch.old_log_prob = mu
        elif (correct or not on_policy or stale is not None) and batch.old_log_prob is None:
            t0 = time.perf_counter()
            batch.old_log_prob = self.compute_log_prob(batch)
            t_old = time.perf_counter() - t0
        recomputed = batch.old_log_prob  # the current policy's (or None on-policy, or mu in bypass mode)
        ref_reset = self._reference_log_prob(batch, algo)
        if stale is not None and not rc.bypass_mode and not correct:
            # pi_old of a row an earlier policy sampled (a carried group, an asynchronous one): that policy, mu.
            # With rollout correction pi_old stays the recomputed current policy and the IS weights / rejection
            # pi_old / mu below correct for the gap (AReaL's decoupled objective)
            batch.old_log_prob = torch.where(stale[:, None], mu, batch.old_log_prob)
        mismatch = MismatchStats()
        if correct:
            weights, kept = compute_rollout_correction(
                batch.old_log_prob,
                mu,
                batch.response_mask,
                rollout_is=rc.rollout_is,
                rollout_is_threshold=rc.rollout_is_threshold,
                rollout_rs=rc.rollout_rs,
                rollout_rs_threshold=rc.rollout_rs_threshold,
                rollout_rs_threshold_lower=rc.rollout_rs_threshold_lower,
            )
            mismatch.add(batch.old_log_prob, mu, batch.response_mask, weights, kept)
            batch.response_mask, batch.rollout_is_weights = kept, weights
        elif mu is not None and recomputed is not None and recomputed is not mu:
            # against the recompute on every row: on stale rows the gap then shows the policy's lag too (their
            # pi_old is mu, which would read as perfect agreement)
            mismatch.add(recomputed, mu, batch.response_mask)
        track_in_loop = mu is not None and not mismatch.sums
        minibatch = (
            batch.minibatch if batch.minibatch is not None else torch.zeros(len(batch), dtype=torch.long)
        )
        rows_of = [torch.nonzero(minibatch == m).flatten() for m in range(n_minis)]
        # global (all-rank) token and sequence counts of every mini-batch: the loss denominators
        local = [float(batch.response_mask[r].sum()) for r in rows_of] + [float(len(r)) for r in rows_of]
        totals = all_reduce(local, self.ctx)
        mb_tokens, mb_seqs = totals[:n_minis], totals[n_minis:]
        self.model.train()
        sums: dict[str, float] = {}
        tok_total = 0.0
        grad_norms, skipped = [], 0
        for epoch in range(cfg.ppo_epochs):
            for m, rows in enumerate(rows_of):
                n_tok, n_seq = max(mb_tokens[m], 1.0), max(mb_seqs[m], 1.0)
                self.optimizer.zero_grad(set_to_none=True)
                for idx, dummy in self.micro_batches(batch, rows, cfg.ppo_max_token_len_per_gpu):
                    micro = batch.slice(idx)
                    logp, ent = self.forward(micro, with_entropy=True)
                    dev = logp.device
                    mask = micro.response_mask.to(dev) * (0.0 if dummy else 1.0)
                    old = (
                        logp.detach() if micro.old_log_prob is None else micro.old_log_prob.to(dev)
                    )  # None only on-policy
                    if track_in_loop and epoch == 0:  # pi_train = pi_theta: no old log-probs to compare
                        mismatch.add(logp.detach(), micro.rollout_log_prob.to(dev), mask)
                    loss_mask = mask
                    if rc.off_policy_mask_threshold is not None:  # against the current pi_theta, each step
                        sampler = old if micro.rollout_log_prob is None else micro.rollout_log_prob.to(dev)
                        loss_mask = mask * off_policy_sequence_mask(
                            logp, sampler, micro.advantages.to(dev), mask, rc.off_policy_mask_threshold
                        )
                    extra = {}
                    if micro.rollout_is_weights is not None:
                        extra["rollout_is_weights"] = micro.rollout_is_weights.to(dev)
                    if algo.loss_agg_mode == "seq-mean-token-sum-norm":  # only then: registered losses
                        extra["loss_scale_factor"] = algo.loss_scale_factor  # keep their signature
                    loss, stats = self.policy_loss(
                        logp,
                        old,
                        micro.advantages.to(dev),
                        loss_mask,
                        clip_ratio_low=algo.clip_ratio_low,
                        clip_ratio_high=algo.clip_ratio_high,
                        clip_ratio_c=algo.clip_ratio_c,
                        loss_agg_mode=algo.loss_agg_mode,
                        global_num_tokens=n_tok,
                        global_batch_size=n_seq,
                        **extra,
                        **self.policy_loss_params,
                    )
                    total = loss
                    if micro.ref_log_prob is not None:  # the KL term to the reference (ProRL; verl's kl_loss)
                        kl = kl_penalty(logp, micro.ref_log_prob.to(dev), algo.kl_loss_type)
                        kl_loss = agg_loss(
                            kl, mask, algo.loss_agg_mode, n_tok, n_seq, extra.get("loss_scale_factor")
                        )
                        total = loss + algo.kl_loss_coef * kl_loss
                    (total * world).backward()  # FSDP2 averages gradients over the ranks
                    ntok = float(mask.sum())
                    tok_total += ntok
                    stats = dict(stats)
                    if loss_mask is not mask:
                        stats["opsm_masked_fraction"] = 1.0 - float(loss_mask.sum()) / max(ntok, 1.0)
                    stats["entropy"] = float(masked_mean(ent, mask)) if ntok > 0 else 0.0
                    stats["pg_loss"] = loss.item() * n_tok / max(ntok, 1.0)
                    if micro.ref_log_prob is not None:
                        stats["kl_loss"] = kl_loss.item() * n_tok / max(ntok, 1.0)
                    for k, v in stats.items():
                        if k != "num_tokens":
                            sums[k] = sums.get(k, 0.0) + float(v) * ntok
                norm = torch.nn.utils.clip_grad_norm_(self.trainable, cfg.grad_clip)
                if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2: the global norm
                    norm = norm.full_tensor()
                if torch.isfinite(norm):
                    self.optimizer.step()
                    grad_norms.append(float(norm))
                else:
                    skipped += 1
                    self.optimizer.zero_grad(set_to_none=True)
        # the gradients would otherwise stay allocated through the rollout, where vLLM wants the memory
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.optimizer.param_groups[0]["lr"]  # the rate these updates used
        self.scheduler.step()
        keys = sorted(sums)
        reduced = all_reduce([sums[k] for k in keys] + [tok_total], self.ctx)
        tok_all = max(reduced[-1], 1.0)
        out = {f"actor/{k}": v / tok_all for k, v in zip(keys, reduced)}
        out["actor/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        out["actor/lr"] = lr
        out["actor/num_skipped_steps"] = skipped
        out.update(
            mismatch.result(
                lambda v: all_reduce(v, self.ctx),
                lambda v: all_reduce(v, self.ctx, op="max"),
            )
            if mu is not None
            else {}
        )
        out["time/old_log_prob_s"] = t_old
        if self.reference is not None:
            out["actor/kl_coef"] = algo.kl_loss_coef
            out["actor/ref_reset"] = ref_reset
            out["time/ref_log_prob_s"] = self._ref_time
        return out

    def _reference_log_prob(self, batch: TrainBatch, algo: AlgorithmConfig) -> float:
        """With a reference policy: reset it to the current policy (and clear the optimizer's state) when
        `algorithm.ref_reset_freq` updates have passed since the last reset (ProRL, arXiv 2505.24864 Sec. 3.2), then
        set `batch.ref_log_prob` from a forward of the reference. Returns 1.0 when it reset, else 0.0."""
        if self.reference is None:
            return 0.0
        done = self.scheduler.last_epoch  # updates so far (restored with the checkpoint)
        reset = algo.ref_reset_freq > 0 and done > 0 and done % algo.ref_reset_freq == 0
        if reset:
            self.reference.reset_from(self.model)
            self.optimizer.state.clear()  # AdamW's moments and step count start again
        saved = self.model
        self.model = self.reference.model
        t0 = time.perf_counter()
        try:
            batch.ref_log_prob = self.compute_log_prob(batch)
        finally:
            self.model = saved
            if self.ctx.sharded:
                # FSDP2 leaves the root's parameters (embeddings, final norm, an untied LM head) unsharded after a
                # forward with no backward: free them now, not when the reference next runs (verl reshards too)
                self.reference.model.reshard()
        self._ref_time = time.perf_counter() - t0
        return float(reset)

    # ------------------------------------------------------------------------------------- weights and state
    def engine_weights(
        self, dtype: torch.dtype | None = None, keep_fp32_head: bool = False
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """`(Hugging Face name, full tensor)` pairs of the model's state dict, one tensor at a time, for a rollout
        engine.

        Under FSDP2 each parameter is all-gathered (`DTensor.full_tensor()`) only when its turn comes, so no rank
        ever holds the whole unsharded model twice; every rank must consume the iterator to the end (it is a
        collective). Tied weights come under both names (vLLM's in-place reload needs `lm_head.weight` too) but are
        gathered once; ties are found by parameter identity (`named_parameters(remove_duplicate=False)`), the same
        on every rank whatever its local shard holds.

        Under LoRA the engine never sees adapters: each adapted layer's weight comes merged, W + alpha/r B A, under
        the base model's name (`dapo_rl.lora.merged_layer_weights`), after every other weight; so an engine built
        from the base checkpoint samples from the adapted policy.

        Args:
            dtype: cast each local shard to this dtype before the gather (`torch.bfloat16` for an engine that
                samples in bf16: half the all-gather traffic, and the engine would round to it anyway); None keeps
                the parameters' dtype.
            keep_fp32_head: an untied float32 head (`actor.lm_head_fp32`) stays float32 whatever `dtype` says: for
                the `hf` engine, which keeps its head's weights in float32 (vLLM keeps them in its dtype and would
                round them on copy; exports stay in one dtype).
        """
        from collections import Counter

        with torch.no_grad():
            state = self.model.state_dict()
            keep = fp32_head_names(self.model) if keep_fp32_head else set()
            owner = {n: id(p) for n, p in self.model.named_parameters(remove_duplicate=False)}
            shared = {k for k, c in Counter(owner.values()).items() if c > 1}
            cache: dict[int, torch.Tensor] = {}
            plain, merged = self._push_names(state)
            for name, hf in plain:
                t = state[name]
                key = owner.get(name)  # None: a buffer
                full = cache.get(key) if key is not None else None
                if full is None:
                    if dtype is not None and t.is_floating_point() and name not in keep:
                        t = t.to(dtype)  # on a DTensor: each rank casts its own shard
                    full = (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()
                    if key in shared:
                        cache[key] = full
                yield hf, full
        if merged:
            yield from merged_layer_weights(self.model, dtype, sharded=self.ctx.sharded)

    def _push_names(self, state: dict) -> tuple[list[tuple[str, str]], list[str]]:
        """What `engine_weights` yields, by name: `(state-dict name, Hugging Face name)` of the weights pushed as
        they are, in `state`'s order, and the Hugging Face names of the merged ones that follow (under LoRA: each
        adapted layer's `...q_proj.weight`, in place of its `base_layer` weight and its adapters; none without)."""
        if self.peft is None:
            return [(n, n) for n in state], []
        layers = list(lora_layers(self.model))
        replaced = {f"{n}.base_layer.weight" for n in layers}
        plain = [(n, hf_name(n)) for n in state if n not in replaced and not is_adapter_name(n)]
        return plain, [f"{n}.weight" for n in layers]

    def engine_weight_names(self) -> list[str]:
        """The Hugging Face names `engine_weights` yields, in its order, without gathering anything (for the
        engine's name check before the first push)."""
        plain, merged = self._push_names(self.model.state_dict())
        return [hf for _, hf in plain] + merged

    def engine_adapters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Under LoRA: `(PEFT file name, full float32 tensor)` of every adapter, one at a time, for an engine that
        holds the base model and applies the adapters unmerged (`actor.lora.merge=false`;
        `dapo_rl.lora.adapter_weights`). Only the adapters travel (r x (in + out) per adapted layer, not the model),
        in float32: the engine casts them to its own dtype, as the actor's autocast does. A collective under FSDP2.

        Raises:
            ValueError: the actor has no adapters.
        """
        if self.peft is None:
            raise ValueError("engine_adapters: the actor has no LoRA adapters (actor.lora.rank=0)")
        from dapo_rl.lora import adapter_weights

        return adapter_weights(self.peft)

    def engine_adapter_names(self) -> list[str]:
        """The names `engine_adapters` yields, in its order, without gathering anything."""
        from dapo_rl.lora import saved_name

        return [saved_name(n) for n, _ in self.peft.named_parameters() if is_adapter_name(n)]

    def nonfinite_parameters(self) -> list[str]:
        """Names of parameters holding NaN or inf on any rank (the same list on every rank)."""
        local = [n for n, p in self.model.named_parameters() if not torch.isfinite(_local(p)).all()]
        return sorted({n for names in all_gather_objects(local, self.ctx) for n in names})

    def save(self, path: str | os.PathLike, export_model: bool = True) -> None:
        """Write the actor's state under `path` (a collective: every rank calls it).

        - `model/` (with `export_model`, and always without LoRA): the full weights as a Hugging Face checkpoint
          (safetensors, written by rank 0 after the collective save), so that `from_pretrained` and vLLM load it;
          in `export_dtype` (bf16 under bf16 compute, what vLLM samples with: half the size of fp32); under LoRA
          the merged weights (`engine_weights`);
        - `dcp/`: model, optimizer and scheduler as a `torch.distributed.checkpoint`, every rank writing its
          shards; reshardable, so a run saved at N ranks loads at M. Under LoRA the adapters and their optimizer
          state only (the frozen base is the base checkpoint's);
        - `adapter/` (LoRA): the adapters in PEFT's format (`adapter_config.json`, `adapter_model.safetensors`),
          which `peft.PeftModel.from_pretrained(base, path / "adapter")` loads.

        Raises:
            NonFiniteWeights: a parameter holds NaN or inf (nothing is written).
        """
        import torch.distributed.checkpoint as dcp

        bad = self.nonfinite_parameters()
        if bad:
            raise NonFiniteWeights(f"non-finite weights in {', '.join(bad[:3])}")
        path = Path(path)
        export_model = export_model or self.peft is None
        full: dict[str, torch.Tensor] = {}
        if export_model:
            tied = self._tied_names()
            # a collective under FSDP2: every rank gathers
            for name, t in self.engine_weights(self.export_dtype):
                if self.ctx.is_main:
                    full[name] = full[tied[name]] if name in tied else t.cpu()
        adapter: dict[str, torch.Tensor] = {}
        if self.peft is not None:
            from dapo_rl.lora import adapter_state

            for name, t in adapter_state(self.peft):  # a collective under FSDP2
                if self.ctx.is_main:
                    adapter[name] = t.cpu()
        fresh = not self.optimizer.state  # a reference reset just cleared AdamW's state
        with _single_process_dcp(self.ctx):
            dcp.save(self._dcp_state(), checkpoint_id=str(path / "dcp"), no_dist=not self.ctx.sharded)
        if (
            fresh
        ):  # torch's get_state_dict filled it with a zero-lr step: the next real step must start afresh
            self.optimizer.state.clear()
        # rank 0 writes the export after the collective save: the other ranks wait at the caller's barrier on the
        # CPU group (long timeout), not inside a GPU collective
        if self.ctx.is_main and export_model:
            (path / "model").mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(path / "model", state_dict=full, safe_serialization=True)
            # config.json says what the tensors hold, not the fp32 master's dtype
            if self.export_dtype is not None:
                _set_config_dtype(path / "model" / "config.json", self.export_dtype)
        if self.ctx.is_main and self.peft is not None:
            self.peft.save_pretrained(path / "adapter", state_dict=adapter, safe_serialization=True)
        del full, adapter

    def _tied_names(self) -> dict[str, str]:
        """`{name: first name}` for every parameter name after the first of a tied group (found by identity)."""
        first: dict[int, str] = {}
        out = {}
        for n, p in self.model.named_parameters(remove_duplicate=False):
            if id(p) in first:
                out[n] = first[id(p)]
            else:
                first[id(p)] = n
        return out

    def load(self, path: str | os.PathLike) -> None:
        """Restore model, optimizer and scheduler from `save`'s `dcp/` (at any world size; a collective).

        Raises:
            ConfigError: `path` holds no `dcp/` directory (a checkpoint of an older dapo-rl).
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        path = Path(path)
        if not (path / "dcp").is_dir():
            raise ConfigError(
                f"{path}: no dcp/ directory; this checkpoint was written by an older dapo-rl and cannot be resumed "
                f"(its {path / 'model'} still loads as a model: start a new run with model.path set to it)"
            )
        state = self._dcp_state()
        if "ref" in state and not any(
            k.startswith("ref.")
            for k in dcp.FileSystemReader(str(path / "dcp")).read_metadata().state_dict_metadata
        ):
            raise ConfigError(
                f"{path}: algorithm.use_kl_loss=true, and this checkpoint was written without a reference policy; "
                "resume it with the KL term off, or start a new run from its model/"
            )
        with _single_process_dcp(self.ctx):
            dcp.load(state, checkpoint_id=str(path / "dcp"), no_dist=not self.ctx.sharded)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=self._state_dict_options(),
        )
        self.scheduler.load_state_dict(state["scheduler"])
        if self.reference is not None:
            from torch.distributed.checkpoint.state_dict import set_model_state_dict

            set_model_state_dict(self.reference.model, state["ref"])

    def _state_dict_options(self):
        """Loading a LoRA checkpoint, which holds the adapters only (`_dcp_state`), leaves the frozen base as it is
        (`dcp.load` has already failed on any adapter the checkpoint lacks)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(strict=self.peft is None)

    def _dcp_state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self._state_dict_options())
        if self.peft is not None:
            # the adapters only: every frozen weight leaves, under each of its names (torch's
            # `ignore_frozen_params` drops it under its first name only, and would keep a tied LM head: the whole
            # vocabulary matrix in every LoRA checkpoint, 113 MB at SmolLM2-135M)
            frozen = {
                n for n, p in self.model.named_parameters(remove_duplicate=False) if not p.requires_grad
            }
            model_sd = {k: v for k, v in model_sd.items() if k not in frozen}
        state = {"model": model_sd, "optim": optim_sd, "scheduler": self.scheduler.state_dict()}
        if self.reference is not None:  # after a reset it is not the initial model any more
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            state["ref"] = get_model_state_dict(self.reference.model)
        return state


ENTROPY_CHUNK_TOKENS = 1024
"""Positions whose full-vocabulary entropy is computed at once: the temporaries (log-softmax, its exp, their product)
are 3 x this x vocabulary fp32 values (1.7 GiB at Qwen2.5's 152k vocabulary) instead of 3 x every response
position of the micro-batch (verl: `entropy_from_logits_with_chunking`, 2048)."""


@torch.no_grad()
def chunked_entropy(logits: torch.Tensor, chunk: int = ENTROPY_CHUNK_TOKENS) -> torch.Tensor:
    """`entropy_from_logits` over `(..., V)` logits, `chunk` positions at a time, without gradient (the entropy is
    a metric: DAPO has no entropy bonus).

    Returns:
        `(...)` entropy in nats, dtype of `logits`.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=logits.dtype, device=logits.device)
    for s in range(0, flat.shape[0], chunk):
        out[s : s + chunk] = entropy_from_logits(flat[s : s + chunk])
    return out.view(logits.shape[:-1])


def load_sharded_model(
    path: str,
    ctx: DistContext,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    *,
    compute_dtype: torch.dtype | None = None,
    lm_head_fp32: bool = False,
    gradient_checkpointing: bool = False,
    load_weights: bool = True,
    config=None,
    lora=None,
    lora_seed: int = 0,
):
    """A checkpoint's causal LM, FSDP2-sharded over `ctx.mesh`, without any rank holding the whole model on its
    device: every rank builds the model on the `meta` device (no memory), shards it (`fully_shard`), allocates its
    own shards (`to_empty`), and rank 0, the only one that reads the checkpoint (into host memory), broadcasts
    each parameter while every rank keeps its slice (`set_model_state_dict(..., full_state_dict=True,
    broadcast_from_rank0=True)`, as verl's `fsdp2_load_full_state_dict`). Buffers outside the state dict (rotary
    `inv_freq`) are broadcast from rank 0 too. A collective: every rank calls it.

    Args:
        path: local Hugging Face checkpoint directory.
        ctx: this rank (its `mesh` and `device`).
        dtype: parameter dtype (`model.dtype`).
        trust_remote_code: `model.trust_remote_code`.
        attn_implementation: transformers' attention kernel, or None.
        compute_dtype: FSDP2 mixed-precision compute dtype (`dapo_rl.distributed.fsdp.shard_model`).
        lm_head_fp32: the LM head in float32 (`actor.lm_head_fp32`, `dapo_rl.models.lm_head`), set before sharding.
        gradient_checkpointing: enable transformers' non-reentrant activation checkpointing.
        load_weights: False: no rank reads the weights, only the config; the shards are left uninitialised for
            `Actor.load` to fill from DCP (resume), the rotary buffers computed from the config (`_init_buffers`).
        config: build from this transformers config instead: no checkpoint is read and nothing is broadcast, the
            shards hold whatever `to_empty` leaves (`Actor(config=...)`: memory measurement only).
        lora: `actor.lora` (rank > 0) to add PEFT's adapters before sharding (rank 0's copy gets the same adapters,
            initialised from `lora_seed`, and broadcasts them with the base weights), or None.

    Returns:
        The sharded model; under `lora`, the `peft.PeftModel` around it.

    Raises:
        ConfigError: the checkpoint cannot be read (on any rank: the error reaches every rank).
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoConfig

    from dapo_rl.distributed.fsdp import shard_model

    weights = config is None
    full, failure = None, None
    resumed = False
    if weights and not load_weights:  # resume: DCP fills the shards; read weights only if a buffer needs them
        config = _resume_config(path, dtype, trust_remote_code, attn_implementation)
        resumed = all(all_gather_objects(config is not None, ctx))
        weights = not resumed
    try:
        if weights and ctx.is_main:
            full = load_model(path, dtype, trust_remote_code, attn_implementation=attn_implementation)
            config = full.config
        elif weights:
            config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:  # reported on every rank below, never left for the others to wait on
        failure = e
    # the other ranks wait while rank 0 reads the whole checkpoint: on the long-timeout gloo group
    if weights:
        barrier(ctx, checkpoint=True)
    if weights and any(all_gather_objects(failure is not None, ctx)):
        raise (
            failure
            if isinstance(failure, ConfigError)
            else ConfigError(
                f"model.path={path}: cannot load a causal LM from it ({failure or 'failed on another rank'})"
            )
        )
    wrapped = None
    with _real_meta() if lora is not None else contextlib.nullcontext():
        model = model_from_config(config, dtype, trust_remote_code, attn_implementation)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora is not None:
            wrapped = wrap_model(model, lora, lora_seed, path)
    if lora is not None and full is not None:
        wrap_model(full, lora, lora_seed, path)
    if lm_head_fp32:
        lm_head_in_fp32(model)
    shard_model(model, ctx.mesh, compute_dtype, lm_head_fp32=lm_head_fp32)
    model.to_empty(device=ctx.device)
    if resumed:
        _init_buffers(model)
    if not weights:
        return wrapped or model
    state = full.state_dict() if full is not None else {}
    set_model_state_dict(
        model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    source = dict(full.named_buffers()) if full is not None else {}
    for name, buf in model.named_buffers():
        if ctx.is_main:
            buf.copy_(source[name].to(buf.device))
        dist.broadcast(buf, src=0)
    del full, state, source
    return wrapped or model


def _real_meta():
    """Outside any `FakeTensorMode` (`dapo plan --measure` runs the actor under one): a model built on `meta` is then
    a real meta model that PEFT can wrap (it moves modules with `.to`, which fake parameters refuse in torch 2.13,
    pytorch/pytorch#170781); `to_empty` inside the fake mode then makes its parameters fake. Elsewhere a no-op."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def _buffers_computable(model) -> bool:
    """Whether every buffer of `model` outside its state dict is a rotary embedding's, which `_init_buffers`
    computes from the config (transformers' own `_init_weights` branch for "RotaryEmbedding" modules)."""
    return all(
        "RotaryEmbedding" in type(m).__name__ and hasattr(m, "original_inv_freq")
        for m in model.modules()
        if m._non_persistent_buffers_set
    )


@torch.no_grad()
def _init_buffers(model) -> None:
    """Fill the rotary buffers of a model built on `meta` and allocated with `to_empty` (their values are not in
    any state dict, so neither `from_pretrained` nor DCP brings them), with transformers' `_init_weights`."""
    for m in model.modules():
        if m._non_persistent_buffers_set:
            model._init_weights(m)


def _resume_config(path: str, dtype: str, trust_remote_code: bool, attn_implementation: str | None):
    """`path`'s transformers config when its model can be built without reading the weights (every buffer outside
    the state dict computable by `_init_buffers`); None otherwise, or when the config cannot be read (the caller
    then reads the checkpoint as on a first start, which reports the error)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        meta = model_from_config(config, dtype, trust_remote_code, attn_implementation)
    except Exception:
        return None
    return config if _buffers_computable(meta) else None


def model_from_config(
    config,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    device: torch.device | str = "meta",
):
    """The causal LM of a transformers `config`, parameters in `dtype` (`model.dtype`), built on `device`: on `meta`
    shapes only, no memory and no values (`Module.to_empty(device=...)` allocates them, uninitialised); elsewhere
    with transformers' random initialisation.

    Raises:
        ValueError: transformers cannot build a causal LM from `config`, or the attention kernel is unknown.
    """
    from transformers import AutoModelForCausalLM

    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    with torch.device(device):
        return AutoModelForCausalLM.from_config(
            config, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code, **kwargs
        )


def _set_config_dtype(config_json: Path, dtype: torch.dtype) -> None:
    """Rewrite the `dtype` of a saved config.json (transformers writes the model's, the fp32 master weights')."""
    import json

    config = json.loads(config_json.read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    config_json.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def _single_process_dcp(ctx: DistContext):
    """torch.distributed.checkpoint warns on every call without a process group, although `no_dist=True` says that
    one process is meant; one process is the ordinary case here, so that warning is silenced (and only it)."""
    with warnings.catch_warnings():
        if not ctx.sharded:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p
