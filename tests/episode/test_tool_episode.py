"""The tool episode (`dapo_rl.episode.tool`): the turn loop's token bookkeeping (each turn's engine input is the prompt,
the model's ids and the tool's ids exactly), the loss mask over the tool's tokens, what the verifier reads, malformed
calls and the call budget, and the void trajectory of a failed sandbox. The programs run in the real sandbox; the
engine is a scripted `RolloutEngine` (its turns are fixed texts, so that every count below is known by hand)."""

from dataclasses import replace

import pytest

from dapo_rl.collect.loop import filter_groups
from dapo_rl.collect.stats import GenerationSums
from dapo_rl.config import load_config
from dapo_rl.data import PromptDataset, Sample
from dapo_rl.episode import PromptGroup, Rollout, Scorer, ToolEpisode, build_episode
from dapo_rl.episode.tool import ToolFormat, extract_code, render_output
from dapo_rl.models.tiny import build_tiny_tokenizer
from dapo_rl.rollout.base import GenerationOutput, RolloutEngine, SamplingParams

EOS = 256  # the tiny tokenizer's eos; ids 0-255 are the bytes


class Scripted(RolloutEngine):
    """Answers turn t of every trajectory with `turns[t]` (t: the tool outputs already in its context), honouring
    `stop` (the stop string kept, as vLLM with `include_stop_str_in_output`) and `max_tokens`; records each call's
    input ids and parameters."""

    def __init__(self, turns: list[str], marker: bytes = b"<interpreter>"):
        self.turns, self.marker = turns, marker
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []

    def generate(self, prompts, params):
        self.calls.append(([list(p) for p in prompts], params))
        groups = []
        for p in prompts:
            text, reason = self.turns[bytes(x for x in p if x < 256).count(self.marker)], None
            ends = [(text.find(s) + len(s), s) for s in params.stop or [] if s in text]
            if ends:
                end, reason = min(ends)
                text = text[:end]
            ids, finish = list(text.encode()) + ([] if reason else [EOS]), "stop"
            if len(ids) > params.max_tokens:
                ids, finish, reason = ids[: params.max_tokens], "length", None
            lps = [-0.5] * len(ids)
            groups.append([GenerationOutput(ids, lps, finish, stop_reason=reason) for _ in range(params.n)])
        return groups


def turns_and_outputs(turns: list[str], outputs: list[str]) -> tuple[list[int], list[int]]:
    """The response ids and loss mask of model turns with a tool output after each but the last (the tiny
    tokenizer: a byte a token), the last turn ending in eos."""
    ids, mask = [], []
    for k, turn in enumerate(turns):
        ids += list(turn.encode()) + ([EOS] if k == len(turns) - 1 else list(outputs[k].encode()))
        mask += [1] * len(turn.encode()) + ([1] if k == len(turns) - 1 else [0] * len(outputs[k].encode()))
    return ids, mask


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def data(tok):
    rows = [
        Sample(f"t:{i}", "math_dapo", [{"role": "user", "content": q}], a)
        for i, (q, a) in enumerate([("What is 48213 - 9917 + 30466?", "68762"), ("What is 6 * 7?", "42")])
    ]
    return PromptDataset(rows, tok, 128, "t")


def _cfg(*extra):
    return load_config(None, ["episode.name=tool", "reward.num_workers=0", "reward.name=math_dapo", *extra])


