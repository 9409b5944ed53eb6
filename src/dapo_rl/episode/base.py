"""The episode protocol: prompt in, scored trajectories with a per-token loss mask out.

An episode type owns everything between the prompts a round draws and the records the batch is built from: what it
asks the engine (one `generate` per turn), what the verifier sees, the shaping of the reward, and which response
tokens are the model's (`Rollout.loss_mask`). Training (`dapo_rl.collect.collect_batch`, the asynchronous
`RolloutProducer`), validation and `dapo eval` all call `Episode.sample`, so a new episode type (a multi-turn tool
loop) lands here and nowhere else. `build_episode` is the one place that builds an episode and its reward pool from
a config (`episode.name`, `reward.*`, the shaping settings).

A new episode type subclasses `Episode` and implements `build`, `sample`, `unshaped`, `pool` and `seconds`;
`episode.name=<module>:<Class>` selects it without a change to the package (imported when named, as
`reward.name=<module>:<function>` is), and the package's own types are registered by name (`@register_episode`).
docs/extending.md has an example.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from dapo_rl.config import Config, RewardConfig
    from dapo_rl.episode.records import Rollout
    from dapo_rl.reward.pool import RewardPool
    from dapo_rl.rollout import RolloutEngine, SamplingParams


class Episode:
    """One episode type. Use as a context manager or call `close()` (it ends the reward pool's workers).

    Attributes:
        name: the `episode.name` that selects it.
    """

    name: ClassVar[str] = ""

    @classmethod
    def build(
        cls, cfg: Config, tokenizer, pool: RewardPool, log: Callable[[str], None] | None = None
    ) -> Episode:
        """This episode type for a run's config, scoring through `pool` (`build_episode` makes the pool)."""
        raise NotImplementedError

    def sample(
        self,
        engine: RolloutEngine,
        dataset,
        indices: Sequence[int],
        params: SamplingParams,
        *,
        overlap: bool = False,
    ) -> tuple[list[list[Rollout]], float]:
        """Sample `params.n` trajectories for each prompt `dataset[i]`, i in `indices`, score and shape them.

        Args:
            engine: the rollout engine (`dapo_rl.rollout.RolloutEngine`).
            dataset: a `dapo_rl.data.PromptDataset` (or `dapo_rl.evaluate.ChatPrompts` for a served model).
            indices: the prompts' indices in `dataset`.
            params: the round's sampling parameters; `params.max_tokens` is L_max of the overlong penalty.
            overlap: score chunks of the round while the engine samples the next (`reward.overlap`).

        Returns:
            `(groups, generate_seconds)`: one list of `params.n` scored `Rollout`s per index, in order, and the wall
            time spent inside the engine.
        """
        raise NotImplementedError

    def unshaped(self) -> Episode:
        """The same episode and verifier without reward shaping, sharing this one's reward pool (validation and
        `dapo eval` report the verifier's score); closing it leaves the pool open."""
        raise NotImplementedError

    @property
    def pool(self) -> RewardPool:
        """The reward pool (`dapo eval`'s maj@k groups answers by equivalence through it)."""
        raise NotImplementedError

    @property
    def seconds(self) -> float:
        """Wall-clock seconds spent in the verifier so far (`time/score_s` is its growth over a step)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop the reward pool's workers (if this episode owns the pool); idempotent."""

    def __enter__(self) -> Episode:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


EPISODES: dict[str, type[Episode]] = {}
"""Episode types by `episode.name` (`register_episode`)."""


def register_episode(cls: type[Episode]) -> type[Episode]:
    """Class decorator: make `cls` selectable as `episode.name: <cls.name>`.

    Raises:
        ValueError: `cls.name` is empty or already taken.
    """
    if not cls.name or cls.name in EPISODES:
        raise ValueError(f"episode name {cls.name!r} is empty or already registered")
    EPISODES[cls.name] = cls
    return cls


def reward_pool(reward: RewardConfig) -> RewardPool:
    """The reward pool of a `reward:` section (`dapo train`'s, or the one `dapo eval` and `dapo score` make from
    their flags).

    Raises:
        ValueError: a bad verifier name, worker count or time limit; RuntimeError: a worker did not start.
    """
    from dapo_rl.reward.code import CodeLimits
    from dapo_rl.reward.pool import RewardPool

    code = reward.code
    return RewardPool(
        reward.name,
        reward.num_workers,
        reward.timeout_s,
        partial_credit=reward.partial_credit,
        lenient=reward.lenient,
        code=CodeLimits(
            code.test_timeout_s,
            code.total_timeout_s,
            code.memory_mib,
            require_confined_reads=code.require_confined_reads,
        ),
        code_pass_rate=code.pass_rate,
    )


def episode_type(name: str) -> type[Episode]:
    """The episode type `episode.name` selects: a registered name (`EPISODES`) or `module:Class`.

    Raises:
        ValueError: an unknown name, a module that does not import, or a `Class` that is not an `Episode` subclass.
    """
    if ":" not in name:
        if name not in EPISODES:
            raise ValueError(f"unknown episode type {name!r} (known: {', '.join(EPISODES)}, or module:Class)")
        return EPISODES[name]
    import importlib

    module, _, attr = name.partition(":")
    try:
        kind = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"episode type {name!r} could not be imported: {e}") from e
    if not (isinstance(kind, type) and issubclass(kind, Episode)):
        raise ValueError(f"episode type {name!r} is not a subclass of dapo_rl.episode.Episode")
    return kind


