"""Step batching (continuous batching) of greedy requests: rows join the running batch at the
next decoder step and leave it the step they finish, answered at once.

    steps = StepsDecoder.open(generator)                 # the bundle's decoder.steps.onnx
    batcher = StepBatcher(generator, steps, BatchSettings(max_batch=32, max_wait_ms=5))
    batcher.start()
    future = batcher.submit(["hello", "world"], GenerationOptions(), timeout_s=30)
    future.result()            # list[Result], one per text, in order: generate's answer
    batcher.close()            # runs what is queued and in flight, then stops the thread

One thread runs the loop: take the queued requests that fit (up to `max_batch` rows in
flight and, if `max_batch_tokens` is set, up to that many source tokens (with </s>) in the
rows in flight; a request's inputs join together, in arrival order, and a request over
either bound joins an empty batch alone; when nothing is in flight the first request waits
up to `max_wait_ms` for others), run the encoder once on the inputs that join, add them to
the live batch (runtime/serve/live_batch.py), run one decoder step for every row, choose
each row's arg-max token, and answer every request whose last row ended
(`</s>` or its token budget). Each row keeps its own position, budget (`max_new_tokens`),
source and target language, forced prefix (`forced_target_ids`: taken with log-probability 0,
as runtime/prefix.py forces it) and score, so requests with different greedy options and
languages share the batch, and a row's tokens and score are those `Generator.generate` gives
it (fp32; int8 quantizes activations over the batch, as whole-request batching does). Beam
search and sampling stay on the whole-request `Batcher`: `SplitBatcher` routes each request
to the one that runs it, and makes both queues (runtime/serve/queue.py) count against one
`max_queue` limit.

A request still queued past its deadline is dropped unrun; rows of a request past its
deadline leave the batch (the server has answered 504). If a step fails, every request in
flight is run again alone with `generate`, so only the failing one gets the error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from ..errors import EdgeseqError, OptionsError
from ..generator import Generator, Result
from ..results import Candidate, Source
from ..search import GenerationOptions, log_softmax, normalized_score, step_budget
from .batcher import Batcher, BatchSettings, RequestTimeoutError, run_merged
from .live_batch import LiveBatch, StepsDecoder
from .queue import BoundedQueue, QueueLimit

BATCHING_MODES = ("auto", "step", "request")
# (rows in the step, inputs that joined, tokens chosen, seconds) after every decoder step
OnStep = Callable[[int, int, int, float], None]


def steps_decoder(generator: Generator, batching: str) -> StepsDecoder | None:
    """The steps decoder that `batching` ("auto", "step", "request") asks for: "auto" opens it
    when the bundle has one for the served variant; "step" insists (OptionsError otherwise)."""
    if batching not in BATCHING_MODES:
        raise OptionsError(f"unknown batching {batching!r}; choose one of {BATCHING_MODES}")
    steps = None if batching == "request" else StepsDecoder.open(generator)
    if steps is None and batching == "step":
        raise OptionsError(
            f"{generator.bundle.path} has no step-batching decoder for variant "
            f"{generator.variant!r}; export one with edgeseq export CHECKPOINT --out BUNDLE "
            "--variants fp32,int8,steps, or serve with --batching request"
        )
    return steps


@dataclass(eq=False)
class StepJob:
    """One request: its inputs, options, deadline, and the results filled as rows end."""

    texts: list[str]
    options: GenerationOptions
    deadline: float  # time.monotonic() after which it is dropped
    tokens: int = 0  # source tokens with </s>, for the token budget
    arrived: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)
    results: list[Result | None] = field(default_factory=list)
    pending: int = 0  # rows not finished

    def answer(self, index: int, result: Result) -> None:
        """Fill input `index`'s result; settle the future with the last one."""
        self.results[index] = result
        self.pending -= 1
        if self.pending == 0 and not self.future.done():
            self.future.set_result(list(self.results))


@dataclass(eq=False)
class Row:
    """One input in flight: its request, index there, source, budget and tokens so far."""

    job: StepJob
    index: int
    source: Source
    budget: int  # decoder steps allowed
    last: int  # the token fed next (<s> first)
    forced: tuple[int, ...] = ()  # the first tokens, forced: target language, target_prefix
    tokens: list[int] = field(default_factory=list)
    logprob: float = 0.0
    steps: int = 0


