"""Trainer state that goes into checkpoints: every RNG restores exactly, through torch.load(weights_only=True)."""

import random

import numpy as np
import torch

from dapo_rl.trainer import _rng_state, _set_rng_state


def test_rng_state_round_trips_through_weights_only_load(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.normal()  # leave a cached gaussian in numpy's state
    torch.save({"rng": _rng_state()}, tmp_path / "s.pt")
    expect = (random.random(), np.random.normal(), np.random.randint(1 << 30), torch.rand(3))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    _set_rng_state(torch.load(tmp_path / "s.pt", weights_only=True)["rng"])
    got = (random.random(), np.random.normal(), np.random.randint(1 << 30), torch.rand(3))
    assert got[:3] == expect[:3]
    assert torch.equal(got[3], expect[3])
