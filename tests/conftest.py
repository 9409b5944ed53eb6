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