class StepBatcher:
    """A bounded queue of greedy requests and the thread that runs them by decoder steps."""

    def __init__(
        self,
        generator: Generator,
        steps: StepsDecoder,
        settings: BatchSettings | None = None,
        on_step: OnStep | None = None,
    ) -> None:
        self.generator, self.steps = generator, steps
        self.settings = settings or BatchSettings()
        self.on_step = on_step
        self.queue: BoundedQueue[StepJob] = BoundedQueue(self.settings.max_queue)
        self._thread: threading.Thread | None = None

    @property
    def queued_inputs(self) -> int:
        """Inputs waiting to join the batch."""
        return self.queue.queued_inputs

    def start(self) -> None:
        """Start the thread that runs the batch."""
        self._thread = threading.Thread(target=self._work, name="edgeseq-steps", daemon=True)
        self._thread.start()

    def submit(
        self, texts: list[str], options: GenerationOptions, timeout_s: float, tokens: int = 0
    ) -> Future:
        """Queue a greedy request; its future gets list[Result] (one per text) or an
        exception. Raises QueueFullError when the queue cannot take `len(texts)` more inputs.
        `tokens`: its source tokens with </s> (what `max_batch_tokens` counts, as for
        Batcher.submit; 0 leaves the request out of the budget). Unset options take the
        bundle's defaults (`Generator.resolve`)."""
        options = self.generator.resolve(options)
        if options.method != "greedy" or options.has_rules or options.split_sentences:
            raise OptionsError(
                "step batching runs greedy requests on whole inputs without token rules; send "
                "this one to Batcher"
            )
        job = StepJob(list(texts), options, time.monotonic() + timeout_s, tokens)
        self.queue.put(job, len(texts))
        return job.future

    def close(self, timeout_s: float | None = None) -> None:
        """Stop taking requests, finish the queued and running ones, and join the thread."""
        self.queue.close()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def warm_up(self, text: str) -> None:
        """Run `text` through a batch of its own (the first runs of the steps graph allocate)."""
        batch, row = LiveBatch(self.steps), self.generator.encode(text, truncate=True)
        batch.join([row.ids])
        batch.step(np.array([self.generator.config.start_id]))

    # -- the loop ---------------------------------------------------------------------------
    def _work(self) -> None:
        batch = LiveBatch(self.steps)
        rows: list[Row | None] = []  # the row in each slot of the batch (None: free)
        done: list[int] = []  # slots whose rows ended at the last step
        while True:
            ended = set(done)
            flight = [r for slot, r in enumerate(rows) if r is not None and slot not in ended]
            jobs = self._take(len(flight), sum(len(r.source.ids) for r in flight))
            if jobs is None:
                return
            try:
                rows, done = self._step(batch, rows, done, jobs)
            except Exception:  # find the culprit: each request in flight alone
                flight = list({id(r.job): r.job for r in rows if r is not None}.values())
                self._run_alone(flight + [j for j in jobs if j not in flight])
                batch, rows, done = LiveBatch(self.steps), [], []

    def _take(self, in_flight: int, in_flight_tokens: int) -> list[StepJob] | None:
        """The queued jobs that join at this step, in arrival order, while the rows in flight
        stay within max_batch and their source tokens within max_batch_tokens (a request
        over either joins an empty batch, alone). When nothing is in flight: wait for work,
        then up to max_wait_ms for company. None once closing with nothing left."""
        settings, budget = self.settings, self.settings.max_batch_tokens
        rows, tokens, taken = in_flight, in_flight_tokens, []

        def fits(more_rows: int, more_tokens: int) -> bool:
            within = budget is None or tokens + more_tokens <= budget
            return rows + more_rows <= settings.max_batch and within

        def full(queued: Sequence[StepJob]) -> bool:  # no room would be left: stop waiting
            more_tokens = tokens + sum(job.tokens for job in queued)
            return rows + sum(len(job.texts) for job in queued) >= settings.max_batch or (
                budget is not None and more_tokens >= budget
            )

        if not in_flight:
            free = time.monotonic()
            first = self.queue.pop_oldest()
            if first is None:
                return None
            taken, rows, tokens = [first], len(first.texts), first.tokens
            self.queue.wait(max(first.arrived, free) + settings.max_wait_ms / 1000, full)
        blocked = False  # once a job does not fit, the later ones wait behind it

        def joins(job: StepJob) -> bool:
            nonlocal rows, tokens, blocked
            blocked = blocked or not fits(len(job.texts), job.tokens)
            if not blocked:
                rows, tokens = rows + len(job.texts), tokens + job.tokens
            return not blocked

        taken += self.queue.take(joins)
        return [job for job in taken if self._runnable(job)]

    @staticmethod
    def _runnable(job: StepJob) -> bool:
        """Mark `job` running; False (and its future settled) if cancelled or past its deadline."""
        if not job.future.set_running_or_notify_cancel():
            return False
        if time.monotonic() > job.deadline:
            job.future.set_exception(RequestTimeoutError("timed out waiting in the queue"))
            return False
        return True

    def _rows(self, job: StepJob) -> list[Row]:
        """Rows of `job`'s inputs to run; skipped inputs are answered now (encoding errors
        settle the job's future and give no rows)."""
        gen, options = self.generator, job.options
        try:
            lang = options.source_lang
            sources = [gen.encode(gen.task_text(text, options), options.truncate, lang)
                       for text in job.texts]  # fmt: skip
            forced = tuple(gen.target_prefix(options))
        except EdgeseqError as exc:
            job.future.set_exception(exc)
            return []
        job.results = [Result.skipped_result(s) if s.skipped else None for s in sources]
        budget = step_budget(gen.step_model, options.max_new_tokens)
        rows = [
            Row(job, i, s, budget, gen.config.start_id, forced)
            for i, s in enumerate(sources)
            if not s.skipped
        ]
        job.pending = len(rows)
        if not rows:
            job.future.set_result(list(job.results))
        return rows

    def _step(
        self, batch: LiveBatch, rows: list[Row | None], done: list[int], jobs: list[StepJob]
    ) -> tuple[list[Row | None], list[int]]:
        """Free the slots of ended and late rows, admit `jobs`, run one decoder step, answer
        the rows that end; return the row of each slot and the slots that ended."""
        now = time.monotonic()
        late = {id(r.job): r.job for r in rows if r is not None and now > r.job.deadline}
        for job in late.values():
            if not job.future.done():
                job.future.set_exception(RequestTimeoutError("no answer within the timeout"))
        done = done + [i for i, r in enumerate(rows) if r is not None and id(r.job) in late]
        batch.leave(done)
        for slot in done:
            rows[slot] = None
        joining = [row for job in jobs for row in self._rows(job)]
        started = time.perf_counter()
        slots = batch.join([r.source.ids for r in joining])
        rows += [None] * (batch.rows - len(rows))
        for slot, row in zip(slots, joining, strict=True):
            rows[slot] = row
        order = batch.compact()
        if order is not None:
            rows = [rows[i] for i in order]
        batch.trim()
        live = [i for i, r in enumerate(rows) if r is not None]
        if not live:
            return rows, []
        pad = self.generator.config.pad_id
        logits = batch.step(np.array([r.last if r else pad for r in rows], np.int64))[live]
        chosen = logits.argmax(axis=-1)  # (B,) as choose_argmax
        logprobs = log_softmax(logits)[np.arange(len(live)), chosen]
        seconds = time.perf_counter() - started
        done = []
        eos = self.generator.config.eos_id
        for slot, token, lp in zip(live, chosen.tolist(), logprobs, strict=True):
            row = rows[slot]
            assert row is not None
            if row.steps < len(row.forced):
                token, lp = row.forced[row.steps], 0.0
            row.logprob += lp
            row.steps += 1
            if token != eos:
                row.tokens.append(token)
                row.last = token
            if token == eos or row.steps == row.budget:
                row.job.answer(row.index, self._result(row, token == eos))
                done.append(slot)
        if self.on_step is not None:
            self.on_step(len(live), len(joining), len(live), seconds)
        return rows, done

    def _result(self, row: Row, finished: bool) -> Result:
        """The Result `generate` gives for this row's tokens (runtime/generator.py)."""
        tokens, penalty = tuple(row.tokens), row.job.options.length_penalty
        score = normalized_score(row.logprob, len(tokens) + finished, penalty)
        text = self.generator.tokenizers.target.decode(tokens)
        best = Candidate(text, tokens, score, float(row.logprob), finished)
        return Result(text, tokens, score, float(row.logprob), finished, (best,), row.source)

    def _run_alone(self, jobs: list[StepJob]) -> None:
        """Answer each unanswered job with its own whole-request `generate` call."""
        for job in jobs:
            if job.future.done():
                continue
            outcome = run_merged(
                self.generator, [(job.texts, job.options)], self.settings.max_batch
            )[0]
            if isinstance(outcome, Exception):
                job.future.set_exception(outcome)
            else:
                job.future.set_result(outcome)


