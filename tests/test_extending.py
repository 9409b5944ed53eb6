"""docs/extending.md's examples, run as written: each Python block of the page is a complete program with its own
asserts (a loss, an advantage estimator, a verifier through the real reward pool, a rollout engine, an episode
type on the tiny model)."""

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), flags=re.S | re.M)


NAMES = ["policy_loss", "adv_estimator", "verifier", "engine", "episode"]


def test_the_page_has_an_example_for_each_kind():
    assert len(BLOCKS) == len(NAMES)


@pytest.mark.parametrize("k", range(len(BLOCKS)), ids=NAMES)
def test_each_example_runs_as_written(k, monkeypatch):
    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # the verifier example adds a folder
    exec(compile(BLOCKS[k], f"{PAGE}:block{k}", "exec"), {"__name__": f"extending_example_{k}"})
