"""The embedded base model's cache: built once, then found and named in one log line."""

from dataclasses import replace

from dapo_rl.config import load_config
from dapo_rl.sft import ensure_embedded_model


def test_a_cached_embedded_model_is_named_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DAPO_RL_CACHE", str(tmp_path / "cache"))
    sft = load_config().sft
    sft = replace(sft, steps=2, batch_size=4, task=replace(sft.task, size=64))  # a 2-step warm-up: seconds
    first: list[str] = []
    path = ensure_embedded_model(sft, log=first.append)
    assert path.parent == tmp_path / "cache" / "models" and path.name.startswith("tiny-chain_sum-")
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    assert first[0] == "building the embedded base model (supervised warm-up, 2 steps; cached for later runs)"
    assert not any("cached embedded base model" in m for m in first)
    again: list[str] = []
    assert ensure_embedded_model(sft, log=again.append) == path
    assert again == [f"using the cached embedded base model {path.name} ({path}; delete it to rebuild)"]