def test_two_calls_then_an_answer_token_in_token_out(tok, data):
    """Turn 1's input is the prompt + turn 0's ids + the tool's ids, byte for byte; the tool's tokens carry mask 0
    and log-prob 0; the verifier reads the model's text only (the tool printed the right number, the model's own
    answer decides)."""
    turns = [
        "Let me compute. <code>print(48213 - 9917 + 30466)</code>",
        "Check: <code>\n```python\nx = 68762\nprint(x - 30466 + 9917)\n```\n</code>",
        "So the answer is 68762.\nAnswer: 68762",
    ]
    engine = Scripted(turns)
    with build_episode(_cfg("algorithm.overlong_buffer.enable=false"), tok) as episode:
        assert isinstance(episode, ToolEpisode)
        [[r]], _ = episode.sample(engine, data, [0], SamplingParams(n=1, max_tokens=400, seed=5))
    out1 = "\n<interpreter>\n68762\n\n</interpreter>\n"
    out2 = "\n<interpreter>\n48213\n\n</interpreter>\n"
    model = [t.encode() for t in turns]
    ids, mask = turns_and_outputs(turns, [out1, out2])
    assert r.response_ids == ids
    assert r.loss_mask == mask
    assert [lp for lp, m in zip(r.logprobs, mask) if not m] == [0.0] * (len(out1) + len(out2))
    assert r.sampled_logprobs() == [-0.5] * sum(mask)
    prompt = data.prompt_ids[0]
    first = len(model[0]) + len(out1)  # the response so far at turn 1, then at turn 2
    second = first + len(model[1]) + len(out2)
    assert [c[0] for c in engine.calls] == [[prompt], [prompt + ids[:first]], [prompt + ids[:second]]]
    assert [c[1].stop for c in engine.calls] == [["</code>"]] * 3
    assert [c[1].max_tokens for c in engine.calls] == [400, 400 - first, 400 - second]
    assert len({c[1].seed for c in engine.calls}) == 3 and engine.calls[0][1].seed == 5
    assert r.tool_calls == ["ok", "ok"] and r.tool_truncated == 0 and r.finish_reason == "stop"
    assert r.tool_turns == 3
    assert r.acc and r.score == 1.0 and r.text == bytes(i for i in ids if i < 256).decode()


def test_malformed_calls_get_a_message_not_a_crash(tok, data):
    """A closing tag with no opening one, an empty block, a syntax error, then a call past the budget of 3: each
    answered with a message the model reads; the budget's message ends the trajectory."""
    turns = [
        "no opening tag</code>",
        "<code>   </code>",
        "<code>print(1 +)</code>",
        "<code>print(2)</code>",
        "never sampled",
    ]
    engine = Scripted(turns)
    with build_episode(_cfg("episode.tool.max_calls=3"), tok) as episode:
        [[r]], _ = episode.sample(engine, data, [1], SamplingParams(n=1, max_tokens=600))
    assert r.tool_calls == ["malformed", "malformed", "error", "over_budget"] and r.tool_turns == 4
    text = bytes(i for i in r.response_ids if i < 256).decode()
    outputs = [part.split("</interpreter>")[0].strip() for part in text.split("<interpreter>")[1:]]
    assert outputs[:2] == ["error: no code between the tags"] * 2
    assert outputs[2].startswith("SyntaxError")
    assert outputs[3] == "error: the tool-call budget (3 calls) is used up"
    assert len(engine.calls) == 4 and "never sampled" not in text
    assert not r.acc and r.finish_reason == "stop"


def test_output_is_cut_to_its_token_budget_and_the_response_budget(tok, data):
    """A flood of output that ends in an error: at most max_output_tokens of it, tags included, its middle cut so
    that its start and its error line stay; then the response budget: the tool's tokens count against max_tokens,
    and a call without room for an output is not run (the trajectory ends, truncated)."""
    code = "<code>print('x' * 10000); 1 / 0</code>"
    engine = Scripted([code, "Answer: 42"])
    with build_episode(_cfg("episode.tool.max_output_tokens=80"), tok) as episode:
        [[r]], _ = episode.sample(engine, data, [1], SamplingParams(n=1, max_tokens=300))
        call = len(code)
        assert r.loss_mask[call : call + 80] == [0] * 80 and r.loss_mask[call + 80] == 1
        tool = bytes(r.response_ids[call : call + 80]).decode()
        assert tool.startswith("\n<interpreter>\nxxx") and tool.endswith("division by zero\n</interpreter>\n")
        assert "x\n...\n" in tool and r.tool_calls == ["error"]
        assert r.tool_truncated == 1 and r.acc and r.finish_reason == "stop"
        # 20 tokens after the call: more than the tags (31) need? no: the call is not run
        [[cut]], _ = episode.sample(engine, data, [1], SamplingParams(n=1, max_tokens=call + 20))
        assert cut.response_ids == list(code.encode()) and cut.finish_reason == "length"
        assert cut.tool_calls == [] and cut.tool_turns == 1
        # room for the tags and 5 more tokens, fewer than the cut mark needs: the tags alone, and the model's 5
        [[full]], _ = episode.sample(engine, data, [1], SamplingParams(n=1, max_tokens=call + 36))
    assert full.loss_mask == [1] * call + [0] * 31 + [1] * 5 and full.finish_reason == "length"
    assert bytes(full.response_ids[call:]).decode() == "\n<interpreter>\n\n</interpreter>\nAnswe"
    assert full.tool_calls == ["error"] and full.tool_truncated == 1


