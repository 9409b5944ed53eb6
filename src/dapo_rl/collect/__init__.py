"""Batch collection, as data flows in DESIGN.md: prompts -> engine -> responses -> verifier -> shaping -> groups of n
-> dynamic sampling -> advantages -> this rank's share of the training batch.

| module | holds |
|---|---|
| `records` | `Rollout` (one response) and `PromptGroup` (the n responses of one prompt) |
| `sampling` | one round through the engine and the verifier: `sample_groups`, `Scorer`, `sample_and_score` |
| `prompt_policy` | which prompts each round draws and how many (`PromptPolicy`, `SkipPolicy`, `prompt_policy`) |
| `loop` | dynamic sampling's rounds until the batch is kept (`collect_batch`) |
| `stats` | the step's statistics: sums over rounds and ranks, then means (`GenerationSums`) |
| `batch` | advantages and this rank's rows of the training batch (`make_train_batch`) |

Plain functions of an engine, a scorer and a sampler, so that tests drive them with the real tiny model and no
`Trainer`. Under N ranks (SPMD) every rank samples its own share of each generation round's prompts and scores whole
groups locally; only the kept-group count, the statistics and, once per step, the kept groups cross ranks.
"""

from dapo_rl.collect.batch import make_train_batch
from dapo_rl.collect.loop import DynamicSamplingExhausted, collect_batch
from dapo_rl.collect.prompt_policy import PromptPolicy, SkipPolicy, prompt_policy, round_size
from dapo_rl.collect.records import PromptGroup, Rollout
from dapo_rl.collect.sampling import Scorer, sample_and_score, sample_groups

__all__ = [
    "DynamicSamplingExhausted",
    "PromptGroup",
    "PromptPolicy",
    "Rollout",
    "Scorer",
    "SkipPolicy",
    "collect_batch",
    "make_train_batch",
    "prompt_policy",
    "round_size",
    "sample_and_score",
    "sample_groups",
]
