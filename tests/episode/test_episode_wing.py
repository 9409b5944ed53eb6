"""The episode wing (`dapo_rl.episode`): the one builder of an episode and its reward pool, `Episode.sample` on the
real tiny model and the real verifier, the shaping's L_max from the round, the unshaped view, the registry."""

import pytest
import torch

from dapo_rl.config import EPISODE_NAMES, ConfigError, load_config
from dapo_rl.data import PromptDataset, reasoning_gym_samples
from dapo_rl.episode import EPISODES, Episode, Scorer, SingleTurn, build_episode, register_episode
from dapo_rl.models.tiny import build_tiny_model, build_tiny_tokenizer
from dapo_rl.rollout import HFRolloutEngine, SamplingParams


@pytest.fixture(scope="module")
def parts():
    tok = build_tiny_tokenizer()
    engine = HFRolloutEngine(build_tiny_model(seed=0), tok, micro_batch_size=64)
    samples = reasoning_gym_samples("chain_sum", 8, 0, {"min_terms": 2, "max_terms": 2}, True)
    return tok, engine, PromptDataset(samples, tok, 64, "chain_sum")


def _cfg(*extra: str):
    return load_config(None, ["reward.num_workers=0", "algorithm.overlong_buffer.len=2", *extra])


def test_sample_scores_each_response_and_shapes_it_with_the_rounds_max_tokens(parts):
    """Eq. 13 with L_cache 2 and L_max = the round's max_tokens: -1 at L_max, -0.5 one below, 0 further down. The
    same episode sampling with max_tokens 6 and then 8 (a CAMPO stage change) shapes each round by its own limit."""
    tok, engine, ds = parts
    with build_episode(_cfg(), tok) as episode:
        assert isinstance(episode, SingleTurn) and episode.name == "single_turn"
        for max_tokens in (6, 8):
            params = SamplingParams(n=3, temperature=1.0, max_tokens=max_tokens, seed=7)
            groups, gen_s = episode.sample(engine, ds, [0, 5], params)
            assert [len(g) for g in groups] == [3, 3] and gen_s > 0
            assert [r.problem_idx for g in groups for r in g] == [0, 0, 0, 5, 5, 5]
            for r in (r for g in groups for r in g):
                assert r.response_length == len(r.response_ids) <= max_tokens and r.status == "ok"
                assert r.score == (1.0 if r.acc else -1.0)  # DAPO's +-1 (the real chain_sum verifier)
                want = {max_tokens: -1.0, max_tokens - 1: -0.5}.get(r.response_length, 0.0)
                assert r.reward == pytest.approx(r.score + want)
            assert any(r.response_length == max_tokens for g in groups for r in g)  # a random model runs long
        assert episode.seconds > 0


def test_the_unshaped_view_shares_the_pool_and_reports_the_verifiers_score(parts):
    tok, engine, ds = parts
    with build_episode(_cfg(), tok) as episode:
        view = episode.unshaped()
        assert view.pool is episode.pool
        params = SamplingParams(n=2, max_tokens=6, seed=3)
        shaped, _ = episode.sample(engine, ds, [1], params)
        plain, _ = view.sample(engine, ds, [1], params)
        # same seed, same responses; the view leaves the reward at the verifier's score
        assert [r.response_ids for r in plain[0]] == [r.response_ids for r in shaped[0]]
        assert all(r.reward == r.score for r in plain[0])
        assert any(r.reward != r.score for r in shaped[0])  # at 6 tokens the penalty applies
        view.close()  # the view does not own the pool: it still scores
        assert episode.pool.score([("math", "Answer: 2", "2", None)])[0]["acc"] is True


def test_closing_the_episode_ends_its_reward_workers(parts):
    tok = parts[0]
    episode = build_episode(_cfg("reward.num_workers=1"), tok)
    (worker,) = episode.pool._sandbox.workers
    assert worker.proc.is_alive()
    episode.close()
    assert not worker.proc.is_alive() and episode.pool._sandbox.workers == []
    episode.close()  # idempotent


class _Failing(Episode):
    name = "test_failing_build"
    built_with = None

    @classmethod
    def build(cls, cfg, tokenizer, pool, log=None):
        cls.built_with = pool
        raise RuntimeError("this episode cannot be built")


def test_a_failed_build_closes_the_pool_it_was_given(parts):
    register_episode(_Failing)
    try:
        cfg = _cfg("reward.num_workers=1")
        cfg.episode.name = _Failing.name  # past validate_config, which knows only the shipped names
        with pytest.raises(RuntimeError, match="cannot be built"):
            build_episode(cfg, parts[0])
        assert _Failing.built_with is not None and _Failing.built_with._sandbox.workers == []
    finally:
        del EPISODES[_Failing.name]


def test_the_registry_and_the_config_know_the_same_names():
    assert tuple(EPISODES) == EPISODE_NAMES == ("single_turn", "tool")
    with pytest.raises(ValueError, match="already registered"):
        register_episode(SingleTurn)
    with pytest.raises(
        ConfigError,
        match=r"^episode.name='multi' is not one of single_turn, tool, or module:Class \(your own episode type\)$",
    ):
        load_config(None, ["episode.name=multi"])


def test_the_overlong_penalty_without_the_rounds_limit_is_an_error(parts):
    tok = parts[0]
    cfg = _cfg()
    with build_episode(cfg, tok) as episode:
        scorer = Scorer(tok, episode.pool, overlong=cfg.algorithm.overlong_buffer)
        from dapo_rl.episode import Rollout

        r = Rollout(parts[2].samples[0], 0, 0, response_ids=tok("Answer: 1")["input_ids"])
        with pytest.raises(ValueError, match="max_tokens"):
            scorer([r])
        scorer([r], max_tokens=64)
        assert r.reward == r.score and torch.isfinite(torch.tensor(r.reward))


@pytest.mark.parametrize(
    "name, message",
    [
        (
            "no_such_module:X",
            r"^episode.name='no_such_module:X' could not be imported: ModuleNotFoundError: No module named",
        ),
        (
            "dapo_rl.episode:Nope",
            r"^episode.name='dapo_rl.episode:Nope' could not be imported: AttributeError: .*no attribute 'Nope'",
        ),
        ("dapo_rl.episode:Scorer", r"^episode.name='dapo_rl.episode:Scorer' is not an episode type"),
    ],
)
def test_a_user_episode_type_is_named_module_colon_class(name, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"episode.name={name}"])
    # the builder's own check (a config built in code skips validate_config)
    from dapo_rl.episode import episode_type

    with pytest.raises(ValueError):
        episode_type(name)
    assert episode_type("dapo_rl.episode:SingleTurn") is SingleTurn is episode_type("single_turn")


def test_the_config_refuses_what_the_builder_refuses(tmp_path, monkeypatch):
    """Review of issue 43, m3: a class with `build` and `sample` but no `Episode` base passed the config check and
    failed in the builder, after the engine was built; a module that raises on import gave a traceback."""
    (tmp_path / "duck_episodes.py").write_text(
        "class Duck:\n    @classmethod\n    def build(cls, *a):\n        pass\n\n    def sample(self, *a):\n"
        "        pass\n"
    )
    (tmp_path / "broken_episodes.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^episode.name='duck_episodes:Duck' is not an episode type"):
        load_config(None, ["episode.name=duck_episodes:Duck"])
    with pytest.raises(ConfigError, match=r"could not be imported: RuntimeError: broken at import$"):
        load_config(None, ["episode.name=broken_episodes:X"])
    from dapo_rl.episode import episode_type

    with pytest.raises(ValueError, match="not a subclass"):
        episode_type("duck_episodes:Duck")
