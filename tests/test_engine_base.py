"""The engine base class: what an engine that implements only `generate` gets, and that every engine of the package
subclasses it (callers call its methods without probing)."""

import pytest

from dapo_rl.rollout.base import GenerationOutput, RolloutEngine, SamplingParams


class Canned(RolloutEngine):
    """Returns `i * 10 + j` as response j of prompt i, and counts its calls."""

    def __init__(self):
        self.calls = 0

    def generate(self, prompts, params):
        self.calls += 1
        return [
            [GenerationOutput([i * 10 + j], [-0.5], "stop") for j in range(params.n)]
            for i in range(len(prompts))
        ]


def test_an_engine_that_only_generates_gets_the_documented_defaults():
    e = Canned()
    assert e.close() is None and e.sleep() is None and e.abort() is None and e.clear_abort() is None
    assert e.check_weight_names(["model.embed_tokens.weight"]) is None
    assert e.engines == [e] and e.collective is False and e.takes_chat is False
    params = SamplingParams(n=2)
    chunks = list(e.generate_chunks([[1], [2], [3]], params))
    assert e.calls == 1 and len(chunks) == 1  # the whole round as one chunk, from one generate
    assert [[o.token_ids for o in g] for g in chunks[0]] == [[[0], [1]], [[10], [11]], [[20], [21]]]
    with pytest.raises(NotImplementedError, match="Canned cannot take new weights"):
        e.update_weights(iter(()))


def test_generate_is_required():
    class Nothing(RolloutEngine):
        pass

    with pytest.raises(TypeError, match="generate"):
        Nothing()


def test_every_engine_of_the_package_subclasses_the_base():
    from dapo_rl.rollout.hf import HFRolloutEngine
    from dapo_rl.rollout.openai_server import OpenAIChatEngine
    from dapo_rl.rollout.remote import RemoteEngine, RemoteEngines
    from dapo_rl.rollout.vllm import VLLMRolloutEngine  # imports vLLM only when built

    for cls in (HFRolloutEngine, VLLMRolloutEngine, OpenAIChatEngine, RemoteEngine, RemoteEngines):
        assert issubclass(cls, RolloutEngine), cls
    assert OpenAIChatEngine.takes_chat and not HFRolloutEngine.takes_chat
