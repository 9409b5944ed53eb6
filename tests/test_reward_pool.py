"""The reward process pool: same results as in-process scoring, hard per-answer time limits, error counting."""

import time

import pytest

from dapo_rl.data import reasoning_gym_samples
from dapo_rl.reward import compute_score
from dapo_rl.reward.pool import RewardPool, summarize
from dapo_rl.reward.score import get_verifier


def test_pool_matches_in_process_scoring():
    samples = reasoning_gym_samples("chain_sum", 40, 3, {"min_terms": 2, "max_terms": 3})
    items = []
    for i, s in enumerate(samples):
        answer = s.ground_truth if i % 3 else str(int(s.ground_truth) + 1)
        items.append((s.data_source, f"Answer: {answer}", s.ground_truth, s.extra_info))
    expected = [compute_score(*it) for it in items]
    with RewardPool("auto", num_workers=2, timeout_s=5) as pool:
        got = pool.score(items)
    assert got == expected
    assert sum(r["acc"] for r in got) == sum(1 for i in range(40) if i % 3)


def test_a_hanging_verifier_is_killed_and_the_batch_goes_on():
    items = [("x", "slow", "1", None), ("x", "fast", "1", None), ("x", "slow again", "1", None)]
    with RewardPool("reward_fixtures:hang", num_workers=1, timeout_s=1.0) as pool:
        t0 = time.monotonic()
        res = pool.score(items)
        elapsed = time.monotonic() - t0
    assert [r.get("timeout", False) for r in res] == [True, False, True]
    assert res[1]["score"] == 1.0 and res[1]["acc"] is True
    assert res[0]["score"] == -1.0 and res[0]["acc"] is False and "TimeoutError" in res[0]["error"]
    assert elapsed < 2 * (1.0 + 1.0)  # each hanging answer settled within timeout + 1 s
    assert summarize(res) == {
        "reward/error_rate": 0.0,
        "reward/timeout_rate": pytest.approx(2 / 3),
        "reward/refused_rate": 0.0,
    }


def test_answers_sent_together_keep_their_own_deadline_and_order():
    """A worker gets answers several at a time (`MAX_CHUNK`); one that hangs mid-chunk costs `timeout_s` once, one
    that kills its worker costs nothing more, and the answers after them in the chunk are scored by the replacement."""
    items = [("x", f"fast {i}", "1", None) for i in range(40)]
    items[3] = ("x", "slow", "1", None)  # inside the first chunk (40 // 4 = 10 answers)
    items[25] = ("x", "die", "1", None)
    with RewardPool("reward_fixtures:hang_or_die", num_workers=1, timeout_s=1.0) as pool:
        assert pool._sandbox._chunk_size(40) == 10
        t0 = time.monotonic()
        res = pool.score(items)
        elapsed = time.monotonic() - t0
    assert [r["score"] for r in res] == [-1.0 if i in (3, 25) else float(i) for i in range(40)]
    assert res[3]["timeout"] is True and "TimeoutError" in res[3]["error"]
    assert res[25]["error"] == "worker died" and "timeout" not in res[25]
    assert 1.0 <= elapsed < 1.0 + 1.5


def test_a_too_long_result_and_a_worker_dead_while_idle_cost_only_their_answer():
    """A result over MAX_RESULT_BYTES is named as such (not "worker died") and its neighbours keep their scores; a
    worker that died between two calls is replaced instead of raising BrokenPipeError out of `score` (review of
    issue 42's second session, m4 and m5)."""
    import os
    import signal

    items = [("x", "1", "1", None), ("x", "huge", "1", None), ("x", "2", "1", None), ("x", "1", "1", None)]
    with RewardPool("reward_fixtures:huge_pred", num_workers=1, timeout_s=5.0) as pool:
        res = pool.score(items)
        assert [r["score"] for r in res] == [1.0, -1.0, -1.0, 1.0]
        assert res[1]["error"] == "result longer than 1048576 bytes"
        os.kill(pool._sandbox.workers[0].proc.pid, signal.SIGKILL)
        pool._sandbox.workers[0].proc.join(5)
        again = pool.score(items[:1] + items[2:])
    assert [r["score"] for r in again] == [1.0, -1.0, 1.0] and all("error" not in r for r in again)


def test_user_function_by_name_and_error_counting():
    fn = get_verifier("reward_fixtures:exact")
    assert fn("42", "42")["acc"] is True
    assert fn("41", "42") == {"score": -1.0, "acc": False, "pred": "41"}
    res = [
        compute_score("reasoning_gym/no_such_task", "Answer: 1", "1", {}),
        compute_score("math_dapo", "Answer: 1", "1"),
    ]
    assert "error" in res[0] and "error" not in res[1]
    assert summarize(res) == {
        "reward/error_rate": 0.5,
        "reward/timeout_rate": 0.0,
        "reward/refused_rate": 0.0,
    }


def test_bad_verifier_names_fail_early():
    with pytest.raises(ValueError, match="unknown verifier"):
        RewardPool("mathh", num_workers=0)
    with pytest.raises(ValueError, match="cannot import"):
        RewardPool("no_such_module_xyz:f", num_workers=0)


ADVERSARIAL = [
    "Answer: " + "9^" * 40 + "9",
    "Answer: " + "(" * 5000 + "1" + ")" * 5000,
    "\\boxed{" * 20000,
    "x" * 1_000_000 + "\nAnswer: 42",
    "Answer: 10^{123456789}",
    "Answer: " + "\\frac{1}{" * 500 + "2" + "}" * 500,
    "Answer: 123456789!",
]


@pytest.mark.parametrize("verifier", ["math", "math_dapo"])
def test_adversarial_answers_settle_within_the_time_limit(verifier):
    timeout_s = 2.0
    with RewardPool(verifier, num_workers=1, timeout_s=timeout_s) as pool:
        pool.score([("math", "Answer: 1", "1", None)])  # warm the worker
        for text in ADVERSARIAL:
            t0 = time.monotonic()
            (res,) = pool.score([("math", text, "42", None)])
            assert time.monotonic() - t0 < timeout_s + 1.0, text[:40]
            assert res["score"] in (-1.0, 1.0)
    # the megabyte response does end with the right answer
    assert compute_score("math", ADVERSARIAL[3], "42")["acc"] is True


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_pool_refuses_a_timeout_that_is_not_a_finite_positive_number(bad):
    # NaN passes `timeout_s <= 0`, and then every answer would time out with the model blamed
    with pytest.raises(ValueError, match=rf"^reward.timeout_s={bad} must be a finite number > 0$"):
        RewardPool("auto", num_workers=0, timeout_s=bad)
