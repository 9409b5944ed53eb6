"""A rollout engine in its own process, for asynchronous training (`async_training.max_staleness` >= 1).

The trainer's process holds a `RemoteEngine`; a spawned child process holds the real engine (`hf` or `vllm`, built by
`build_engine` exactly as in the synchronous loop) and serves one request at a time over a pipe: sample a round,
take new weights, check weight names, close. Weights travel through a two-process torch.distributed gloo group of
their own (trainer rank 0, engine rank 1), one tensor at a time from host memory: the pipe carries each tensor's
name, shape and dtype, then a broadcast carries its bytes, and the engine moves it to its device. The group is built
from the backend class on a private `TCPStore`, not through `init_process_group`, so it neither needs nor disturbs a
default process group (vLLM's `StatelessProcessGroup` works the same way).

Why gloo on GPUs too: the push runs on the producer's thread while the trainer's thread drives FSDP2's NCCL
collectives on the same GPU, and NCCL does not allow operations on two communicators of one device from two threads
at once (NCCL user guide, "Thread safety"); the trainer's copy of the weights is in host memory anyway. Measured on
this project's 2-core machine: 1.6 GB/s over loopback (a 7B model in bf16: ~9 s per engine, overlapped with training).

`RemoteEngines` starts several such children (`rollout.n_gpus_per_node`, one GPU each), each with its own pipe and
weight group; a call to `generate` is split between them and a push goes to all of them at once, one thread per
engine.

A round comes back as two flat arrays (token ids, log-probs) and a list of each response's lengths, finish reason and
stop reason (`pack_round`), not as nested lists of Python numbers: unpickling those took the GIL for ~150 ns a token in
one C call, freezing the trainer's thread on rank 0 for seconds at DAPO's round sizes (review async-lora m6).
`unpack_round` rebuilds the lists one response at a time, so the trainer's thread gets the GIL between two responses.

The child exits when the trainer's process does: it sees the pipe close, and on Linux the kernel sends it SIGKILL
when its parent dies (`PR_SET_PDEATHSIG`), so a SIGKILLed trainer leaves no engine behind. Since it ignores SIGTERM
(and SIGINT: a terminal's Ctrl-C reaches it too, and the trainer decides),
an exit that closed nothing (an uncaught error) would hang in multiprocessing's exit hook, which joins its children
after a SIGTERM without a deadline: `dapo_rl.children` kills every engine still alive at interpreter exit first.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta

import numpy as np
import torch

from dapo_rl import children
from dapo_rl.rollout.base import GenerationAborted, GenerationOutput, RolloutEngine, SamplingParams
from dapo_rl.rollout.seeds import request_seed

TRANSPORT_TIMEOUT = timedelta(minutes=10)
"""The weight group's rendezvous and collective timeout."""

GENERATE_DEADLINE_FLOOR_S = 900.0
"""The shortest deadline of one `generate` request, seconds (an engine's first request also compiles)."""

MIN_DECODE_STEPS_PER_S = 2.0
"""The slowest decoding an engine may show before it counts as stuck: `max_tokens` steps at this rate for each batch
of `rollout.micro_batch_size` sequences decoded side by side (a stuck engine is killed; see
`RemoteEngine.generate`)."""


