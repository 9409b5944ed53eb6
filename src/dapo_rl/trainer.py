"""The DAPO training loop (paper Algorithm 1), as data flows:

prompts -> rollout engine -> responses + log-probs + finish reason -> verifier (score, acc)
-> overlong shaping -> groups of n -> dynamic sampling (keep groups whose acc varies; sample more rounds)
-> group-normalised advantages -> actor update (token-level clipped loss) -> weight sync -> metrics, checkpoint
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dapo_rl.actor import Actor, TrainBatch, load_model, load_tokenizer, model_context_length
from dapo_rl.algo import compute_grpo_advantages, filter_groups, overlong_penalty
from dapo_rl.config import Config, ConfigError, resume_config_diff, to_yaml
from dapo_rl.data import EpochSampler, PromptDataset, Sample, load_samples, reasoning_gym_samples
from dapo_rl.data.dataset import DataError
from dapo_rl.reward.pool import RewardPool
from dapo_rl.reward.shaping import repetition_penalty
from dapo_rl.rollout import SamplingParams, build_engine

EXIT_DYNAMIC_SAMPLING_EXHAUSTED = 3
"""Exit code of `dapo train` when dynamic sampling could not fill a batch within `max_num_gen_batches` rounds."""


EXIT_TRAINING_DIVERGED = 4
"""Exit code of `dapo train` after `trainer.max_consecutive_bad_steps` steps in a row with a non-finite update."""

FAULT_ENV = "DAPO_RL_FAULT_AT"
"""Fault injection for crash tests: a comma-separated list of `<point>:<step>`. At `rollout` (responses generated,
not yet scored), `update` (optimizer steps taken, engine not yet synced, nothing written), `checkpoint` (model
written to the temporary directory, trainer state not yet) the process SIGKILLs itself; `nan_loss` makes that
step's advantages NaN, so its loss is NaN. Unset in normal use."""


class DynamicSamplingExhausted(RuntimeError):
    """Dynamic sampling hit `algorithm.filter_groups.max_num_gen_batches` before the batch was full."""


class TrainingDiverged(RuntimeError):
    """`trainer.max_consecutive_bad_steps` steps in a row had a non-finite loss or gradient."""


def _fault_at(point: str, step: int) -> bool:
    """Whether `DAPO_RL_FAULT_AT` asks for a fault at this point and step (see `FAULT_ENV`)."""
    spec = os.environ.get(FAULT_ENV, "")
    return bool(spec) and f"{point}:{step}" in (x.strip() for x in spec.split(","))


