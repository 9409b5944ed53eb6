"""Fixtures shared by the test files that run the real `dapo` command."""

import pytest
from e2e import dapo


@pytest.fixture(scope="session")
def base_model(tmp_path_factory):
    """A short supervised warm-up of the embedded recipe (the real `dapo sft`), shared by the tests."""
    out = tmp_path_factory.mktemp("base") / "model"
    r = dapo("sft", "tiny_chain_sum", "sft.steps=250", "sft.task.size=20000", f"sft.output_dir={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """The embedded tiny model (random weights, seed 3) and its tokenizer, saved as a Hugging Face checkpoint (test
    files that need another model define their own `model_dir`)."""
    from dapo_rl.models.tiny import build_tiny_model, build_tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(seed=3).save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return path
