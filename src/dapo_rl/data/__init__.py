"""Data: dataset rows in verl's schema, DAPO's prompt template, reasoning-gym tasks, resumable prompt sampling."""

from dapo_rl.data.dataset import (
    DataError,
    PromptDataset,
    Sample,
    load_samples,
    reasoning_gym_samples,
    render_prompt,
)
from dapo_rl.data.sampler import EpochSampler
from dapo_rl.data.templates import DAPO_TEMPLATE, apply_prompt_template

__all__ = [
    "DAPO_TEMPLATE",
    "DataError",
    "EpochSampler",
    "PromptDataset",
    "Sample",
    "apply_prompt_template",
    "load_samples",
    "reasoning_gym_samples",
    "render_prompt",
]
