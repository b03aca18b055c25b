"""Step batching (issue 38 item 4): greedy requests join the running batch at the next decoder
step and leave it when done (runtime/serve/continuous.py, live_batch.py). Requests arriving
at different times get what offline `Generator.generate` gives them (fp32: identical ids,
scores within SCORE_TOLERANCE: the padded cache changes the order of float sums); the queue
bound, the drain at close, timeouts and a failing step behave as with whole-request batching.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import Future

import numpy as np
import onnxruntime as ort
import pytest

from edgeseq.runtime.errors import OptionsError
from edgeseq.runtime.generator import Generator, Result
from edgeseq.runtime.search import GenerationOptions
from edgeseq.runtime.serve.batcher import (
    BatchSettings,
    QueueFullError,
    RequestTimeoutError,
    ShuttingDownError,
)
from edgeseq.runtime.serve.continuous import StepBatcher, steps_decoder
from edgeseq.runtime.serve.live_batch import DeviceTensors, HostTensors, LiveBatch, StepsDecoder

SCORE_TOLERANCE = 1e-5
LETTERS = "abcdefghij"


@pytest.fixture(scope="module")
def generator(steps_bundle) -> Generator:
    return Generator.load(steps_bundle, providers="cpu", threads=1)


def assert_same(got: list[Result], want: list[Result]) -> None:
    """Equal results: ids, text, flags and source exactly, scores within SCORE_TOLERANCE."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g.token_ids, g.text, g.finished, g.source) == (
            w.token_ids,
            w.text,
            w.finished,
            w.source,
        )
        assert (
            abs(g.score - w.score) <= SCORE_TOLERANCE
            and abs(g.logprob - w.logprob) <= SCORE_TOLERANCE
        )
        assert len(g.nbest) == len(w.nbest)