class SplitBatcher:
    """Greedy requests to a `StepBatcher`, the others to a `Batcher`, behind Batcher's
    interface (`submit`, `start`, `close`, `queued_inputs`, `on_batch`)."""

    def __init__(self, requests: Batcher, steps: StepBatcher) -> None:
        """Both batchers' queues count against one limit of `requests.settings.max_queue`
        inputs (their queues must be empty)."""
        self.requests, self.steps = requests, steps
        self.settings = requests.settings
        self.limit = QueueLimit(self.settings.max_queue)
        requests.queue.use_limit(self.limit)
        steps.queue.use_limit(self.limit)

    @property
    def on_batch(self) -> Callable[[int, int, float], None] | None:
        """The whole-request batcher's callback after each engine call."""
        return self.requests.on_batch

    @on_batch.setter
    def on_batch(self, callback: Callable[[int, int, float], None] | None) -> None:
        self.requests.on_batch = callback

    @property
    def queued_inputs(self) -> int:
        """Inputs waiting in both queues."""
        return self.limit.used

    def start(self) -> None:
        """Start both batchers' threads."""
        self.requests.start()
        self.steps.start()

    def submit(
        self, texts: list[str], options: GenerationOptions, timeout_s: float, tokens: int = 0
    ) -> Future:
        """Queue a request with the batcher that runs it; QueueFullError when both queues
        together cannot take `len(texts)` more inputs."""
        # the step batcher runs no token rules (runtime/rules.py), and whole inputs
        plain = options.method == "greedy"
        plain = plain and not (options.has_rules or options.split_sentences)
        target = self.steps if plain else self.requests
        return target.submit(texts, options, timeout_s, tokens)

    def close(self, timeout_s: float | None = None) -> None:
        """Stop taking requests; run everything queued and in flight; join the threads."""
        self.steps.queue.close()  # both refuse new requests before either drains
        self.requests.queue.close()
        self.steps.close(timeout_s)
        self.requests.close(timeout_s)
