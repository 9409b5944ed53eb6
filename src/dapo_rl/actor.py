"""The actor: a transformers causal LM, its per-token log-probs and entropy, and the DAPO policy update."""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass

import torch

from dapo_rl.algo import compute_policy_loss, entropy_from_logits, logprobs_from_logits, masked_mean
from dapo_rl.config import ActorConfig, AlgorithmConfig, ConfigError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_tokenizer(path: str, trust_remote_code: bool = False, setting: str = "model.path"):
    """Load and check the tokenizer of a local Hugging Face checkpoint, without its weights (cheap, so every
    checkpoint problem is reported before any heavy work).

    Args:
        path: checkpoint directory (config.json, weights, tokenizer files).
        trust_remote_code: allow code shipped with the checkpoint.
        setting: how error messages name the path (`model.path`, or `--model` for `dapo eval`).

    Returns:
        The tokenizer; its pad token falls back to eos when missing.

    Raises:
        ConfigError: the path does not exist or is not a Hugging Face checkpoint, or the tokenizer cannot be loaded
            or has no eos token.
    """
    from transformers import AutoTokenizer

    if not os.path.isdir(path):
        raise ConfigError(f"{setting}={path}: no such directory (give a local Hugging Face checkpoint)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(f"{setting}={path}: no config.json, so not a Hugging Face checkpoint directory")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{setting}={path}: cannot load a tokenizer from it ({e})") from e
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"{setting}={path}: the tokenizer has no eos token, so responses could never stop")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def model_context_length(path: str, trust_remote_code: bool = False) -> int | None:
    """The model's context in tokens (`max_position_embeddings` of its config.json), read without the weights;
    `None` when the config does not say.

    Raises:
        ConfigError: the config cannot be read.
    """
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.path={path}: cannot read its config.json ({e})") from e
    return getattr(config, "max_position_embeddings", None)