def random_requests(count: int, seed: int = 0) -> list[tuple[list[str], GenerationOptions]]:
    """Greedy requests of 1-3 words with mixed budgets, penalties, truncation and inputs that
    are not run (empty, only unknown symbols)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 9)))
                 for _ in range(rng.randint(1, 3))]  # fmt: skip
        if i % 11 == 0:
            words.append("" if i % 22 else "???")
        if i % 13 == 0:
            words.append(LETTERS * 3)  # over max_len: cut with truncate
        options = GenerationOptions(
            max_new_tokens=rng.choice([None, None, 2, 5]),
            length_penalty=rng.choice([1.0, 0.6]),
            truncate=i % 13 == 0,
        )
        out.append((words, options))
    return out


@pytest.mark.parametrize("where", ["host", "device"])
def test_staggered_requests_get_what_offline_generate_gives(
    generator, where: str, monkeypatch
) -> None:
    """Requests arrive between the decoder steps of the running batch: after each step, the
    step callback queues the next 0-2 requests (at least one when every request queued so
    far is answered, so the batch never runs dry before the last). Queued by the batcher's
    own thread, each joins at the next step whatever the machine's speed, so the steps run
    are the same on every run. "device": the live batch keeps its K/V as OrtValues (CUDA's
    code, on the CPU provider), over fewer requests."""
    if where == "device":
        monkeypatch.setattr(StepsDecoder, "tensors", lambda steps: DeviceTensors(steps, "cpu"))
    requests = random_requests(90 if where == "host" else 40)
    rng = random.Random(1)
    futures: list[Future] = []
    all_queued = threading.Event()
    steps_seen: list[tuple[int, int, int, float]] = []

    def submit_next(count: int) -> None:
        for texts, options in requests[len(futures) : len(futures) + count]:
            futures.append(batcher.submit(texts, options, 60))
        if len(futures) == len(requests):
            all_queued.set()

    def on_step(*step) -> None:
        steps_seen.append(step)
        count = rng.choice([0, 0, 1, 1, 2])
        submit_next(max(count, 1) if all(f.done() for f in futures) else count)

    batcher = StepBatcher(
        generator, steps_decoder(generator, "step"), BatchSettings(max_batch=8, max_wait_ms=2),
        on_step,
    )  # fmt: skip
    submit_next(1)
    batcher.start()
    try:
        assert all_queued.wait(120), f"{len(futures)} of {len(requests)} requests queued"
        for (texts, options), future in zip(requests, futures, strict=True):
            assert_same(future.result(60), generator.generate(texts, options))
    finally:
        batcher.close()
    rows = np.array([s[0] for s in steps_seen])
    joined = np.array([s[1] for s in steps_seen])
    assert joined.sum() == sum(1 for t, _ in requests for w in t if w and w != "???")
    assert ((joined > 0) & (rows > joined)).sum() > 10, "rows never joined a running batch"
    assert rows.max() <= 8 + 2 and rows.mean() > 2


@pytest.mark.parametrize("where", ["host", "device"])
def test_rows_at_different_positions_share_one_step(generator, where: str) -> None:
    """The live batch itself: four sources joining at steps 0, 2, 3 and 5 (the last one in
    the slot the first frees at step 4), give at every step the logits each gets alone
    through decoder.onnx; compaction and trimming keep them so. "device": the K/V as
    OrtValues edited by graphs on the provider (what CUDA runs), here on the CPU."""
    sources = [generator.encode(t).ids for t in ("abcdefgh", "hij", "abcd", "jihgfedcba")]
    step_model, alone = generator.step_model, []
    for source in sources:
        state, last, logits = step_model.start(np.array([source])), 1, []
        for _ in range(8):
            out, state = step_model.step(state, np.array([[last]]))
            logits.append(out[0, -1])
            last = int(out[0, -1].argmax())
        alone.append(logits)
    steps = steps_decoder(generator, "step")
    tensors = DeviceTensors(steps, "cpu") if where == "device" else HostTensors()
    batch, slot_of, last = LiveBatch(steps, tensors), {}, {}
    join, leave = [0, 2, 3, 5], [4, 6, 99, 99]
    for t in range(9):
        batch.leave([slot_of.pop(r) for r in list(slot_of) if leave[r] == t])
        new = [r for r, j in enumerate(join) if j == t]
        slot_of |= dict(zip(new, batch.join([sources[r] for r in new]), strict=True))
        last |= {r: 1 for r in new}
        if t == 6:  # rows 2 and 3 in slots 2 and 0, slot 1 free: nothing moves yet
            assert slot_of == {2: 2, 3: 0} and batch.compact() is None
        if t == 7:
            batch.leave([slot_of[2]])  # a free slot too many: the batch is compacted
            order = batch.compact()
            assert order is not None and order.tolist() == [0]
            slot_of = {3: 0}
        batch.trim()
        ids = np.zeros(batch.rows, np.int64)  # free slots: anything
        for r, slot in slot_of.items():
            ids[slot] = last[r]
        logits = batch.step(ids)
        if where == "device":
            assert all(isinstance(v, ort.OrtValue) for v in batch.past_k + batch.cross_v)
        for r, slot in slot_of.items():
            np.testing.assert_allclose(logits[slot], alone[r][t - join[r]], atol=1e-5)
            last[r] = int(logits[slot].argmax())
    assert batch.rows == 1 and batch.cache_len == 4  # row 3's columns only (joined at step 5)


def test_queue_bound_drain_at_close_and_timeouts(generator) -> None:
    steps = steps_decoder(generator, "step")
    batcher = StepBatcher(generator, steps, BatchSettings(max_queue=3))
    first = batcher.submit(["abc", "de"], GenerationOptions(), 60)
    with pytest.raises(QueueFullError, match=r"queue is full \(2 inputs waiting, at most 3\)"):
        batcher.submit(["f", "g"], GenerationOptions(), 60)
    late = batcher.submit(["h"], GenerationOptions(), -1.0)  # its deadline already past
    batcher.start()
    batcher.close()
    assert_same(first.result(0), generator.generate(["abc", "de"]))
    with pytest.raises(RequestTimeoutError, match="timed out waiting in the queue"):
        late.result(0)
    with pytest.raises(ShuttingDownError, match="shutting down"):
        batcher.submit(["e"], GenerationOptions(), 60)
    with pytest.raises(OptionsError, match="greedy"):
        batcher.submit(["e"], GenerationOptions(beam_size=2), 60)


def test_a_failing_step_runs_each_request_alone(generator, monkeypatch) -> None:
    """The first decoder step fails: every request in flight is answered by generate alone."""
    failed = threading.Event()
    real = LiveBatch.step

    def step_once_failing(self, last_ids):
        if not failed.is_set():
            failed.set()
            raise RuntimeError("onnxruntime failed")
        return real(self, last_ids)

    monkeypatch.setattr(LiveBatch, "step", step_once_failing)
    batcher = StepBatcher(
        generator, steps_decoder(generator, "step"), BatchSettings(max_wait_ms=50)
    )
    requests = [["abc"], ["hij", "fed"], ["cafe"]]
    futures = [batcher.submit(texts, GenerationOptions(), 60) for texts in requests]
    batcher.start()
    try:
        for texts, future in zip(requests, futures, strict=True):
            assert_same(future.result(60), generator.generate(texts))
        after = batcher.submit(["jihg"], GenerationOptions(), 60)  # the batch runs again
        assert_same(after.result(60), generator.generate(["jihg"]))
    finally:
        batcher.close()
    assert failed.is_set()


def test_step_batching_needs_the_steps_graph_of_the_variant(generator, runtime_case) -> None:
    plain = Generator.load(runtime_case.bundle, providers="cpu", threads=1)
    assert steps_decoder(plain, "auto") is None and steps_decoder(generator, "request") is None
    with pytest.raises(OptionsError, match=r"no step-batching decoder for variant 'fp32'; "
                       r"export one with edgeseq export .*--variants fp32,int8,steps"):  # fmt: skip
        steps_decoder(plain, "step")
    int8 = Generator.load(generator.bundle.path, providers="cpu", threads=1, variant="int8")
    steps = steps_decoder(int8, "auto")
    assert steps is not None and steps.decoder is not None
    batcher = StepBatcher(int8, steps)
    batcher.start()
    try:
        got = batcher.submit(["abc", "hij"], GenerationOptions(), 60).result(60)
    finally:
        batcher.close()
    assert [r.finished for r in got] == [True, True]


# -- the server --------------------------------------------------------------------------------
SERVER_OPTIONS = [{}, {"max_new_tokens": 3}, {"beam_size": 3, "n_best": 2},
                  {"sample": True, "seed": 7, "top_k": 4}, {"length_penalty": 0.6}]  # fmt: skip


def offline_json(generator: Generator, inputs: list[str], options: dict) -> list[dict]:
    """What `edgeseq generate --json` gives for these inputs (empty ones skipped)."""
    from edgeseq.runtime.results import result_json

    todo = [t for t in inputs if t]
    results = iter(generator.generate(todo, GenerationOptions(**options)) if todo else ())
    target = generator.tokenizers.target
    return [result_json(i, t, next(results) if t else None, target)
            for i, t in enumerate(inputs, start=1)]  # fmt: skip


def test_the_server_answers_greedy_requests_by_steps_as_offline(generator) -> None:
    pytest.importorskip("starlette", reason="the serve extra is not installed")
    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    from concurrent.futures import ThreadPoolExecutor

    from prometheus_client.parser import text_string_to_metric_families
    from serve_client import assert_same_json, generate, request, running

    from edgeseq.runtime.serve.app import create_app

    words = ["abc", "jihg", "a", "bbbbcc", "cafe", "hij", "dcba", "efghij", "ab", "gij", "fed"]
    cases = [(words[i % 11 : i % 11 + 1 + i % 3] + ([""] if i % 5 == 0 else []),
              SERVER_OPTIONS[i % len(SERVER_OPTIONS)]) for i in range(40)]  # fmt: skip
    app = create_app(generator, BatchSettings(max_batch=8, max_wait_ms=20, workers=2))
    assert app.state.server.batching == "step"
    with running(app) as port, ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda c: generate(port, *c), cases))
        text = request(port, "GET", "/metrics")[2]
    for (inputs, options), (status, body) in zip(cases, answers, strict=True):
        assert status == 200, body
        assert_same_json(body["results"], offline_json(generator, inputs, options))
    samples = {s.name + str(sorted(s.labels.items())): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip
    assert samples["edgeseq_batching_info[('mode', 'step')]"] == 1
    assert samples["edgeseq_inputs_total[]"] == sum(1 for i, _ in cases for t in i if t)
    generated = sum(len(r["ids"]) + r["finished"] for _, b in answers for r in b["results"]
                    if "ids" in r)  # fmt: skip
    assert samples["edgeseq_generated_tokens_total[]"] == generated


def test_serve_batching_flag_and_sigterm_drain(generator, steps_bundle, runtime_case) -> None:
    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    import os
    import re
    import signal
    import subprocess

    from serve_client import EDGESEQ, HeldRequest, assert_same_json, read_until, wait_ready

    command = [*EDGESEQ, "serve", "--provider", "cpu", "--threads", "1", "--port", "0"]
    refused = subprocess.run([*command, str(runtime_case.bundle), "--batching", "step"],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 1
    assert re.fullmatch(r"error: .*no step-batching decoder for variant 'fp32'; export one "
                        r"with .*--variants fp32,int8,steps, or serve with --batching "
                        r"request\n", refused.stderr), refused.stderr  # fmt: skip
    proc = subprocess.Popen([*command, str(steps_bundle), "--max-wait-ms", "1500"],
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if found := re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line):
                break
        assert any("batching: greedy requests per decoder step" in x for x in lines), lines
        port = int(found.group(1))
        wait_ready(port, 60)
        # the shutdown begins while the server handles the three requests, whose bodies are
        # sent after it began: they wait for company (max wait 1.5 s) while the server drains
        held = [HeldRequest(port, [w]) for w in ("abc", "hij", "ab")]
        proc.send_signal(signal.SIGTERM)
        read_until(proc.stderr, "Shutting down")  # uvicorn's first step of its shutdown
        for one in held:
            one.send_body()
        answers = [one.response() for one in held]
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.stderr.close()
    for word, (status, body) in zip(("abc", "hij", "ab"), answers, strict=True):
        assert status == 200
        assert_same_json(body["results"], offline_json(generator, [word], {}))