def test_n_samples_each_go_on_alone_and_the_metrics_count_the_calls(tok, data):
    """n = 3 on turn 0 (one generate with n 3), then each trajectory alone (n 1 per live trajectory)."""
    engine = Scripted(["<code>print(6 * 7)</code>", "Answer: 42"])
    with build_episode(_cfg(), tok) as episode:
        groups, _ = episode.sample(engine, data, [0, 1], SamplingParams(n=3, max_tokens=300, seed=1))
    assert [(len(c[0]), c[1].n) for c in engine.calls] == [(2, 3), (6, 1)]
    assert [[r.sample_idx for r in g] for g in groups] == [[0, 1, 2]] * 2
    assert [r.acc for g in groups for r in g] == [False] * 3 + [True] * 3
    stats = GenerationSums.of([PromptGroup((1, i), g) for i, g in enumerate(groups)]).stats(0, 1, 2)
    assert stats["tool/calls_per_trajectory"] == 1.0 and stats["tool/turns_mean"] == 2.0
    assert stats["tool/used_ratio"] == 1.0 and stats["tool/code_error_rate"] == 0.0
    assert stats["tool/void_ratio"] == 0.0 and stats["tool/truncated_rate"] == 0.0


def test_a_sandbox_failure_voids_the_group_and_is_counted_apart(tok, data):
    """A trajectory whose call the sandbox failed on (not the program's fault) is `void`: dynamic sampling drops its
    group even with the filter off, and `tool/sandbox_error_rate` counts it."""
    engine = Scripted(["<code>print(1)</code>", "Answer: 42"])
    with build_episode(_cfg(), tok) as episode:
        groups, _ = episode.sample(engine, data, [0, 1], SamplingParams(n=2, max_tokens=200))
    groups[0][1].tool_calls = ["sandbox_error"]  # as the runner reports a template that died under the call
    pgs = [PromptGroup((1, i), g) for i, g in enumerate(groups)]
    fg = load_config(None, ["algorithm.filter_groups.enable=false"]).algorithm.filter_groups
    kept, dropped = filter_groups(pgs, fg)
    assert kept == [pgs[1]] and dropped == sum(r.response_length for r in groups[0])
    stats = GenerationSums.of(pgs).stats(0, 1, 1)
    assert stats["tool/sandbox_error_rate"] == 0.25 and stats["tool/void_ratio"] == 0.25


def test_extract_code_and_the_messages():
    fmt = ToolFormat()
    assert extract_code("a <code>x=1</code> b <code>print(2)</code>", fmt) == "print(2)"
    assert extract_code("<code>```py\nprint(3)\n```</code>", fmt) == "print(3)"
    assert extract_code("<code>\n```\n\n```\n</code>", fmt) is None
    assert extract_code("print(4)</code>", fmt) is None
    assert render_output(
        "error", "partial\n", "Traceback ...\nZeroDivisionError: division by zero\n", "", 5, 4
    ) == ("partial\nZeroDivisionError: division by zero")
    assert render_output("timeout", "", "", "", 5, 4) == "TimeoutError: the program ran past 5 s"
    assert render_output("ok", "", "", "", 5, 4) == "(no output)"


def test_the_verifier_reads_the_models_text_only(tok, data):
    """The tool printed the answer in the verifier's format; the model never wrote it: wrong."""
    engine = Scripted(["<code>print('Answer: 42')</code>", "I am not sure."])
    with build_episode(_cfg(), tok) as episode:
        [[r]], _ = episode.sample(engine, data, [1], SamplingParams(n=1, max_tokens=300))
        assert "Answer: 42" in r.text and not r.acc
        scorer = Scorer(tok, episode.pool)
        scorer([r], 300)  # the whole response, tool output included, would pass
        assert r.acc


