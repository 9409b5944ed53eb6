"""dapo-rl: DAPO reinforcement learning for reasoning language models."""

__version__ = "0.1.0"
