"""End to end: the real `dapo` command on the real tiny model and the shared data files (slow: about 3 minutes)."""

from pathlib import Path

import pytest
import torch
from e2e import dapo, rows_of
from transformers import AutoModelForCausalLM, AutoTokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
REQUIRED = [
    "step",
    "train/reward_mean",
    "train/acc_mean",
    "train/response_length_mean",
    "train/response_clip_ratio",
    "train/entropy",
    "train/pg_clipfrac_lower",
    "train/pg_clipfrac_upper",
    "train/kept_groups",
    "train/num_gen_batches",
    "train/gen_samples_total",
    "train/gen_tokens_wasted_ratio",
    "train/all_correct_group_ratio",
    "train/token_prob_mean",
    "train/grad_norm",
    "train/lr",
    "time/step_s",
    "time/generate_s",
    "time/update_s",
    "time/score_s",
    "time/old_log_prob_s",
    "time/sync_weights_s",
    "perf/tokens_per_s",
    "perf/mfu",
    "rollout_corr/rollout_is_mean",
    "rollout_corr/k3_kl",
]
SMALL = [
    "data.train_reasoning_gym.size=2000",
    "data.val_reasoning_gym.size=100",
    "trainer.progress_bar=false",
]

pytestmark = pytest.mark.slow