def build_episode(cfg: Config, tokenizer, log: Callable[[str], None] | None = None) -> Episode:
    """The episode of `cfg.episode.name` with its reward pool (`cfg.reward`) and shaping.

    Args:
        cfg: the run's config (`episode`, `reward`, `algorithm.overlong_buffer`).
        tokenizer: decodes response token ids (None when every response comes as text: a served model).
        log: where the first verifier error of the run is reported.

    Raises:
        ValueError: as `episode_type` (`validate_config` refuses a bad name first) and `reward_pool`.
    """
    kind = episode_type(cfg.episode.name)
    pool = reward_pool(cfg.reward)
    try:
        return kind.build(cfg, tokenizer, pool, log)
    except BaseException:
        pool.close()
        raise


def trained_episode(model: str):
    """The `episode:` section of the training run that saved `model`: `(section, its config.yaml)` for a
    checkpoint's model directory (`<run>/checkpoints/global_step_N/model`, relative or absolute) whose run
    directory holds the `config.yaml` `dapo train` writes; None for any other model. Only the `episode:` section is
    read, so a run of an older version (a setting since removed) still gives it.

    Raises:
        ConfigError: the `config.yaml` is there but its `episode:` section cannot be read or is invalid (named).
    """
    from pathlib import Path

    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from dapo_rl.config import ConfigError, EpisodeConfig

    p = Path(model).absolute()
    saved = p.parent.parent.parent / "config.yaml"
    if p.name != "model" or p.parent.parent.name != "checkpoints" or not saved.is_file():
        return None
    try:
        section = (OmegaConf.to_container(OmegaConf.load(saved)) or {}).get("episode") or {}
        episode = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EpisodeConfig), section))
        episode.check()
    except (OSError, OmegaConfBaseException, ValueError, AttributeError, ConfigError) as e:
        raise ConfigError(
            f"cannot read the episode: section of {saved} (the model's training run): {e}"
        ) from e
    return episode, saved


def eval_episode_config(name: str | None, max_tool_calls: int | None, served: bool, trained=None):
    """The `episode:` section `dapo eval` sets from `--episode` (`name`) and `--max-tool-calls`, checked.

    `trained` is the section the model was trained with (`trained_episode`), or None. `name` None (no
    `--episode`) takes the trained episode, else `single_turn`; the trained episode's settings (the tool's call
    budget, output budget, limits and tags) stand for the same name, so a checkpoint is evaluated as it was
    trained, and `--max-tool-calls` overrides the budget.

    Raises:
        ConfigError: a bad name, a tool flag without the tool, or the tool with a served model (its responses come
            as text, not token ids the tool loop can continue).
    """
    import copy

    from dapo_rl.config import ConfigError, EpisodeConfig

    if name is None:
        name = trained.name if trained is not None else "single_turn"
    episode = (
        copy.deepcopy(trained) if trained is not None and trained.name == name else EpisodeConfig(name=name)
    )
    if max_tool_calls is not None:
        if name != "tool":
            raise ConfigError("--max-tool-calls is for --episode tool")
        episode.tool.max_calls = max_tool_calls
    try:
        episode.check()
    except ConfigError as e:
        raise ConfigError(
            str(e).replace("episode.name", "--episode").replace("episode.tool.max_calls", "--max-tool-calls")
        ) from e
    if served and episode.name == "tool":
        raise ConfigError(
            "--episode tool needs a local model (--engine hf or vllm): a served model answers in text"
        )
    return episode