def generate_deadline_s(max_tokens: int, sequences: int = 1, batch: int = 1) -> float:
    """Seconds one `generate` request may take: `sequences` responses of up to `max_tokens` tokens, decoded `batch`
    at a time (`rollout.micro_batch_size`: the transformers engine's chunk, vLLM's `max_num_seqs`); the larger of
    `GENERATE_DEADLINE_FLOOR_S` and ceil(sequences / batch) x max_tokens / `MIN_DECODE_STEPS_PER_S` (one batch of
    20,480-token responses: 10,240 s)."""
    batches = -(-max(sequences, 1) // max(batch, 1))
    return max(GENERATE_DEADLINE_FLOOR_S, batches * max_tokens / MIN_DECODE_STEPS_PER_S)


CLOSE_LOCK_TIMEOUT_S = 5.0
"""Seconds `RemoteEngine.close` waits for a request in flight on another thread before it kills the process."""

_START_LOCK = threading.Lock()
"""Held while a child starts with its own `CUDA_VISIBLE_DEVICES` in this process's environment (engines start side
by side, from threads)."""


@dataclass
class EngineSpec:
    """What the engine process needs to build its engine (all picklable).

    Attributes:
        rollout: the run's `RolloutConfig`.
        model_path: the Hugging Face checkpoint the engine starts from (tokenizer included).
        max_model_len: the longest prompt + response, tokens.
        seed: the engine's base seed.
        dtype: the engine's parameter dtype (`float32`, `bfloat16`).
        trust_remote_code: `model.trust_remote_code`.
        attn_implementation: the `hf` engine's attention kernel.
        device: `cpu` or `cuda` (the child's first visible GPU).
        cuda_visible_devices: the child's `CUDA_VISIBLE_DEVICES` (None: inherited).
        num_threads: torch intra-op threads of the child (0: torch's default).
        lm_head_fp32: the `hf` engine's LM head in float32 (`actor.lm_head_fp32`).
    """

    rollout: object
    model_path: str
    max_model_len: int
    seed: int = 0
    dtype: str = "float32"
    trust_remote_code: bool = False
    attn_implementation: str | None = None
    device: str = "cpu"
    cuda_visible_devices: str | None = None
    num_threads: int = 0
    lm_head_fp32: bool = False


class WeightChannel:
    """One side of the two-process gloo weight group: rank 0 (the trainer) broadcasts, rank 1 (the engine) receives
    (host tensors; see the module's docstring for why not NCCL).

    Args:
        store: the `TCPStore` both processes reach (the trainer's is the server).
        rank: 0 for the trainer, 1 for the engine.

    Raises:
        RuntimeError: the other process did not join within `TRANSPORT_TIMEOUT`.
    """

    def __init__(self, store, rank: int):
        import torch.distributed as dist

        self.group = dist.ProcessGroupGloo(store, rank, 2, TRANSPORT_TIMEOUT)
        self._opts = dist.BroadcastOptions()
        self._opts.rootRank = 0

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Send (rank 0) or fill (rank 1) `tensor`, a contiguous CPU tensor; returns when it is done."""
        self.group.broadcast([tensor], self._opts).wait()


def pack_round(outputs: list[list[GenerationOutput]]) -> tuple:
    """`generate`'s answer as it crosses the pipe: `(counts, lengths, meta, token_ids, logprobs)`.

    Args:
        outputs: one list of responses per prompt.

    Returns:
        counts: responses per prompt (list of int); lengths: `(N, 2)` int64 array, each response's token count and
        log-prob count; meta: `(finish_reason, text, num_tokens, stop_reason)` per response; token_ids: every
        response's ids end to end, int32 (vocabularies stay below 2**31); logprobs: every log-prob end to end,
        float64 (the engines' Python floats exactly).
    """
    flat = [o for group in outputs for o in group]
    lengths = np.array([(len(o.token_ids), len(o.logprobs)) for o in flat], dtype=np.int64).reshape(-1, 2)
    ids = np.fromiter((t for o in flat for t in o.token_ids), dtype=np.int32, count=int(lengths[:, 0].sum()))
    lps = np.fromiter((x for o in flat for x in o.logprobs), dtype=np.float64, count=int(lengths[:, 1].sum()))
    meta = [(o.finish_reason, o.text, o.num_tokens, o.stop_reason) for o in flat]
    return [len(group) for group in outputs], lengths, meta, ids, lps


def unpack_round(packed: tuple) -> list[list[GenerationOutput]]:
    """`pack_round`'s inverse: equal lists of Python ints and floats, built one response at a time."""
    counts, lengths, meta, ids, lps = packed
    ends = np.cumsum(lengths, axis=0).tolist()
    flat = []
    a = b = 0
    for (a_end, b_end), (finish, text, num_tokens, stop_reason) in zip(ends, meta):
        flat.append(
            GenerationOutput(
                ids[a:a_end].tolist(), lps[b:b_end].tolist(), finish, text, num_tokens, stop_reason
            )
        )
        a, b = a_end, b_end
    out, k = [], 0
    for n in counts:
        out.append(flat[k : k + n])
        k += n
    return out


def _die_with_parent(parent: int) -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies (prctl `PR_SET_PDEATHSIG`; it follows the
    thread that started this process, the trainer's main thread under `dapo train`), and exit now if the parent
    `parent` (pid) is already gone."""
    import signal

    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)
    # `timeout`, Slurm and a terminal's Ctrl-C signal every process of the job: the trainer stops at its next step
    # boundary and still needs this engine for that step (and the checkpoint), so only the trainer reacts
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _engine_main(spec: EngineSpec, conn, port: int, parent: int, abort=None) -> None:
    """The engine process: join the weight group, build the engine, then serve requests until told to close or
    until the trainer's end of the pipe closes. Any failure during a push ends it (the tensor stream is out of
    step); a start-up refusal (`ValueError`) comes back as `value_error`."""
    _die_with_parent(parent)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the trainer's console shows its own loading already
    if spec.num_threads > 0:
        torch.set_num_threads(spec.num_threads)
    import torch.distributed as dist

    device = torch.device("cuda:0" if spec.device == "cuda" else "cpu")
    engine = None
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TRANSPORT_TIMEOUT)
        channel = WeightChannel(store, 1)
        from dapo_rl.distributed import DistContext
        from dapo_rl.models.hf import load_tokenizer
        from dapo_rl.rollout import build_engine

        tokenizer = load_tokenizer(spec.model_path, spec.trust_remote_code)
        engine = build_engine(
            spec.rollout,
            spec.model_path,
            tokenizer,
            max_model_len=spec.max_model_len,
            seed=spec.seed,
            dtype=spec.dtype,
            trust_remote_code=spec.trust_remote_code,
            ctx=DistContext(device=device),
            attn_implementation=spec.attn_implementation,
            lm_head_fp32=spec.lm_head_fp32,
        )
        engine.abort_event = abort  # set by the trainer's process (`RemoteEngine.abort`)
        conn.send(("ok", torch.get_num_threads()))
    except ValueError as e:
        conn.send(("value_error", str(e)))
        return
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the trainer is gone
                return
            kind = msg[0]
            if kind == "close":
                conn.send(("ok", None))
                return
            try:
                if kind == "generate":
                    conn.send(("ok", pack_round(engine.generate(msg[1], msg[2]))))
                elif kind == "update":
                    engine.update_weights(_received(conn, channel, device))
                    conn.send(("ok", None))
                elif kind == "check_names":
                    engine.check_weight_names(msg[1])
                    conn.send(("ok", None))
                else:
                    conn.send(("error", f"unknown request {kind!r}"))
            except GenerationAborted:
                conn.send(("aborted", None))
            except Exception as e:
                refusal = isinstance(e, ValueError)  # the trainer turns it into its own error
                conn.send(("value_error", str(e)) if refusal else ("error", traceback.format_exc()))
                if kind == "update":  # the stream of tensors is out of step: nothing more can be served
                    return
    finally:
        engine.close()


def _received(conn, channel: WeightChannel, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """The engine side of a push: for each `(name, shape, dtype)` the pipe announces, a host tensor the broadcast
    fills, on `device`; ends at the trainer's `end`."""
    while True:
        msg = conn.recv()
        if msg[0] == "end":
            return
        _, name, shape, dtype = msg
        t = torch.empty(shape, dtype=dtype)
        channel.broadcast(t)
        yield name, t.to(device)


class RemoteEngine(RolloutEngine):
    """A `RolloutEngine` served by an engine in a child process (see the module's docstring): `generate`,
    `update_weights`, `check_weight_names` and `close` go to the child, `abort` / `clear_abort` stop its `generate` in
    flight from another thread, `sleep` does nothing here. Calls are serialised by a lock, so the rollout producer's
    thread and the trainer's validation can share it; each blocks until the child answers.

    Args:
        spec: how the child builds its engine.
        start_timeout_s: seconds to wait for the child's engine to be built.
        request_timeout_s: the deadline of each `generate` (None: `generate_deadline_s` of its `max_tokens`).
        connect: wait for the child to join and build its engine now (False: the caller calls `connect`; several
            engines then start side by side). The child is started here either way: from the thread that will
            outlive it (the kernel's parent-death signal follows the starting thread, not the process).

    Raises:
        RuntimeError: the child failed to start (its traceback in the message) or died.
        ValueError: a refusal from the engine (`check_weight_names`).
    """

    def __init__(
        self,
        spec: EngineSpec,
        start_timeout_s: float = 1800.0,
        connect: bool = True,
        request_timeout_s: float | None = None,
    ):
        import multiprocessing as mp

        import torch.distributed as dist

        self.spec = spec
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        mpc = mp.get_context("spawn")
        self._conn, child = mpc.Pipe()
        self._abort = mpc.Event()
        self.proc = mpc.Process(
            target=_engine_main,
            args=(spec, child, self._store.port, os.getpid(), self._abort),
            name="dapo-engine",
            daemon=True,
        )
        # the child's GPU mask is in its environment from its first instruction (spawn copies os.environ), before
        # anything it imports could initialise CUDA with the trainer's
        with _START_LOCK:
            saved = os.environ.get("CUDA_VISIBLE_DEVICES")
            if spec.cuda_visible_devices is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = spec.cuda_visible_devices
            try:
                self.proc.start()
                children.register(self.proc)  # killed at interpreter exit if nothing closed it
            finally:
                if spec.cuda_visible_devices is not None:
                    if saved is None:
                        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                    else:
                        os.environ["CUDA_VISIBLE_DEVICES"] = saved
        child.close()
        self.num_threads = 0
        """The engine process's torch threads (once connected)."""
        if connect:
            self.connect(start_timeout_s)

    def connect(self, timeout_s: float = 1800.0) -> None:
        """Wait for the child to join the weight group and build its engine (any thread may call it).

        Raises:
            RuntimeError, ValueError: the child failed (it is killed).
        """
        try:
            self._channel = self._join(timeout_s)
            self.num_threads = self._answer(timeout_s)
        except BaseException:
            proc = self.proc
            if proc is not None:
                proc.kill()
                proc.join()
            raise

    # ------------------------------------------------------------------------------------------------- protocol
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[GenerationOutput]]:
        """`RolloutEngine.generate`, sampled in the engine process.

        Raises:
            RuntimeError: the process died, or did not answer within `request_timeout_s` (or `generate_deadline_s`
                of the request): it is killed then, since an engine that is alive but stuck (a hung collective
                inside vLLM) would otherwise hold the run forever (review async-lora m4).
        """
        timeout_s = self.request_timeout_s or generate_deadline_s(
            params.max_tokens, len(prompts) * params.n, getattr(self.spec.rollout, "micro_batch_size", 1)
        )
        with self._lock:
            self._conn.send(("generate", prompts, params))
            try:
                packed = self._answer(timeout_s)
            except RuntimeError:
                proc = self.proc
                if proc is not None:
                    children.kill(proc)
                raise
        return unpack_round(packed)

    def abort(self) -> None:
        """Stop the `generate` in flight (from any thread, without the lock): it raises `GenerationAborted`. Set with
        no request in flight, the next `generate` aborts at once (the engine clears the event when it acts on it),
        unless `clear_abort` comes first."""
        self._abort.set()

    def clear_abort(self) -> None:
        """Withdraw an `abort` the engine has not acted on."""
        self._abort.clear()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send new weights (Hugging Face names), one tensor at a time through the weight group (a tensor on a GPU
        is copied to host memory first); returns once the engine has loaded them (and reset its prefix cache)."""
        with self._lock:
            self._conn.send(("update",))
            for name, t in named_tensors:
                if not self.proc.is_alive():  # never wait on a broadcast nobody will receive
                    self._answer(0.0)
                t = t.detach().cpu().contiguous()
                self._conn.send(("tensor", name, tuple(t.shape), t.dtype))
                self._channel.broadcast(t)
            self._conn.send(("end",))
            self._answer()

    def check_weight_names(self, names: Iterable[str]) -> None:
        """The engine's own `check_weight_names` (vLLM's), run in its process.

        Raises:
            ValueError: its message.
        """
        with self._lock:
            self._conn.send(("check_names", list(names)))
            self._answer()

    def sleep(self) -> None:
        """Nothing to free: the engine has its own process (and device)."""

    def close(self, lock_timeout_s: float = CLOSE_LOCK_TIMEOUT_S) -> None:
        """Stop the engine process (its engine's own teardown runs there); idempotent, and never waits without a
        deadline: a request in flight on another thread (the producer's round) gets `lock_timeout_s` to finish,
        then the process is killed, as it is when it does not answer `close` within 60 s or exit 30 s later.
        """
        proc, self.proc = getattr(self, "proc", None), None
        if proc is None:
            return
        locked = False
        try:
            if proc.is_alive():
                locked = self._lock.acquire(timeout=lock_timeout_s)
                if locked:
                    self._conn.send(("close",))
                    self._answer(60.0, proc)
        except (RuntimeError, OSError, EOFError):
            pass
        finally:
            if locked:
                self._lock.release()
            proc.join(timeout=30 if locked else 0)
            children.kill(proc)
            self._conn.close()

    # --------------------------------------------------------------------------------------------- internals
    def _join(self, timeout_s: float) -> WeightChannel:
        """This side of the weight group, built in a helper thread (its rendezvous blocks until the child joins)
        while the pipe is watched: a child that fails first is reported with its traceback, not after the
        rendezvous timeout."""
        box: dict = {}

        def build():
            try:
                box["channel"] = WeightChannel(self._store, 0)
            except BaseException as e:
                box["error"] = e

        t = threading.Thread(target=build, name="dapo-weight-group", daemon=True)
        t.start()
        deadline = time.monotonic() + timeout_s
        while t.is_alive():
            t.join(0.5)
            if t.is_alive() and (self._conn.poll(0) or not self.proc.is_alive()):
                self._answer(0.0)  # raises the child's error (or that it died)
                raise RuntimeError("the rollout engine process answered before joining the weight group")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the rollout engine process did not join the weight group in {timeout_s:.0f} s"
                )
        if "error" in box:
            raise box["error"]
        return box["channel"]

    def _answer(self, timeout_s: float | None = None, proc=None):
        """The child's reply to the last request; its `error` becomes a RuntimeError (a `value_error`, a
        ValueError). `proc`: the child (default `self.proc`; `close` has already cleared it)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        proc = self.proc if proc is None else proc
        while not self._conn.poll(1.0):
            if proc is None or not proc.is_alive():
                code = None if proc is None else proc.exitcode
                raise RuntimeError(f"the rollout engine process died (exit code {code})")
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError(f"the rollout engine process did not answer within {timeout_s:.0f} s")
        try:
            status, value = self._conn.recv()
        except EOFError as e:
            raise RuntimeError("the rollout engine process closed its pipe") from e
        if status == "value_error":
            raise ValueError(value)
        if status == "aborted":
            raise GenerationAborted("the rollout engine process aborted the request")
        if status != "ok":
            raise RuntimeError(f"the rollout engine process failed:\n{value}")
        return value


class HostStaging:
    """Two sets of host buffers, one tensor each per weight name, written in turn with the weights published to the
    engine processes (review async-lora m2): the trainer writes a step's weights into the slot the producer is not
    pushing, so at most two copies exist, and every step after the first reuses the same pages (a fresh pageable
    copy per step pays page faults and kernel zeroing again: 1.66 GB/s against 12.0 GB/s into a reused buffer on
    this project's 2-core machine, measured in the review).

    Buffers are pageable, not pinned: torch's pinned allocator rounds each block up to a power of two and keeps it
    cached (1.9x the model's size on Qwen2.5-7B's shapes), and the push reads host memory anyway. A name whose
    shape or dtype changes gets a new buffer.
    """

    def __init__(self):
        self._slots: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] = ({}, {})

    def copy(self, slot: int, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor`'s values in `slot`'s host buffer for `name` (a blocking copy from a GPU), returned.

        Args:
            slot: 0 or 1 (`RolloutProducer.discard_pending` says which is free).
            name: the weight's name.
            tensor: the weight, on any device.
        """
        buf = self._slots[slot].get(name)
        if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
            buf = self._slots[slot][name] = torch.empty(tensor.shape, dtype=tensor.dtype)
        buf.copy_(tensor.detach())
        return buf


class RemoteEngines(RolloutEngine):
    """Several engine processes (`rollout.n_gpus_per_node` of them, one GPU each), started one after another from
    this thread and built side by side. The engine protocol on the group: `generate` splits the prompts into
    consecutive shares sampled side by side, one per engine; `update_weights` pushes to every engine at once (a
    thread each); `check_weight_names` asks every engine; `abort` and `clear_abort` reach every engine; `close`
    stops them all; `engines` lists the processes (the weight-sync probe asks each).

    Args:
        specs: one `EngineSpec` per engine process.

    Raises:
        RuntimeError, ValueError: as `RemoteEngine`, for the first engine that failed (all are stopped).
    """

    def __init__(self, specs: list[EngineSpec]):
        from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

        self._engines: list[RemoteEngine] = []
        try:
            # started from this thread (see `RemoteEngine`'s `connect`); each waits for its engine to build
            # (minutes for a big model on a GPU): they build side by side, and the first failure stops them all
            for s in specs:
                self._engines.append(RemoteEngine(s, connect=False))
            pool = ThreadPoolExecutor(max_workers=len(specs), thread_name_prefix="dapo-engine-start")
            futures = [pool.submit(e.connect) for e in self._engines]
            wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f.exception() for f in futures if f.done() and f.exception() is not None]
            if failed:
                raise failed[0]
            pool.shutdown(wait=True)
            for f in futures:
                f.result()
        except BaseException:
            for e in self._engines:
                if e.proc is not None:
                    e.proc.kill()
            self.close()
            raise

    @property
    def engines(self) -> list[RemoteEngine]:
        """The engine processes, in order (the weight-sync probe asks each; the producer splits a round over them)."""
        return self._engines

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[GenerationOutput]]:
        """`RolloutEngine.generate` over the engine processes: the prompts are split into consecutive shares, one per
        engine (sizes differing by one at most), sampled side by side (a thread each) and joined in order. The share
        starting at prompt `a` is seeded `request_seed(params.seed, a, n)` (None stays None), the seed its first
        prompt has in one engine's call, so the split draws what one engine draws: vLLM seeds every request so,
        the transformers engine every micro-batch (exactly equal when shares start at micro-batch boundaries).
        An engine whose share is empty is not asked. With one engine process: its `generate`, as it is.

        Raises:
            GenerationAborted, RuntimeError, ValueError: the first share's failure (in share order), once every
                share has ended.
        """
        engines = self.engines
        if len(engines) == 1:
            return engines[0].generate(prompts, params)
        from concurrent.futures import ThreadPoolExecutor

        bounds = [len(prompts) * j // len(engines) for j in range(len(engines) + 1)]
        shares = [(e, a, b) for e, a, b in zip(engines, bounds, bounds[1:]) if b > a]
        if not shares:
            return []
        with ThreadPoolExecutor(len(shares), thread_name_prefix="dapo-share") as pool:
            futures = [
                pool.submit(
                    e.generate, prompts[a:b], replace(params, seed=request_seed(params.seed, a, params.n))
                )
                for e, a, b in shares
            ]
        return [group for f in futures for group in f.result()]

    def abort(self) -> None:
        """`RemoteEngine.abort` on every engine process."""
        for e in self.engines:
            e.abort()

    def clear_abort(self) -> None:
        """`RemoteEngine.clear_abort` on every engine process."""
        for e in self.engines:
            e.clear_abort()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push the same weights to every engine process at once, one thread per engine over its own channel (staged
        in host memory, one copy shared by the threads): all engines take about one engine's push time, not the
        sum (review async-lora M3).

        Raises:
            RuntimeError: the first engine whose push failed (the other pushes are waited for).
        """
        tensors = [(n, t.detach().cpu().contiguous()) for n, t in named_tensors]
        if len(self.engines) == 1:
            self.engines[0].update_weights(tensors)
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(self.engines), thread_name_prefix="dapo-weight-push") as pool:
            futures = [pool.submit(e.update_weights, tensors) for e in self.engines]
        for f in futures:
            f.result()

    def check_weight_names(self, names: Iterable[str]) -> None:
        """Every engine's `check_weight_names`.

        Raises:
            ValueError: the first engine's refusal.
        """
        names = list(names)
        for e in self.engines:
            e.check_weight_names(names)

    def sleep(self) -> None:
        """Nothing to free (see `RemoteEngine.sleep`)."""

    def close(self) -> None:
        """Stop every engine process; idempotent."""
        for e in self.engines:
            e.close()
