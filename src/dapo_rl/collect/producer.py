"""Asynchronous dynamic sampling (`async_training.max_staleness` = K >= 1): a thread of the trainer's process that
keeps the engine process generating while the actor updates.

```
producer thread:  [weights v waiting? push them] -> draw a round -> engine process samples it (version v)
                  -> verifier + shaping -> dynamic-sampling filter -> kept groups, tagged v, into the queue
                  (pauses while the queue holds K batches, or the trainer asks it to)
trainer thread:   take a batch (groups more than K versions behind the policy dropped and counted) -> update
                  -> snapshot the weights for the producer (version + 1) -> next step
```
Each group carries the policy version that sampled it (`PromptGroup.version`); a round is sampled by one version
(weights change only between rounds). Staleness of a group trained at step s is (s - 1) - version: the trainer's
policy has taken s - 1 updates when step s trains. Rows with staleness > 0 take the engine's log-probs as pi_old
(`make_train_batch` flags them; `Actor.update`). The queue is bounded at K batches, so at most K versions separate
sampler and learner apart from a round's surplus, which is dropped when it ages past K.

The queue, the sampler position, the prompt policy and the statistics of rounds not yet reported are checkpointed
(`state_dict`, taken with the producer paused at a round boundary), so `--resume` continues with the same queue and
staleness accounting.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from dapo_rl.collect.loop import (
    DynamicSamplingExhausted,
    _usable_partial,
    filter_groups,
    group_outcomes,
    is_void,
    round_params,
    void_hint,
)
from dapo_rl.collect.prompt_policy import PromptPolicy
from dapo_rl.collect.stats import GenerationSums
from dapo_rl.data import EpochSampler, PromptDataset
from dapo_rl.episode import Episode, PromptGroup, Rollout
from dapo_rl.rollout.base import GenerationAborted
from dapo_rl.rollout.seeds import round_seed


@dataclass
class _Report:
    """What the rounds finished since the last batch add up to: the next step's statistics (checkpointed)."""

    sums: GenerationSums = field(default_factory=GenerationSums)
    """Added over the rounds."""
    longest: int = 0
    rounds: int = 0
    kept: int = 0
    prompts: int = 0
    skipped: int = 0
    generate_s: float = 0.0
    score_s: float = 0.0
    push_s: float = 0.0
    """Seconds the producer spent pushing weights to the engines (all of them, at once)."""
    aborted: int = 0
    """Rounds aborted for a checkpoint, a validation or a stop (`paused(abort=True)`)."""


class GroupQueue:
    """Kept groups waiting for a step, oldest first, each with its `version`.

    Args:
        max_staleness: K; `take` drops groups more than K versions behind the policy being updated.
    """

    def __init__(self, max_staleness: int):
        self.max_staleness = max_staleness
        self.groups: deque[PromptGroup] = deque()

    def __len__(self) -> int:
        return len(self.groups)

    def fresh(self, policy_version: int) -> int:
        """Queued groups at most K versions behind `policy_version`."""
        return sum(policy_version - g.version <= self.max_staleness for g in self.groups)

    def take(self, n: int, policy_version: int) -> tuple[list[PromptGroup], list[PromptGroup]]:
        """`(batch, dropped)`: the first `n` groups at most K versions behind `policy_version` (fewer if the queue
        runs out), and the older ones passed over on the way, which leave the queue."""
        batch, dropped = [], []
        while self.groups and len(batch) < n:
            g = self.groups.popleft()
            (dropped if policy_version - g.version > self.max_staleness else batch).append(g)
        return batch, dropped