def load_model(
    path: str, dtype: str = "float32", trust_remote_code: bool = False, setting: str = "model.path"
):
    """Load the causal LM of a local Hugging Face checkpoint (`float32` or `bfloat16`).

    Raises:
        ConfigError: the weights cannot be loaded as a causal LM (the message names `setting`).
    """
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(
            path, dtype=_DTYPES[dtype], trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as e:
        raise ConfigError(f"{setting}={path}: cannot load a causal LM from it ({e})") from e


@dataclass
class TrainBatch:
    """What the actor consumes: B sequences (prompt + response), right-padded.

    Attributes:
        input_ids: `(B, L)` long, prompt then response then padding.
        attention_mask: `(B, L)` long, 1 on real tokens.
        prompt_lens: `(B,)` long, tokens of each prompt.
        response_mask: `(B, T)` float, 1 on response tokens that enter the loss (T = longest response).
        advantages: `(B,)` float.
        old_log_prob: `(B, T)` float log-probs of the behaviour policy, or None to take the current policy's
            (exactly on-policy: one epoch, one mini-batch).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_lens: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    old_log_prob: torch.Tensor | None = None

    @staticmethod
    def build(
        prompts: list[list[int]],
        responses: list[list[int]],
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        pad_id: int,
    ) -> TrainBatch:
        """Pack token lists; `loss_mask` `(B,)` zeroes whole responses (overlong filtering)."""
        lens = [len(p) + len(r) for p, r in zip(prompts, responses)]
        b, width, t = len(prompts), max(lens), max(max(len(r) for r in responses), 1)
        ids = torch.full((b, width), pad_id, dtype=torch.long)
        attn = torch.zeros((b, width), dtype=torch.long)
        resp_mask = torch.zeros((b, t), dtype=torch.float32)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            ids[i, : lens[i]] = torch.tensor(p + r, dtype=torch.long)
            attn[i, : lens[i]] = 1
            resp_mask[i, : len(r)] = float(loss_mask[i])
        return TrainBatch(
            ids, attn, torch.tensor([len(p) for p in prompts]), resp_mask, advantages.float(), None
        )

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, idx: torch.Tensor) -> TrainBatch:
        """Rows `idx`, with the padding both batches no longer need trimmed away."""
        attn = self.attention_mask[idx]
        width = int(attn.sum(1).max())
        rmask = self.response_mask[idx]
        resp_len = (self.attention_mask[idx].sum(1) - self.prompt_lens[idx]).max()
        t = max(int(resp_len), 1)
        return TrainBatch(
            self.input_ids[idx, :width],
            attn[:, :width],
            self.prompt_lens[idx],
            rmask[:, :t],
            self.advantages[idx],
            None if self.old_log_prob is None else self.old_log_prob[idx, :t],
        )


class Actor:
    """The policy model with its AdamW optimizer and warm-up-then-constant learning rate.

    Args:
        model: a transformers causal LM (trained in place).
        cfg: `actor.*` settings.
        algo: `algorithm.*` settings (clip ratios, loss aggregation).
        temperature: rollout temperature; log-probs are computed from logits / temperature so that they are
            those of the sampling distribution (verl does the same).
    """

    def __init__(self, model, cfg: ActorConfig, algo: AlgorithmConfig, temperature: float = 1.0):
        self.model, self.cfg, self.algo = model, cfg, algo
        self.temperature = temperature if temperature > 0 else 1.0
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        warm = max(cfg.lr_warmup_steps, 0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warm) if warm > 0 else 1.0
        )

    def _autocast(self):
        if self.cfg.autocast_dtype == "bfloat16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def forward(self, mb: TrainBatch, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs `(b, T)` of the response tokens (and their entropy `(b, T)` when asked).

        Logits at position p predict token p+1, so response token t of row i (absolute position
        prompt_len_i + t) is scored by the logits at prompt_len_i + t - 1.
        """
        dev = self.device
        ids, attn = mb.input_ids.to(dev), mb.attention_mask.to(dev)
        with self._autocast():
            logits = self.model(input_ids=ids, attention_mask=attn, use_cache=False).logits
        t = mb.response_mask.shape[1]
        pos = (mb.prompt_lens.to(dev).unsqueeze(1) - 1 + torch.arange(t, device=dev)).clamp(
            max=ids.shape[1] - 2
        )
        resp_logits = (
            logits.gather(1, pos.unsqueeze(-1).expand(-1, -1, logits.shape[-1])).float() / self.temperature
        )
        labels = ids.gather(1, pos + 1)
        logp = logprobs_from_logits(resp_logits, labels)
        ent = None
        if with_entropy:
            with torch.no_grad():
                ent = entropy_from_logits(resp_logits)
        return logp, ent

    @torch.no_grad()
    def compute_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        """Log-probs `(B, T)` of the current policy for every response token (micro-batched, no grad)."""
        out = torch.zeros_like(batch.response_mask)
        mbs = self.cfg.ppo_micro_batch_size
        for s in range(0, len(batch), mbs):
            idx = torch.arange(s, min(s + mbs, len(batch)))
            mb = batch.slice(idx)
            logp, _ = self.forward(mb)
            out[idx, : logp.shape[1]] = logp.cpu()
        return out

    def update(self, batch: TrainBatch, group_size: int, generator: torch.Generator | None = None) -> dict:
        """One DAPO policy update over a training batch (paper Eq. 8-12; verl's `update_policy`).

        The batch is split into `ppo_mini_batch_size * group_size`-sequence mini-batches, one optimizer step each,
        for `ppo_epochs` passes; each mini-batch is accumulated over `ppo_micro_batch_size`-sequence micro-batches
        whose losses are normalised by the whole mini-batch's token (or sequence) count, so the gradient does not
        depend on the micro-batch split. When there is exactly one mini-batch and one epoch the update is exactly
        on-policy and the old log-probs are the current ones (ratio 1), which saves a forward pass.

        Returns:
            Metrics: `actor/pg_loss`, `actor/pg_clipfrac_lower|upper|dual`, `actor/ppo_kl`, `actor/entropy`,
            `actor/grad_norm`, `actor/lr`, `actor/num_skipped_steps` (steps with a non-finite gradient).
        """
        cfg = self.cfg
        mini = cfg.ppo_mini_batch_size * group_size
        n_minis = math.ceil(len(batch) / mini)
        on_policy = n_minis == 1 and cfg.ppo_epochs == 1
        if not on_policy and batch.old_log_prob is None:
            batch.old_log_prob = self.compute_log_prob(batch)
        self.model.train()
        sums: dict[str, float] = {}
        tok_total = 0.0
        grad_norms, skipped = [], 0
        for _ in range(cfg.ppo_epochs):
            order = (
                torch.randperm(len(batch), generator=generator) if cfg.shuffle else torch.arange(len(batch))
            )
            for m in range(n_minis):
                mb_idx = order[m * mini : (m + 1) * mini]
                mb_tokens = float(batch.response_mask[mb_idx].sum())
                self.optimizer.zero_grad(set_to_none=True)
                for s in range(0, len(mb_idx), cfg.ppo_micro_batch_size):
                    micro = batch.slice(mb_idx[s : s + cfg.ppo_micro_batch_size])
                    logp, ent = self.forward(micro, with_entropy=True)
                    dev = logp.device
                    mask = micro.response_mask.to(dev)
                    old = logp.detach() if on_policy else micro.old_log_prob.to(dev)
                    loss, stats = compute_policy_loss(
                        logp,
                        old,
                        micro.advantages.to(dev),
                        mask,
                        clip_ratio_low=self.algo.clip_ratio_low,
                        clip_ratio_high=self.algo.clip_ratio_high,
                        clip_ratio_c=self.algo.clip_ratio_c,
                        loss_agg_mode=self.algo.loss_agg_mode,
                        global_num_tokens=max(mb_tokens, 1.0),
                        global_batch_size=len(mb_idx),
                    )
                    loss.backward()
                    ntok = float(mask.sum())
                    tok_total += ntok
                    stats = dict(stats)
                    stats["entropy"] = float(masked_mean(ent, mask)) if ntok > 0 else 0.0
                    stats["pg_loss"] = loss.item() * max(mb_tokens, 1.0) / max(ntok, 1.0)
                    for k, v in stats.items():
                        if k != "num_tokens":
                            sums[k] = sums.get(k, 0.0) + float(v) * ntok
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
                if torch.isfinite(norm):
                    self.optimizer.step()
                    grad_norms.append(float(norm))
                else:
                    skipped += 1
                    self.optimizer.zero_grad(set_to_none=True)
        lr = self.optimizer.param_groups[0]["lr"]  # the rate these updates used
        self.scheduler.step()
        out = {f"actor/{k}": v / max(tok_total, 1.0) for k, v in sums.items()}
        out["actor/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        out["actor/lr"] = lr
        out["actor/num_skipped_steps"] = skipped
        return out

    def state_dict_for_engine(self):
        """(name, tensor) pairs to push to the rollout engine."""
        return self.model.state_dict().items()
