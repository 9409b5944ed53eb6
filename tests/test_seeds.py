"""Sampling seeds that no two requests of a run share (issue 29 item 5, `dapo_rl.rollout.seeds`)."""

from dapo_rl.rollout.seeds import SEED_BITS, Stream, request_seed, round_seed


def test_no_two_samples_of_a_run_share_a_seed():
    """Every (stream, step, round, rank, prompt, sample) of a small run gets its own seed, also in the low 32 bits
    that torch's CPU generator keeps, with vLLM's `seed + j` for sample j of a request. The old layout (base + step * 1009 + round + rank * 100003, then + i * n) gave round r + 1's
    prompt i sample j the seed of round r's prompt i sample j + 1."""
    n, prompts = 8, 6
    seen: dict[int, tuple] = {}
    for stream in Stream:
        for step in range(4):
            for round_ in range(3):
                for rank in range(3):
                    base = round_seed(0, step, round_, rank, stream)
                    assert 0 <= base < 2**SEED_BITS
                    for i in range(prompts):
                        for j in range(n):
                            # torch's CPU generator keeps the low 32 bits of a seed: they must differ too
                            key = (request_seed(base, i, n) + j) % 2**32
                            assert key not in seen, (seen[key], (stream, step, round_, rank, i, j))
                            seen[key] = (stream, step, round_, rank, i, j)
    assert len(seen) == len(Stream) * 4 * 3 * 3 * prompts * n

    def old(step, round_, rank, i, j):
        return (0 * 1_000_003 + step * 1_009 + round_ + rank * 100_003) % (2**31) + i * n + j

    assert old(0, 1, 0, 2, 3) == old(0, 0, 0, 2, 4)  # the overlap the review found


def test_the_run_seed_moves_every_stream_and_none_stays_put():
    a = {round_seed(0, s, r, 0) for s in range(3) for r in range(3)}
    b = {round_seed(1, s, r, 0) for s in range(3) for r in range(3)}
    assert len(a) == len(b) == 9 and not a & b
    assert round_seed(7, 2, 1, 0) == round_seed(7, 2, 1, 0)  # reproducible
    assert request_seed(None, 3, 4) is None and request_seed(100, 3, 4) == 112