def _tool_update(path, tok, masks, stale_lp):
    """One update of the real tiny actor on two trajectories whose middle tokens are a tool's (`masks`), the rows
    stale so that pi_old is the recorded log-probs: those of the tool's tokens are `stale_lp`."""
    import torch

    from dapo_rl.actor import Actor, TrainBatch
    from dapo_rl.config import ActorConfig, AlgorithmConfig

    prompts = [tok("1 + 2 =\n")["input_ids"], tok("30 - 4 =\n")["input_ids"]]
    responses = [
        list(b"<code>print(1+2)</code>\n<interpreter>\n3\n</interpreter>\nAnswer: 3"),
        list(b"Answer: 26"),
    ]
    tool = [
        len(b"<code>print(1+2)</code>"),
        len(b"<code>print(1+2)</code>\n<interpreter>\n3\n</interpreter>\n"),
    ]
    actor = Actor(str(path), ActorConfig(ppo_micro_batch_size=2, lr=1e-2, grad_clip=1e9), AlgorithmConfig())
    lp = [[-1.0] * len(r) for r in responses]
    lp[0][tool[0] : tool[1]] = [stale_lp] * (tool[1] - tool[0])
    batch = TrainBatch.build(
        prompts, responses, torch.tensor([1.0, -1.0]), torch.ones(2), tok.pad_token_id,
        rollout_logprobs=lp, stale=[True, True], token_masks=masks(tool, responses),
    )  # fmt: skip
    actor.update(batch)
    return {k: v.clone() for k, v in actor.model.state_dict().items()}


def test_the_tools_tokens_get_no_gradient(model_dir, tok):
    """The tool's tokens of a trajectory (loss mask 0) do not move the update: any recorded log-prob there gives
    the same parameters; without the mask the same change moves them."""
    import torch

    def masked(tool, responses):
        return [[0 if tool[0] <= t < tool[1] else 1 for t in range(len(responses[0]))], None]

    a = _tool_update(model_dir, tok, masked, 0.0)
    b = _tool_update(model_dir, tok, masked, -7.0)
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = _tool_update(model_dir, tok, lambda tool, responses: None, 0.0)
    d = _tool_update(model_dir, tok, lambda tool, responses: None, -7.0)
    assert any(not torch.allclose(c[k], d[k]) for k in c)


def test_a_tensor_parallel_engine_is_refused_with_the_tool():
    """Each rank's turn loop ends with its own trajectories, while a tensor-parallel engine's ranks must all call
    generate: refused before anything starts."""
    from dapo_rl.config import ConfigError

    with pytest.raises(ConfigError, match="episode.name=tool with rollout.tensor_model_parallel_size=2"):
        load_config(None, ["episode.name=tool", "rollout.name=vllm", "rollout.tensor_model_parallel_size=2"])
    load_config(None, ["episode.name=tool", "rollout.name=vllm"])


def test_the_overlong_penalty_and_the_length_metrics_count_the_models_tokens(tok, data):
    """A 29-token call, 132 tokens of tool output, an 11-token answer: 172 tokens fill the context, 40 are the
    model's. The overlong penalty (Eq. 13, L_max 200) reads the 40: none with L_cache 50 (the 172 would cost
    -(172 - 150) / 50), -(40 - 20) / 180 with L_cache 180; `train/response_length_mean` is 40 and
    `tool/context_length_mean` 172."""
    engine = Scripted(["<code>print('y' * 100)</code>", "Answer: 42"])
    params = SamplingParams(n=1, max_tokens=200)
    rewards = []
    for cache in (50, 180):
        cfg = _cfg(
            "data.max_response_length=200",
            f"algorithm.overlong_buffer.len={cache}",
            "algorithm.overlong_buffer.penalty_factor=1.0",
        )
        with build_episode(cfg, tok) as episode:
            [[r]], _ = episode.sample(engine, data, [1], params)
        assert (r.response_length, r.model_length, sum(r.loss_mask)) == (172, 40, 40) and r.score == 1.0
        rewards.append(r.reward)
    assert rewards == [1.0, pytest.approx(1.0 - 20 / 180, abs=1e-6)]
    stats = GenerationSums.of([PromptGroup((1, 0), [r])]).stats(r.model_length, 1, 1)
    assert stats["train/response_length_mean"] == 40 and stats["tool/context_length_mean"] == 172
    assert stats["train/gen_tokens"] == 172
    light = r.light()
    assert light.model_length == 40 and light.loss_mask is None
    record = r.to_record("t")
    assert record["model_length"] == 40 and Rollout.from_record(record).model_length == 40