def test_train_checkpoint_and_resume(base_model, tmp_path):
    run = tmp_path / "run"
    common = [
        f"model.path={base_model}",
        f"trainer.output_dir={run}",
        "trainer.test_freq=2",
        "trainer.save_freq=2",
        "algorithm.filter_groups.on_exhausted=partial",
        *SMALL,
    ]
    r = dapo("train", *common, "trainer.total_training_steps=3")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "attention chosen by model.attn_implementation=auto" in r.stdout + r.stderr
    # 24 of the 100 held-out problems (seed range 1,000,000+) are two- and three-term sums the 2,000 training ones hold
    assert (
        "data: 24 of 100 validation prompts of chain_sum are also training prompts; left out "
        "(data.val_exclude_train_prompts), 76 remain" in r.stdout + r.stderr
    )
    rows = rows_of(run)
    assert [x["step"] for x in rows] == [0, 1, 2, 3]
    assert (
        "val/chain_sum/acc" in rows[0] and "val/chain_sum/acc" in rows[2] and "val/chain_sum/acc" in rows[3]
    )
    for row in rows[1:]:
        missing = [k for k in REQUIRED if k not in row]
        assert not missing, missing
        assert row["train/kept_groups"] <= 32 and row["train/num_gen_batches"] >= 1
        assert 0 <= row["train/acc_mean"] <= 1 and row["train/lr"] == pytest.approx(1e-4)
    assert (run / "training_dynamics.png").stat().st_size > 10_000
    assert (run / "config.yaml").read_text().count("total_training_steps: 3") == 1

    # the last step is always saved; checkpoints are Hugging Face directories
    ckpt = run / "checkpoints" / "global_step_3" / "model"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert tok.decode(tok("1 + 2 =\nAnswer: 3")["input_ids"]) == "1 + 2 =\nAnswer: 3"
    assert sum(p.numel() for p in model.parameters()) > 1e6
    base = AutoModelForCausalLM.from_pretrained(base_model)
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), base.parameters()))  # it trained

    # a second run into the same directory without --resume is refused (nothing is overwritten)
    r = dapo("train", *common, "trainer.total_training_steps=3")
    assert r.returncode == 2 and "--resume" in r.stderr

    # --resume continues at the next step
    r = dapo("train", *common, "trainer.total_training_steps=5", "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout + r.stderr and "at step 3" in r.stdout + r.stderr
    assert [x["step"] for x in rows_of(run)] == [0, 1, 2, 3, 4, 5]
    assert (run / "checkpoints" / "global_step_5").is_dir()


def test_real_data_validates_on_aime_then_stops_with_the_dynamic_sampling_message(base_model, tmp_path):
    run = tmp_path / "real"
    r = dapo(
        "train",
        f"model.path={base_model}",
        f"trainer.output_dir={run}",
        f"data.train_files=[{DATA / 'dapo_math_17k' / 'dapo_math_17k.parquet'}]",
        f"data.val_files=[{DATA / 'aime24_dapo' / 'aime-2024.parquet'}]",
        "data.prompt_template=dapo",
        "data.max_prompt_length=2048",
        "trainer.total_training_steps=2",
        "data.gen_batch_size=8",
        "data.train_batch_size=8",
        "rollout.n=4",
        "algorithm.filter_groups.max_num_gen_batches=2",
        "data.val_max_samples=64",
        "trainer.progress_bar=false",
    )
    assert r.returncode == 3, (r.stdout[-2000:], r.stderr[-3000:])
    assert "Traceback" not in r.stderr
    assert "dynamic sampling kept 0 of the 8 prompt groups" in r.stderr
    assert "max_num_gen_batches" in r.stderr and "on_exhausted=partial" in r.stderr
    rows = rows_of(run)
    assert rows[0]["step"] == 0 and rows[0]["val/aime-2024/acc"] == 0.0


def test_bad_config_is_one_line_exit_2(tmp_path):
    r = dapo("train", "algorithm.clip_ratio_hihg=0.3")
    assert r.returncode == 2 and "did you mean algorithm.clip_ratio_high" in r.stderr
    assert "Traceback" not in r.stderr
    r = dapo("train", f"model.path={tmp_path / 'nope'}", f"trainer.output_dir={tmp_path / 'r'}")
    assert r.returncode == 2 and "model.path" in r.stderr and "no such directory" in r.stderr


def test_bad_data_fails_before_the_embedded_warm_up(tmp_path):
    # an empty cache: the embedded model would take minutes to warm up; the data is checked first
    cache = tmp_path / "cache"
    r = dapo(
        "train",
        f"trainer.output_dir={tmp_path / 'run'}",
        "data.val_reasoning_gym.seed=0",  # the training set's seed: every validation problem is a training one
        "data.val_reasoning_gym.size=50",
        env_extra={"DAPO_RL_CACHE": str(cache)},
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "dataset chain_sum: all 50 prompts are also training prompts" in r.stderr
    assert not list(cache.rglob("*.safetensors"))  # no warm-up ran


def _without_eos(base_model: Path, tmp_path: Path) -> Path:
    import json
    import shutil

    model = tmp_path / "no_eos"
    shutil.copytree(base_model, model)
    cfg_path = model / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(eos_token=None, pad_token=None)
    cfg_path.write_text(json.dumps(cfg))
    return model


@pytest.mark.parametrize(
    "case, message",
    [
        ("no_eos", "the tokenizer has no eos token"),
        ("context", "= 4098 tokens exceeds the model's context (max_position_embeddings=4096"),
        (
            "small_data",
            "data.gen_batch_size=64 prompts per generation round, but the training data (chain_sum) has only 10",
        ),
        ("gen_lt_train", "data.gen_batch_size=16 must be >= data.train_batch_size=32"),
        ("missing_data", "nope.parquet: no such file"),
    ],
)
def test_bad_setup_is_one_line_exit_2_before_heavy_work(base_model, tmp_path, case, message):
    model = _without_eos(base_model, tmp_path) if case == "no_eos" else base_model
    extra = {
        "no_eos": [],
        "context": ["data.max_prompt_length=4000", "data.max_response_length=98"],
        "small_data": ["data.train_reasoning_gym.size=10"],
        "gen_lt_train": ["data.gen_batch_size=16"],
        "missing_data": [f"data.train_files=[{tmp_path / 'nope.parquet'}]"],
    }[case]
    r = dapo("train", f"model.path={model}", f"trainer.output_dir={tmp_path / 'run'}", *extra)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
