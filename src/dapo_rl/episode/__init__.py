"""The episode wing: prompt in, scored trajectories with a per-token loss mask out.

| module | holds |
|---|---|
| `records` | `Rollout` (one trajectory: response tokens, log-probs, loss mask, score, reward) and `PromptGroup` |
| `base` | the `Episode` protocol, its registry (`episode.name`) and `build_episode` (the episode and its reward pool) |
| `single_turn` | DAPO's episode: one response per sample, verifier, overlong and repetition shaping (`SingleTurn`) |
| `tool` | multi-turn rollouts in which the model runs Python in the sandbox, its output masked (`ToolEpisode`) |

Training, validation and `dapo eval` sample through `Episode.sample`; the layers above (`dapo_rl.collect`, the
trainer) never build a reward pool or a scorer themselves.
"""

from dapo_rl.episode.base import EPISODES, Episode, build_episode, episode_type, register_episode, reward_pool
from dapo_rl.episode.records import PromptGroup, Rollout
from dapo_rl.episode.single_turn import Scorer, SingleTurn, sample_and_score, sample_groups
from dapo_rl.episode.tool import ToolEpisode, ToolFormat

__all__ = [
    "EPISODES",
    "Episode",
    "PromptGroup",
    "Rollout",
    "Scorer",
    "SingleTurn",
    "ToolEpisode",
    "ToolFormat",
    "build_episode",
    "episode_type",
    "register_episode",
    "reward_pool",
    "sample_and_score",
    "sample_groups",
]