def test_a_round_the_sandbox_voided_is_named_when_dynamic_sampling_gives_up(tok, data):
    """Both calls of a group are running (each has named itself) when their sandbox templates are killed from
    outside (a real sandbox failure, not the program's): the group is void, the filter drops it, a prompt policy does not learn from it,
    and the exhaustion message says the sandbox, not the model, emptied the round."""
    import os
    import signal
    import threading
    import time

    from sandbox_targets import threads_named

    from dapo_rl.collect import DynamicSamplingExhausted, collect_batch
    from dapo_rl.collect.loop import group_outcomes
    from dapo_rl.data import EpochSampler

    marker = "dapo-void-call"
    program = (
        f"import ctypes, time\nctypes.CDLL(None).prctl(15, {marker!r}.encode())\ntime.sleep(30)\nprint(42)"
    )
    engine = Scripted([f"<code>{program}</code>", "Answer: 42"])
    cfg = _cfg(
        "data.train_batch_size=1",
        "actor.ppo_mini_batch_size=1",
        "data.gen_batch_size=1",
        "data.max_response_length=200",
        "rollout.n=2",
        "episode.tool.num_workers=2",
        "algorithm.filter_groups.max_num_gen_batches=1",
    )

    def kill_when_both_run(pids):  # both programs have named themselves: they run, under these templates
        deadline = time.monotonic() + 60
        while len(threads_named(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        for p in pids:
            os.kill(p, signal.SIGKILL)

    with build_episode(cfg, tok) as episode:
        killer = threading.Thread(target=kill_when_both_run, args=(episode.runner.pids,))
        killer.start()
        with pytest.raises(
            DynamicSamplingExhausted, match="1 dropped group was void, whatever the answers: the"
        ):
            collect_batch(engine, episode, EpochSampler(len(data), shuffle=False), data, cfg, step=1)
        killer.join()
        engine.turns[0] = "<code>print(42)</code>"
        [[a, b]], _ = episode.sample(engine, data, [1], SamplingParams(n=2, max_tokens=200))
    assert (a.tool_calls, b.tool_calls) == (["ok"], ["ok"])  # fresh templates took the killed ones' place
    void = PromptGroup((1, 0), [replace(a, tool_calls=["sandbox_error"]), b])
    assert group_outcomes([void, PromptGroup((1, 1), [a, b])]) == [(1, 2, 2)]


def test_void_turns_by_simpletirs_definition(tok, data):
    """`Rollout.void_turn`: a malformed call, or a last turn with neither a closed call nor a final answer; a closed
    call is not void, past the budget or with no room left to run it. The metric counts them
    (`tool/void_turn_ratio`), malformed calls apart too."""
    cases = {
        "answered": (["<code>print(6 * 7)</code>", "Answer: 42"], 300, False),
        "wrong answer": (["<code>print(6 * 7)</code>", "Answer: 41"], 300, False),
        "no answer": (["<code>print(6 * 7)</code>", "I am not sure."], 300, True),
        "cut mid-turn": (["<code>print(6 * 7)</code>", "I think the answer is 42"], 60, True),
        "malformed": (["<code></code>", "Answer: 42"], 300, True),
        "over budget": (["<code>print(1)</code>", "<code>print(2)</code>"], 300, False),
        "no room to run": (["<code>print(6 * 7)</code>"], 30, False),
    }
    got, rollouts = {}, []
    with build_episode(_cfg("episode.tool.max_calls=1"), tok) as episode:
        for name, (turns, budget, _) in cases.items():
            [[r]], _ = episode.sample(Scripted(turns), data, [1], SamplingParams(n=1, max_tokens=budget))
            got[name] = r.void_turn
            rollouts.append(r)
    assert got == {name: void for name, (_, _, void) in cases.items()}
    assert rollouts[3].finish_reason == "length" and rollouts[-1].tool_calls == []
    assert rollouts[-2].tool_calls == ["ok", "over_budget"]
    assert rollouts[2].light().void_turn and not rollouts[0].light().void_turn  # other ranks see it too
    stats = GenerationSums.of([PromptGroup((1, 0), rollouts)]).stats(0, 1, 1)
    assert stats["tool/void_turn_ratio"] == 3 / 7
    assert stats["tool/malformed_rate"] == 1 / 7 and stats["tool/code_error_rate"] == 1 / 7


def test_the_step_line_of_a_tool_run_shows_its_tool_use():
    from dapo_rl.trainer import Trainer

    row = {
        "step": 3,
        "train/acc_mean": 0.5,
        "train/entropy": 0.0625,
        "tool/used_ratio": 0.75,
        "time/step_s": 2.0,
    }
    assert Trainer._format(row) == "step 3  acc 0.500  entropy 0.062  tool 0.750  step_s 2.00"
    del row["tool/used_ratio"]  # a run without the tool: no tool column
    assert Trainer._format(row) == "step 3  acc 0.500  entropy 0.062  step_s 2.00"