class RolloutProducer:
    """The producer thread of asynchronous DAPO (see the module's docstring), in rank 0's process.

    Args:
        engine: the engine processes (`RemoteEngines`, which split each round between them) or any one engine.
        episode: samples, scores and shapes each round (its reward pool is used from this thread).
        sampler: the training prompts' epoch order (advanced by each round).
        dataset: the training prompts.
        step_cfg: returns the settings of the next round (the run's, or the CAMPO stage's).
        policy: the prompt-sampling policy (which prompts, how many per round).
        max_staleness: K >= 1.
        version: the policy version the engine holds at start (the resumed step, or 0).
        log: where notes go.
        world_size: the trainer's ranks (a partial batch's sequences must split evenly over them).

    The sampler, the policy and the queue belong to this thread while it runs: read or change them only inside
    `paused()`.
    """

    def __init__(
        self,
        engine,
        episode: Episode,
        sampler: EpochSampler,
        dataset: PromptDataset,
        step_cfg: Callable[[], object],
        policy: PromptPolicy,
        max_staleness: int,
        version: int = 0,
        log: Callable[[str], None] = print,
        world_size: int = 1,
    ):
        self.engine, self.episode, self.sampler, self.dataset = engine, episode, sampler, dataset
        self.step_cfg, self.policy, self.log = step_cfg, policy, log
        self.world_size = world_size
        self.queue = GroupQueue(max_staleness)
        self.engine_version = version
        self.learner_version = version
        """The policy version the next batch is taken for (staleness is counted against it)."""
        self.rounds_total = 0
        self._cv = threading.Condition()
        self._pending: tuple[int, list, int] | None = None  # (version, [(name, tensor)], slot) for the engine
        self._pushing: int | None = None  # the staging slot being pushed now
        self._generating = False  # the engines are sampling a round (an abort can stop it)
        self._pause = 0
        self._idle = True
        self._stop = False
        self._error: BaseException | None = None
        self._exhausted = False
        self._thread: threading.Thread | None = None
        self._busy: list[tuple[float, float]] = []  # the engine's generation intervals (perf_counter)
        self._gen_started: float | None = None
        self._report = _Report()
        self._rounds_since_batch = 0
        self._void_since_batch = 0
        self._kept_total = 0

    # ----------------------------------------------------------------------------------------- trainer's side
    def start(self) -> None:
        """Start generating (a daemon thread)."""
        self._thread = threading.Thread(target=self._run, name="dapo-rollout-producer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop after the round in progress and wait for the thread (idempotent).

        Args:
            timeout_s: wait at most this long (None: until the round ends); the thread is a daemon, so one still
                running then ends with the engines it waits on (`RemoteEngines.close` kills them).
        """
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if not self._thread.is_alive():
                self._thread = None

    def publish(self, weights: list, version: int, slot: int = 0) -> None:
        """Hand the producer the weights of policy `version` (`(name, tensor)` pairs the producer owns from now on:
        copies, not the actor's parameters, staged in `slot` of `dapo_rl.rollout.remote.HostStaging`); it pushes
        them before its next round. A newer call replaces weights not yet pushed."""
        with self._cv:
            self._pending = (version, weights, slot)
            self.learner_version = max(self.learner_version, version)
            self._cv.notify_all()

    @contextlib.contextmanager
    def paused(self, raise_error: bool = True, abort: bool = False):
        """Inside: the producer is idle at a round boundary, so the sampler, the policy, the queue and the engine may
        be used from the trainer's thread.

        Args:
            raise_error: raise what the producer's thread raised (if it did) on entering; False: enter anyway
                (a checkpoint is still written; its sampler may have passed over the failed round's prompts), and
                call `raise_error` afterwards.
            abort: abort the round in flight instead of waiting for it (review async-lora m3: a checkpoint, a
                validation or a stop then waits seconds, not a whole round): the engines stop sampling
                (`RemoteEngines.abort`), and the round's draw is undone (the sampler, the prompt policy and the
                round count as at its start), so the same prompts are drawn again, with the same seeds, when it
                resumes; counted in `async/aborted_rounds`. A round already scoring finishes.
        """
        with self._cv:
            self._pause += 1
            self._cv.notify_all()
            if abort and not self._idle and self._generating:
                self.engine.abort()
            while not self._idle and self._error is None:
                self._cv.wait()
            if abort:  # the round may have been past sampling: nothing may abort the trainer's
                self.engine.clear_abort()  # own requests (validation, the probe)
        try:
            if raise_error:
                self.raise_error()
            yield self
        finally:
            with self._cv:
                self._pause -= 1
                self._cv.notify_all()

    def discard_pending(self) -> int:
        """Drop published weights not yet pushed (before building newer ones: never more than two copies) and
        return the staging slot the next ones may be written to: the one not being pushed now."""
        with self._cv:
            self._pending = None
            return 0 if self._pushing is None else 1 - self._pushing

    def push_pending(self) -> None:
        """Inside `paused()`: give the engine the newest published weights now (before validating)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self.engine.update_weights(pending[1])
            self.engine_version = pending[0]

    def next_batch(self, want: int, policy_version: int) -> tuple[list[PromptGroup], dict]:
        """The next step's batch: wait until the queue holds `want` groups at most K versions behind
        `policy_version`, take them, and report the rounds generated since the previous call.

        Returns:
            `(groups, stats)`: the batch (oldest first) and the step's statistics (`collect_batch`'s keys over the
            rounds finished since the previous batch, plus `async/*` and `time/wait_s`, the seconds the trainer
            waited).

        Raises:
            DynamicSamplingExhausted: `max_num_gen_batches` rounds in a row did not complete a batch (and
                `on_exhausted` is `error`); whatever the producer's thread raised.
        """
        t0 = time.perf_counter()
        c = self.step_cfg()
        fg, n = c.algorithm.filter_groups, c.rollout.n
        with self._cv:
            self.learner_version = policy_version
            self._cv.notify_all()
            while self.queue.fresh(policy_version) < want and self._error is None and not self._exhausted:
                self._cv.wait()
            self.raise_error()
            fresh = self.queue.fresh(policy_version)
            if fresh < want:  # exhausted
                usable = _usable_partial(fresh, n, self.world_size)
                if fg.on_exhausted != "partial" or not usable:
                    raise DynamicSamplingExhausted(
                        f"dynamic sampling completed no batch of {want} groups in {self._rounds_since_batch} "
                        f"generation rounds (algorithm.filter_groups.max_num_gen_batches={fg.max_num_gen_batches}; "
                        f"{fresh} groups queued): the other groups' responses were all right or all wrong. Raise "
                        "max_num_gen_batches (0 = unlimited) or data.gen_batch_size, or set algorithm.filter_groups."
                        "on_exhausted=partial." + void_hint(self._void_since_batch)
                    )
                self.log(
                    f"dynamic sampling: {fresh}/{want} groups queued after {self._rounds_since_batch} rounds."
                    + void_hint(self._void_since_batch)
                )
                want = usable
            batch, dropped = self.queue.take(want, policy_version)
            # from now on the producer fills the queue for the next step's take (policy_version + 1): groups that
            # take will drop no longer count as fresh, so it does not idle through the update (review m1)
            self.learner_version = max(self.learner_version, policy_version + 1)
            self._exhausted = False
            self._rounds_since_batch = self._void_since_batch = 0
            rep, self._report = self._report, _Report()
            queued = len(self.queue)
            self._cv.notify_all()  # room in the queue
        stale_tokens = sum(x.response_length for g in dropped for x in g.rollouts)
        stats = rep.sums.stats(rep.longest, rep.rounds, rep.kept, stale_tokens)
        staleness = [policy_version - g.version for g in batch]
        stats |= {
            "train/kept_groups": len(batch),
            "train/gen_prompts": rep.prompts,
            "train/skipped_prompts": rep.skipped,
            "time/generate_s": rep.generate_s,
            "time/score_s": rep.score_s,
            "async/push_s": rep.push_s,
            "async/aborted_rounds": rep.aborted,
            "time/wait_s": time.perf_counter() - t0,
            "async/staleness_mean": sum(staleness) / max(len(staleness), 1),
            "async/staleness_max": max(staleness, default=0),
            "async/dropped_stale_groups": len(dropped),
            "async/queue_groups": queued,
            "async/engine_version": self.engine_version,
        }
        if self.policy.kept_rate is not None:
            stats["train/kept_rate"] = self.policy.kept_rate
        return batch, stats

    def busy_seconds(self, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] (`time.perf_counter`) during which the engine was generating for this producer."""
        with self._cv:
            spans = list(self._busy)
            if self._gen_started is not None:
                spans.append((self._gen_started, t1))
        return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in spans)

    def state_dict(self) -> dict:
        """Inside `paused()`: the queue (groups with their versions, token ids and log-probs), the statistics of the
        rounds not yet reported, and the round counters; plain lists (loadable with `weights_only`)."""
        return {
            "queue": [[list(g.key), g.version, [x.state() for x in g.rollouts]] for g in self.queue.groups],
            "rounds_total": self.rounds_total,
            "rounds_since_batch": self._rounds_since_batch,
            "void_since_batch": self._void_since_batch,
            "kept_total": self._kept_total,
            "exhausted": self._exhausted,
            "report": asdict(self._report),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` (before `start`); the groups' prompts come from this producer's dataset."""
        self.queue.groups = deque(
            PromptGroup(tuple(key), [self._rollout_from(x) for x in rs], version=int(version))
            for key, version, rs in state.get("queue", [])
        )
        self.rounds_total = int(state.get("rounds_total", 0))
        self._rounds_since_batch = int(state.get("rounds_since_batch", 0))
        self._void_since_batch = int(state.get("void_since_batch", 0))
        self._kept_total = int(state.get("kept_total", 0))
        self._exhausted = bool(state.get("exhausted", False))
        report = dict(state.get("report", {}))
        if "sums" in report:  # by name, or a list from an older checkpoint
            report["sums"] = GenerationSums.from_state(report["sums"])
        self._report = _Report(**report)

    def _rollout_from(self, state: dict | list) -> Rollout:
        pi = state["problem_idx"] if isinstance(state, dict) else state[0]
        return Rollout.from_state(state, self.dataset.samples[pi], self.dataset.prompt_ids[pi])

    # ----------------------------------------------------------------------------------------- producer's side
    @property
    def error(self) -> BaseException | None:
        """What the producer's thread raised, if anything (it stopped then)."""
        return self._error

    def raise_error(self) -> None:
        """Raise what the producer's thread raised, if anything."""
        if self._error is not None:
            raise self._error

    def _full(self) -> bool:
        """The queue holds K batches still fresh for the learner: generating more would only age (groups already
        too old do not count, else they could block the producer while the trainer waits for fresh ones)."""
        c = self.step_cfg()
        return self.queue.fresh(self.learner_version) >= self.queue.max_staleness * c.data.train_batch_size

    def _sample(self, c, indices: list[int]) -> tuple[list[list[Rollout]], float]:
        """One round's groups, scored, and the seconds spent generating them (`Episode.sample`; several engine
        processes split the round between them, `RemoteEngines.generate`); scoring follows, on this thread."""
        # step 0 is no training step's: the asynchronous rounds have seeds of their own, numbered across the run
        seed = round_seed(c.trainer.seed, 0, self.rounds_total, 0)
        return self.episode.sample(self.engine, self.dataset, indices, round_params(c, seed), overlap=False)

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._stop and (self._pause or self._full() or self._exhausted):
                        if not self._idle:
                            self._idle = True
                            self._cv.notify_all()
                        self._cv.wait()
                    if self._stop:
                        self._idle = True
                        self._cv.notify_all()
                        return
                    self._idle = False
                    pending, self._pending = self._pending, None
                    self._pushing = None if pending is None else pending[2]
                if pending is not None:
                    t0 = time.perf_counter()
                    try:
                        self.engine.update_weights(pending[1])
                    finally:
                        with self._cv:
                            self._pushing = None
                            self._report.push_s += time.perf_counter() - t0
                    self.engine_version = pending[0]
                    del pending
                self._round()
        except BaseException as e:  # the trainer's thread raises it at its next call
            with self._cv:
                self._error = e
                self._idle = True
                self._cv.notify_all()

    def _round(self) -> None:
        """One generation round: draw, sample with the engine's current weights, score, filter, queue."""
        c = self.step_cfg()
        fg = c.algorithm.filter_groups
        want = c.data.train_batch_size
        start = (self.rounds_total, self.sampler.state_dict(), self.policy.state_dict())  # undone on abort
        self.rounds_total += 1
        with self._cv:  # the trainer's `take` changes the queue under the lock
            need = max(1, self.queue.max_staleness * want - self.queue.fresh(self.learner_version))
        size = self.policy.round_size(need, c.data.gen_batch_size, 1)
        indices, passed = self.policy.draw(self.sampler, size)
        version = self.engine_version
        scored_before = self.episode.seconds
        with self._cv:  # an abort from here on is this round's (`paused` reads `_generating` under the lock)
            self._gen_started = time.perf_counter()
            self._generating = True
            self.engine.clear_abort()
        try:
            sampled, gen_s = self._sample(c, indices)
        except GenerationAborted:
            self.rounds_total = start[0]
            self.sampler.load_state_dict(start[1])
            self.policy.load_state_dict(start[2])
            with self._cv:
                self._gen_started = None
                self._report.aborted += 1
            return
        finally:
            with self._cv:
                self._generating = False
        with self._cv:  # (scoring ran after generation: the engine was busy for gen_s of it)
            self._busy.append((self._gen_started, self._gen_started + gen_s))
            self._gen_started = None
            del self._busy[:-64]
        groups = [PromptGroup((self.rounds_total, p), g, version=version) for p, g in enumerate(sampled)]
        kept, filtered = filter_groups(groups, fg)
        self.policy.record(
            len(indices) - sum(map(is_void, groups)),
            len(kept),
            group_outcomes(groups) if self.policy.needs_outcomes else [],
        )
        sums = GenerationSums.of(groups, filtered)
        with self._cv:
            self.queue.groups.extend(kept)
            rep = self._report
            rep.sums = rep.sums + sums
            rep.longest = max([rep.longest] + [x.model_length for g in groups for x in g.rollouts])
            rep.rounds += 1
            rep.kept += len(kept)
            rep.prompts += len(indices)
            rep.skipped += passed
            rep.generate_s += gen_s
            rep.score_s += self.episode.seconds - scored_before
            before = self._kept_total // want
            self._kept_total += len(kept)
            self._rounds_since_batch = (
                0 if self._kept_total // want > before else self._rounds_since_batch + 1
            )
            self._void_since_batch = (
                0 if self._rounds_since_batch == 0 else self._void_since_batch + sum(map(is_void, groups))
            )
            if fg.max_num_gen_batches > 0 and self._rounds_since_batch >= fg.max_num_gen_batches:
                self._exhausted = True
            self._cv.notify_all()
