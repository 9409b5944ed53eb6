"""How long a round's transfer from the engine process stalls the trainer's thread on rank 0 (review async-lora m6).

Run: python benchmarks/round_transfer.py [--responses 8192] [--mean-tokens 256] [--repeats 3]

A child process sends a synthetic round (`--responses` responses of about `--mean-tokens` tokens, random ids and
log-probs) through a `multiprocessing` pipe, once as nested Python lists (what `RemoteEngine` sent before) and once as
`pack_round`'s arrays, alternately. While the main thread receives it (and, for the arrays, `unpack_round` rebuilds
the lists), a second thread stands in for the trainer: it wakes every millisecond and records the longest gap between
two wake-ups. Prints, per repeat, the receive time and that longest gap for each way, and the ratios.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time

import numpy as np

from dapo_rl.rollout.base import GenerationOutput
from dapo_rl.rollout.remote import pack_round, unpack_round


def make_round(responses: int, mean_tokens: int, seed: int = 0) -> list[list[GenerationOutput]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(mean_tokens // 2, mean_tokens * 3 // 2, responses)
    flat = [
        GenerationOutput(rng.integers(0, 150_000, n).tolist(), (-rng.random(n)).tolist(), "stop")
        for n in lengths
    ]
    return [flat[i : i + 16] for i in range(0, responses, 16)]


def _sender(conn, responses: int, mean_tokens: int, ways: list[str]) -> None:
    outputs = make_round(responses, mean_tokens)
    for way in ways:
        conn.recv()  # the receiver is ready
        conn.send(outputs if way == "lists" else pack_round(outputs))
    conn.close()


class Ticker:
    """A thread that wakes every millisecond and keeps the longest gap between two wake-ups (seconds)."""

    def __init__(self):
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now

    def __enter__(self) -> Ticker:
        self._thread.start()
        time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--responses", type=int, default=8192)
    ap.add_argument("--mean-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    ways = ["lists", "arrays"] * args.repeats
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_sender, args=(there, args.responses, args.mean_tokens, ways))
    proc.start()
    there.close()
    tokens = None
    rows: dict[str, list[tuple[float, float]]] = {"lists": [], "arrays": []}
    for way in ways:
        here.send("ready")
        here.poll(None)  # the round is in the pipe: time the receive alone
        with Ticker() as ticker:
            t0 = time.perf_counter()
            got = here.recv()
            if way == "arrays":
                got = unpack_round(got)
            elapsed = time.perf_counter() - t0
        rows[way].append((elapsed, ticker.longest))
        tokens = sum(len(o.token_ids) for group in got for o in group)
    proc.join()
    print(f"{args.responses} responses, {tokens} tokens")
    print(
        f"{'repeat':>6}{'lists: receive s':>18}{'longest stall s':>17}{'arrays: receive s':>19}{'longest stall s':>17}"
    )
    for k, ((tl, sl), (ta, sa)) in enumerate(zip(rows["lists"], rows["arrays"])):
        print(f"{k:>6}{tl:>18.3f}{sl:>17.4f}{ta:>19.3f}{sa:>17.4f}")
    med = {w: np.median(np.array(r), axis=0) for w, r in rows.items()}
    print(
        f"median ratio arrays/lists: receive {med['arrays'][0] / med['lists'][0]:.2f}, "
        f"longest stall {med['arrays'][1] / med['lists'][1]:.3f}"
    )


if __name__ == "__main__":
    main()
