"""docs/extending.md's examples, run as written: each Python block of the page is a complete program with its own
asserts (a loss, an advantage estimator, a verifier through the real reward pool, a rollout engine, an episode
type on the tiny model), run as a user runs it: saved to a file, `python that_file.py`."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), flags=re.S | re.M)


NAMES = ["policy_loss", "adv_estimator", "verifier", "engine", "episode"]


def test_the_page_has_an_example_for_each_kind():
    assert len(BLOCKS) == len(NAMES)


@pytest.mark.parametrize("k", range(len(BLOCKS)), ids=NAMES)
def test_each_example_runs_as_written(k, tmp_path):
    script = tmp_path / f"{NAMES[k]}.py"
    script.write_text(BLOCKS[k])
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{PAGE} block {k} ({NAMES[k]}):\n{done.stderr[-4000:]}"
