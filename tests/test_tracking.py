"""Experiment trackers (`trainer.logger`): the real TensorBoard, wandb (offline), Trackio and MLflow libraries,
written by a real `dapo train` run, read back and compared with metrics.jsonl, also across a crash and resume."""

import json
import os
import struct
import subprocess
import sys

import pytest
from e2e import FAULT, dapo, rows_of, run_args

from dapo_rl.config import ConfigError, load_config
from dapo_rl.tracking import check_trackers, flatten, mlflow_name, scalars


def test_metric_names_values_and_params_by_hand():
    row = {"step": 3, "train/acc_mean": 0.25, "train/kept_groups": 8, "ok": True, "note": "x", "none": None}
    assert scalars(row) == {"train/acc_mean": 0.25, "train/kept_groups": 8.0, "ok": 1.0}
    assert mlflow_name("val/aime/avg@32") == "val/aime/avg_at_32" and mlflow_name("a+b c") == "a_b c"
    assert flatten({"data": {"files": ["a", "b"], "n": 2}, "seed": 0}) == {
        "data.files": '["a", "b"]',
        "data.n": 2,
        "seed": 0,
    }


def test_unknown_or_missing_tracker_is_a_clear_error(monkeypatch):
    with pytest.raises(ConfigError, match="trainer.logger='tb' is not one of console, jsonl, tensorboard"):
        load_config(None, ["trainer.logger=[console,tb]"])
    assert load_config(None, []).trainer.logger == ["console", "jsonl"]
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without wandb sees on import
    with pytest.raises(
        ConfigError, match=r"'wandb' but the wandb package is not installed.*pip install 'dapo-rl\[wandb\]'"
    ):
        check_trackers(["console", "wandb"])
    check_trackers(["console", "jsonl", "tensorboard"])


def wandb_history(run_file) -> list[dict]:
    """The history rows of a wandb run file (`run-<id>.wandb`: a LevelDB-style log of protobuf records in 32 KiB
    blocks after a 7-byte header; each record chunk has a 7-byte header of crc, length, type)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1
    pos, buf, rows = 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # block trailer
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        buf = data[pos + 7 : pos + 7 + length] if kind in (1, 2) else buf + data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            if rec.WhichOneof("record_type") == "history":
                # an item names its metric in `key`, or (newer wandb) in `nested_key` split at the slashes
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
                )
    return rows


def _latest(pairs) -> dict:
    """`(step, value)` pairs in logging order -> the last value logged at each step."""
    out = {}
    for step, value in pairs:
        out[step] = value
    return out


@pytest.mark.slow
def test_every_tracker_matches_metrics_jsonl_across_a_crash_and_resume(base_model, tmp_path):
    pytest.importorskip("tensorboard")
    import mlflow
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    env = {"WANDB_MODE": "offline", "TRACKIO_DIR": str(tmp_path / "trackio"), "WANDB_SILENT": "true"}
    args = run_args(
        base_model,
        run,
        "trainer.total_training_steps=5",
        "trainer.test_freq=2",
        "trainer.logger=[console,jsonl,tensorboard,wandb,trackio,mlflow]",
        "trainer.project_name=trk",
        "trainer.experiment_name=demo",
    )
    # killed after step 4 was logged, before its checkpoint: the resumed run redoes steps 3 and 4
    r = dapo(*args, env_extra=env | {FAULT: "checkpoint:4"})
    assert r.returncode == -9, r.stderr[-3000:]
    first_ids = json.loads((run / "tracking.json").read_text())
    r = dapo(*args, "--resume", env_extra=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(run)
    assert [x["step"] for x in rows] == [0, 1, 2, 3, 4, 5]
    ids = json.loads((run / "tracking.json").read_text())
    assert ids == first_ids  # the same wandb and MLflow runs continue
    keys = sorted({k for x in rows for k in scalars(x)})
    want = {k: {x["step"]: float(x[k]) for x in rows if k in x} for k in keys}
    assert len(want["val/chain_sum/acc"]) == 4 and len(want["train/acc_mean"]) == 5  # steps 0, 2, 4, 5; 1-5

    # TensorBoard: the events after the checkpoint were purged on resume, so each step appears once
    ea = EventAccumulator(str(run / "tensorboard"))
    ea.Reload()
    assert sorted(ea.Tags()["scalars"]) == keys
    for k in keys:
        got = {e.step: e.value for e in ea.Scalars(k)}
        assert got == pytest.approx(want[k], rel=1e-6, abs=1e-6), k  # float32 events
    assert "config/text_summary" in ea.Tags()["tensors"]  # the resolved config, as text

    # MLflow (SQLite store in the run directory): one run, each step's latest value
    client = mlflow.tracking.MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
    (only,) = client.search_runs([client.get_experiment_by_name("trk").experiment_id])
    assert only.info.run_id == ids["mlflow"] and only.info.run_name == "demo"
    assert only.data.params["algorithm.clip_ratio_high"] == "0.28"
    for k in ("train/acc_mean", "val/chain_sum/avg@1", "train/gen_tokens_wasted_ratio"):
        hist = client.get_metric_history(ids["mlflow"], mlflow_name(k))
        got = _latest((m.step, m.value) for m in sorted(hist, key=lambda m: m.timestamp))
        assert got == pytest.approx(want[k]), k

    # wandb offline: the resumed run (same id) holds steps 3-5 (the killed process lost its unsent buffer)
    files = sorted(run.glob(f"wandb/offline-run-*-{ids['wandb']}/run-{ids['wandb']}.wandb"))
    assert len(files) == 2
    hist = wandb_history(files[-1])
    assert [h["_step"] for h in hist] == [3, 4, 5]
    for h in hist:
        for k in keys:
            if h["_step"] in want[k]:
                assert h[k] == pytest.approx(want[k][h["_step"]]), k

    # Trackio's local database: the run resumed by name, each step's latest value
    out = dapo_trackio_logs(tmp_path / "trackio", "trk", "demo")
    for k in ("train/acc_mean", "val/chain_sum/acc"):
        assert _latest((x["step"], x[k]) for x in out if k in x) == pytest.approx(want[k]), k


def dapo_trackio_logs(root, project: str, name: str) -> list[dict]:
    """Trackio's logged rows of one run, read in a fresh interpreter (Trackio reads `TRACKIO_DIR` on import)."""
    code = (
        "import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
        f"print(json.dumps(S.get_logs({project!r}, {name!r})))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, TRACKIO_DIR=str(root)),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_tracker_that_does_not_start_stops_every_rank(base_model, tmp_path):
    # two ranks; MLflow on rank 0 refuses the URI: both ranks stop with exit 2 instead of waiting at a barrier
    r = dapo(
        *run_args(
            base_model, tmp_path / "run", "trainer.nproc_per_node=2", "trainer.logger=[console,mlflow]"
        ),
        env_extra={"MLFLOW_TRACKING_URI": "bogus://nowhere"},
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert "dapo: error: trainer.logger: mlflow did not start" in r.stderr
    assert "the trackers did not start on rank 0" in r.stderr  # rank 1's own line