def _crash_point(point: str, step: int) -> None:
    if _fault_at(point, step):
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class Group:
    """The n responses of one prompt, scored."""

    sample: Sample
    prompt_ids: list[int]
    responses: list[list[int]]
    finish_reasons: list[str]
    scores: list[float]  # shaped: verifier score + overlong penalty
    accs: list[float]
    lengths: list[int] = field(default_factory=list)
    status: list[str] = field(default_factory=list)  # verifier outcome per response: ok, error, timeout


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _rng_state() -> dict:
    """Every global RNG, as plain lists and tensors (loadable with `torch.load(weights_only=True)`)."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(mt), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }


def _set_rng_state(state: dict) -> None:
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])


def truncate_metrics(path: Path, step: int) -> int:
    """Keep the rows of a `metrics.jsonl` up to `step` (a resume rewrites the later ones), atomically.

    A line cut short by a crash, or any line that is not a JSON object with an integer `step`, is dropped.

    Returns:
        The number of rows kept.
    """
    keep = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            keep.append(row)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
    os.replace(tmp, path)
    return len(keep)


class Trainer:
    """Runs DAPO from a `Config`: build everything, then `fit()`.

    Args:
        cfg: the resolved configuration.
        resume: continue from the latest checkpoint in `trainer.output_dir`.
        log: where one-line messages go (the CLI passes a tqdm-aware printer).

    Raises:
        ConfigError: bad model path, data that cannot form a batch, an output directory that already holds a run
            (without `resume`), or `resume` with no checkpoint.
        DataError: unreadable or malformed data files.
    """

    def __init__(self, cfg: Config, resume: bool = False, log=print):
        self.cfg, self.log = cfg, log
        t = cfg.trainer
        self.out = Path(t.output_dir)
        self.metrics_path = self.out / "metrics.jsonl"
        ckpt = self.latest_checkpoint()
        if resume and ckpt is None:
            raise ConfigError(f"--resume: no checkpoint under {self.out / 'checkpoints'}")
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
            refused, harmless = resume_config_diff(self.out / "config.yaml", cfg)
            if refused:
                raise ConfigError(
                    f"--resume: {len(refused)} setting(s) differ from the run's saved config and change what it "
                    f"trains: {'; '.join(refused)}. Resume with the saved values ({self.out / 'config.yaml'}) or "
                    "start a new trainer.output_dir"
                )
            if harmless:
                log(f"warning: --resume with changed settings: {'; '.join(harmless)}")

        if t.num_threads > 0:
            torch.set_num_threads(t.num_threads)
        _seed_everything(t.seed)

        model_path = cfg.model.path
        if model_path == "embedded":
            from dapo_rl.sft import ensure_embedded_model

            model_path = str(ensure_embedded_model(cfg.sft, log=log))
        load_path = str(ckpt / "model") if ckpt is not None else model_path
        self.tokenizer = load_tokenizer(load_path, cfg.model.trust_remote_code)
        need = cfg.data.max_prompt_length + cfg.data.max_response_length
        ctx = model_context_length(load_path, cfg.model.trust_remote_code)
        if ctx is not None and need > ctx:
            raise ConfigError(
                f"data.max_prompt_length + data.max_response_length = {need} tokens exceeds the model's context "
                f"(max_position_embeddings={ctx} in {load_path}/config.json)"
            )

        skipped: list[DataError] | None = [] if cfg.data.skip_invalid else None  # None: raise on a bad row
        self.train_data = self._train_dataset(skipped)
        self.val_data = self._val_datasets(skipped)
        self.skipped_rows = len(skipped or [])
        if skipped:
            shown = "; ".join(str(e) for e in skipped[:3])
            more = f" (and {self.skipped_rows - 3} more)" if self.skipped_rows > 3 else ""
            log(f"data: skipped {self.skipped_rows} malformed rows (data.skip_invalid=true): {shown}{more}")
        if self.train_data.num_dropped:
            log(f"data: dropped {self.train_data.num_dropped} training prompts over data.max_prompt_length")
        if len(self.train_data) < cfg.data.gen_batch_size:
            raise ConfigError(
                f"data.gen_batch_size={cfg.data.gen_batch_size} prompts per generation round, but the training data "
                f"({self.train_data.name}) has only {len(self.train_data)} usable prompts"
                + (
                    f" ({self.train_data.num_dropped} dropped over data.max_prompt_length)"
                    if self.train_data.num_dropped
                    else ""
                )
                + "; lower data.gen_batch_size and data.train_batch_size or add data"
            )
        self.sampler = EpochSampler(len(self.train_data), seed=t.seed, shuffle=cfg.data.shuffle)
        model = load_model(load_path, cfg.model.dtype, cfg.model.trust_remote_code)
        self.actor = Actor(model, cfg.actor, cfg.algorithm, temperature=cfg.rollout.temperature)
        try:
            self.engine = self._build_engine(model, load_path, need)
        except ValueError as e:
            raise ConfigError(str(e)) from e
        self.reward_pool = RewardPool(cfg.reward.name, cfg.reward.num_workers, cfg.reward.timeout_s)
        self.step = 0
        self.bad_streak = 0
        if ckpt is not None:
            self._load_state(ckpt)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "config.yaml").write_text(to_yaml(cfg))

    def _build_engine(self, model, load_path: str, max_model_len: int):
        """The rollout engine of `rollout.name`; vLLM starts from the checkpoint on disk (`load_path`)."""
        r = self.cfg.rollout
        if r.name != "vllm":
            return build_engine(r.name, model, self.tokenizer, r.micro_batch_size)
        return build_engine(
            "vllm",
            model,
            self.tokenizer,
            model_path=load_path,
            dtype=self.cfg.model.dtype,
            max_model_len=max_model_len,
            kv_cache_gib=r.kv_cache_gib,
            gpu_memory_utilization=r.gpu_memory_utilization,
            seed=self.cfg.trainer.seed,
            max_num_seqs=r.micro_batch_size,
        )

    # ----------------------------------------------------------------------------------------------- data
    def _train_dataset(self, skipped: list[DataError] | None) -> PromptDataset:
        d = self.cfg.data
        if d.train_files:
            samples = [s for f in d.train_files for s in load_samples(f, d.prompt_template, skipped)]
            name = Path(d.train_files[0]).stem
        else:
            rg = d.train_reasoning_gym
            samples = reasoning_gym_samples(rg.task, rg.size, rg.seed, dict(rg.params), rg.strip_instruction)
            name = rg.task
        return PromptDataset(samples, self.tokenizer, d.max_prompt_length, name)

    def _val_datasets(self, skipped: list[DataError] | None) -> list[PromptDataset]:
        d = self.cfg.data
        out = []
        if d.val_files:
            for f in d.val_files:
                samples = load_samples(f, d.prompt_template, skipped)
                out.append(PromptDataset(samples, self.tokenizer, d.max_prompt_length, Path(f).stem))
        else:
            rg = d.val_reasoning_gym
            samples = reasoning_gym_samples(rg.task, rg.size, rg.seed, dict(rg.params), rg.strip_instruction)
            out.append(PromptDataset(samples, self.tokenizer, d.max_prompt_length, rg.task))
        if d.val_max_samples > 0:
            for ds in out:
                ds.samples, ds.prompt_ids = (
                    ds.samples[: d.val_max_samples],
                    ds.prompt_ids[: d.val_max_samples],
                )
        return out

    # ------------------------------------------------------------------------------------------- rollout
    def _score(
        self, samples: list[Sample], outputs
    ) -> tuple[list[list[float]], list[list[float]], list[list[str]]]:
        """Verifier scores, correctness and status (`ok`, `error`, `timeout`) per group, through the reward pool."""
        from dapo_rl.evaluate import score_groups

        _, results = score_groups(self.tokenizer, self.reward_pool, samples, outputs)
        scores, accs, status = [], [], []
        for rs in results:
            scores.append([float(r["score"]) for r in rs])
            accs.append([float(bool(r["acc"])) for r in rs])
            status.append(["timeout" if r.get("timeout") else "error" if "error" in r else "ok" for r in rs])
        return scores, accs, status

    def generate_groups(self, indices: list[int], seed: int) -> list[Group]:
        """Sample `rollout.n` responses for each training prompt, score and shape them."""
        cfg = self.cfg
        r = cfg.rollout
        samples = [self.train_data.samples[i] for i in indices]
        prompts = [self.train_data.prompt_ids[i] for i in indices]
        params = SamplingParams(
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_tokens=cfg.data.max_response_length,
            seed=seed,
        )
        outputs = self.engine.generate(prompts, params)
        _crash_point("rollout", self.step)
        scores, accs, status = self._score(samples, outputs)
        groups = []
        ob = cfg.algorithm.overlong_buffer
        rp = cfg.reward.repetition_penalty
        for s, p, outs, sc, ac, st in zip(samples, prompts, outputs, scores, accs, status):
            lengths = [len(o.token_ids) for o in outs]
            if ob.enable:
                pen = overlong_penalty(
                    torch.tensor(lengths), cfg.data.max_response_length, ob.len, ob.penalty_factor
                )
                sc = [a + float(b) for a, b in zip(sc, pen)]
            if rp.enable:
                sc = [
                    a
                    + repetition_penalty(o.token_ids, rp.factor, rp.min_repeats, rp.max_period, rp.min_tokens)
                    for a, o in zip(sc, outs)
                ]
            groups.append(
                Group(s, p, [o.token_ids for o in outs], [o.finish_reason for o in outs], sc, ac, lengths, st)
            )
        return groups

    def collect_batch(self) -> tuple[list[Group], dict]:
        """Dynamic sampling (DAPO section 3.2): generate rounds of `gen_batch_size` prompts, keep the groups whose
        metric varies, until `train_batch_size` groups are kept.

        Returns:
            `(groups, stats)`; stats cover every generated response of the step (all rounds), not only the kept.

        Raises:
            DynamicSamplingExhausted: `max_num_gen_batches` rounds did not fill the batch and
                `on_exhausted` is `error`.
        """
        cfg = self.cfg
        fg = cfg.algorithm.filter_groups
        want = cfg.data.train_batch_size
        kept: list[Group] = []
        generated: list[Group] = []
        rounds = passed = 0
        while True:
            rounds += 1
            indices = self.sampler.next(cfg.data.gen_batch_size)
            seed = (cfg.trainer.seed * 1_000_003 + self.step * 1_009 + rounds) % (2**31)
            groups = self.generate_groups(indices, seed)
            generated.extend(groups)
            if fg.enable:
                metric = torch.tensor(
                    [v for g in groups for v in (g.accs if fg.metric == "acc" else g.scores)]
                )
                gidx = torch.arange(len(groups)).repeat_interleave(cfg.rollout.n)
                keep = filter_groups(metric, gidx).view(len(groups), cfg.rollout.n)[:, 0]
                kept.extend(g for g, k in zip(groups, keep.tolist()) if k)
                passed += int(keep.sum())
            else:
                kept.extend(groups)
                passed += len(groups)
            if len(kept) >= want:
                kept = kept[:want]
                break
            if fg.max_num_gen_batches > 0 and rounds >= fg.max_num_gen_batches:
                if fg.on_exhausted == "partial" and kept:
                    self.log(
                        f"step {self.step}: dynamic sampling kept {len(kept)}/{want} groups; training on them"
                    )
                    break
                raise DynamicSamplingExhausted(
                    f"dynamic sampling kept {len(kept)} of the {want} prompt groups a step needs after {rounds} "
                    f"generation rounds of {cfg.data.gen_batch_size} prompts (algorithm.filter_groups."
                    f"max_num_gen_batches={fg.max_num_gen_batches}): the other groups' {cfg.rollout.n} responses were "
                    "all right or all wrong, so they carry no learning signal. Raise algorithm.filter_groups."
                    "max_num_gen_batches (0 = unlimited) or data.gen_batch_size, set algorithm.filter_groups."
                    "on_exhausted=partial, disable algorithm.filter_groups.enable, or start from a model that solves "
                    "some but not all of these problems."
                )
        all_scores = [v for g in generated for v in g.scores]
        all_accs = [v for g in generated for v in g.accs]
        lengths = [v for g in generated for v in g.lengths]
        truncated = [f == "length" for g in generated for f in g.finish_reasons]
        status = [v for g in generated for v in g.status]
        stats = {
            "train/reward_mean": float(np.mean(all_scores)),
            "train/acc_mean": float(np.mean(all_accs)),
            "train/response_length_mean": float(np.mean(lengths)),
            "train/response_length_max": float(np.max(lengths)),
            "train/response_clip_ratio": float(np.mean(truncated)),
            "train/kept_groups": len(kept),
            "train/num_gen_batches": rounds,
            "train/filter_pass_ratio": passed / len(generated),
            "reward/error_rate": status.count("error") / len(status),
            "reward/timeout_rate": status.count("timeout") / len(status),
            "data/skipped_rows": self.skipped_rows,
        }
        return kept, stats

    def make_train_batch(self, groups: list[Group]) -> TrainBatch:
        """Group-normalised advantages of the shaped scores (GRPO), and the packed tensors."""
        n = self.cfg.rollout.n
        scores = torch.tensor([v for g in groups for v in g.scores], dtype=torch.float32)
        gidx = torch.arange(len(groups)).repeat_interleave(n)
        adv = compute_grpo_advantages(scores, gidx)
        if not self.cfg.algorithm.norm_adv_by_std_in_grpo:
            means = torch.zeros(len(groups)).index_add_(0, gidx, scores) / n
            adv = scores - means[gidx]
        truncated = torch.tensor([f == "length" for g in groups for f in g.finish_reasons])
        loss_mask = ~truncated if self.cfg.algorithm.overlong_filtering else torch.ones_like(truncated)
        prompts = [g.prompt_ids for g in groups for _ in range(n)]
        responses = [r for g in groups for r in g.responses]
        return TrainBatch.build(prompts, responses, adv, loss_mask.float(), self.tokenizer.pad_token_id)

    # -------------------------------------------------------------------------------------------- validate
    def validate(self) -> dict:
        """Evaluate each validation set with `rollout.val_kwargs` through the same code as `dapo eval`
        (`dapo_rl.evaluate`): `val/<name>/acc` and `val/<name>/avg@<n>` (mean correctness over all samples),
        `val/<name>/pass@k` and `maj@k` when n > 1, and `val/<name>/response_length_mean`."""
        from dapo_rl.evaluate import dataset_metrics, evaluate_dataset

        vk = self.cfg.rollout.val_kwargs
        params = SamplingParams(
            n=vk.n,
            temperature=vk.temperature,
            top_p=vk.top_p,
            top_k=vk.top_k,
            max_tokens=self.cfg.data.max_response_length,
            seed=self.cfg.trainer.seed + 7919,
        )
        out = {}
        for ds in self.val_data:
            records = evaluate_dataset(
                self.engine, self.tokenizer, ds, params, self.reward_pool, chunk_problems=max(len(ds), 1)
            )
            m = dataset_metrics(records, vk.n)
            out[f"val/{ds.name}/acc"] = m[f"avg@{vk.n}"]
            keys = [k for k in m if k.startswith(("avg@", "pass@", "maj@"))] if vk.n > 1 else [f"avg@{vk.n}"]
            out.update({f"val/{ds.name}/{k}": m[k] for k in keys})
            out[f"val/{ds.name}/response_length_mean"] = m["response_length_mean"]
        return out

    # ------------------------------------------------------------------------------------------------ loop
    def train_step(self) -> dict:
        """One DAPO step: collect a batch with dynamic sampling, update the actor, sync the engine."""
        t0 = time.perf_counter()
        groups, stats = self.collect_batch()
        t1 = time.perf_counter()
        batch = self.make_train_batch(groups)
        if _fault_at("nan_loss", self.step):
            batch.advantages = torch.full_like(batch.advantages, float("nan"))
        gen = torch.Generator().manual_seed(self.cfg.trainer.seed + self.step)
        upd = self.actor.update(batch, self.cfg.rollout.n, generator=gen)
        _crash_point("update", self.step)
        self.engine.update_weights(self.actor.state_dict_for_engine())
        t2 = time.perf_counter()
        metrics = dict(stats)
        metrics.update(
            {
                "train/entropy": upd["actor/entropy"],
                "train/pg_loss": upd["actor/pg_loss"],
                "train/pg_clipfrac_lower": upd["actor/pg_clipfrac_lower"],
                "train/pg_clipfrac_upper": upd["actor/pg_clipfrac_upper"],
                "train/pg_clipfrac_dual": upd["actor/pg_clipfrac_dual"],
                "train/ppo_kl": upd["actor/ppo_kl"],
                "train/grad_norm": upd["actor/grad_norm"],
                "train/lr": upd["actor/lr"],
                "train/skipped_updates": upd["actor/num_skipped_steps"],
                "time/generate_s": t1 - t0,
                "time/update_s": t2 - t1,
            }
        )
        return metrics

    def fit(self) -> list[dict]:
        """Train `trainer.total_training_steps` steps (from the resumed step), validating and checkpointing as
        configured; writes `metrics.jsonl` and `training_dynamics.png`. Returns the metrics rows of this call."""
        from tqdm import tqdm

        from dapo_rl.plotting import plot_training_dynamics

        t = self.cfg.trainer
        rows = []
        if self.step == 0 and t.val_before_train and t.test_freq > 0:
            row = {"step": 0, **self.validate()}
            self._write_metrics(row)
            rows.append(row)
            self.log(self._format(row))
        bar = tqdm(
            total=t.total_training_steps,
            initial=self.step,
            desc="dapo train",
            disable=None
            if t.progress_bar
            else True,  # None: a bar only on a terminal; log files get clean lines
            dynamic_ncols=True,
        )
        try:
            while self.step < t.total_training_steps:
                t0 = time.perf_counter()
                self.step += 1
                row = {"step": self.step, **self.train_step()}
                last = self.step == t.total_training_steps
                if t.test_freq > 0 and (self.step % t.test_freq == 0 or last):
                    row.update(self.validate())
                row["time/step_s"] = time.perf_counter() - t0
                self._write_metrics(row)
                rows.append(row)
                skipped = row["train/skipped_updates"]
                self.bad_streak = self.bad_streak + 1 if skipped else 0
                if skipped:
                    bar.write(
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
                if last or (t.save_freq > 0 and self.step % t.save_freq == 0):
                    self.save_checkpoint()
                bar.update(1)
                bar.write(self._format(row))
        finally:
            bar.close()
            self.reward_pool.close()
            if self.metrics_path.exists():
                plot_training_dynamics(self.metrics_path, self.out / "training_dynamics.png")
        return rows

    @staticmethod
    def _format(row: dict) -> str:
        keys = [
            ("train/acc_mean", "acc", "{:.3f}"),
            ("train/reward_mean", "reward", "{:+.3f}"),
            ("train/response_length_mean", "len", "{:.1f}"),
            ("train/entropy", "entropy", "{:.3f}"),
            ("train/kept_groups", "kept", "{}"),
            ("train/num_gen_batches", "gen_batches", "{}"),
            ("time/step_s", "step_s", "{:.2f}"),
        ]
        parts = [f"step {row['step']}"]
        parts += [f"{label} {fmt.format(row[k])}" for k, label, fmt in keys if k in row]
        parts += [f"{k} {v:.3f}" for k, v in row.items() if k.startswith("val/") and k.endswith("/acc")]
        return "  ".join(parts)

    def _write_metrics(self, row: dict) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps(row) + "\n")

    # ------------------------------------------------------------------------------------------ checkpoints
    def latest_checkpoint(self) -> Path | None:
        """The newest complete `checkpoints/global_step_N` directory, or None."""
        root = self.out / "checkpoints"
        if not root.is_dir():
            return None
        done = [p for p in root.glob("global_step_*") if (p / "trainer_state.pt").is_file()]
        return max(done, key=lambda p: int(p.name.rsplit("_", 1)[1]), default=None)

    def save_checkpoint(self) -> Path:
        """Write `checkpoints/global_step_<step>/` (HF model + tokenizer in `model/`, optimizer, scheduler, RNG and
        data position in `trainer_state.pt`) through a temporary directory renamed into place; prune old ones."""
        bad = [n for n, p in self.actor.model.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            raise TrainingDiverged(
                f"step {self.step}: refusing to checkpoint non-finite weights ({', '.join(bad[:3])}); the previous "
                "checkpoint is kept"
            )
        root = self.out / "checkpoints"
        final = root / f"global_step_{self.step}"
        tmp = root / f".tmp_global_step_{self.step}"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "model").mkdir(parents=True)
        self.actor.model.save_pretrained(tmp / "model", safe_serialization=True)
        self.tokenizer.save_pretrained(tmp / "model")
        _crash_point("checkpoint", self.step)
        state = {
            "step": self.step,
            "bad_streak": self.bad_streak,
            "optimizer": self.actor.optimizer.state_dict(),
            "scheduler": self.actor.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": _rng_state(),
        }
        torch.save(state, tmp / "trainer_state.pt")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        (root / "latest_checkpointed_iteration.txt").write_text(str(self.step))
        keep = self.cfg.trainer.max_ckpt_to_keep
        if keep > 0:
            done = sorted(root.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
            for old in done[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
        return final

    def _load_state(self, ckpt: Path) -> None:
        state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
        self.step = int(state["step"])
        self.bad_streak = int(state.get("bad_streak", 0))
        self.actor.optimizer.load_state_dict(state["optimizer"])
        self.actor.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        _set_rng_state(state["rng"])
        if self.metrics_path.exists():  # rows written after the checkpoint will be written again
            truncate_metrics(self.metrics_path, self.step)
        self.log(f"resumed from {ckpt} at step {self.step}")
