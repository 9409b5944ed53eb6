"""Where dapo-rl keeps what it builds or unpacks once per machine (the embedded tiny models, SmolLM2 unpacked from its
wheel): one small module that the model recipes, the SFT warm-up and the Ray launcher share."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$DAPO_RL_CACHE`, default `~/.cache/dapo_rl`."""
    return Path(os.environ.get("DAPO_RL_CACHE", Path.home() / ".cache" / "dapo_rl"))
