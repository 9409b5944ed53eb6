"""Batch collection, as data flows in DESIGN.md: prompts -> engine -> responses -> verifier -> shaping -> groups of n
-> dynamic sampling -> advantages -> this rank's share of the training batch.

| module | holds |
|---|---|
| `prompt_policy` | which prompts each round draws and how many (`PromptPolicy`, `SkipPolicy`, `prompt_policy`) |
| `loop` | dynamic sampling's rounds until the batch is kept (`collect_batch`) |
| `stats` | the step's statistics: sums over rounds and ranks, then means (`GenerationSums`) |
| `batch` | advantages and this rank's rows of the training batch (`make_train_batch`) |

A round's trajectories come from the episode (`dapo_rl.episode`: `Episode.sample`, its records `Rollout` and
`PromptGroup`, re-exported here). Plain functions of an engine, an episode and a sampler, so that tests drive them with the real tiny model and no
`Trainer`. Under N ranks (SPMD) every rank samples its own share of each generation round's prompts and scores whole
groups locally; only the kept-group count, the statistics and, once per step, the kept groups cross ranks.
"""

from dapo_rl.collect.batch import make_train_batch
from dapo_rl.collect.loop import DynamicSamplingExhausted, collect_batch
from dapo_rl.collect.prompt_policy import PromptPolicy, SkipPolicy, prompt_policy, round_size
from dapo_rl.episode.records import PromptGroup, Rollout

__all__ = [
    "DynamicSamplingExhausted",
    "PromptGroup",
    "PromptPolicy",
    "Rollout",
    "SkipPolicy",
    "collect_batch",
    "make_train_batch",
    "prompt_policy",
    "round_size",
]
