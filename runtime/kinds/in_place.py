"""The two-graph loop on the in-place cache variant (`decoder.inplace.onnx`, docs/bundle.md):
the self-attention cache is one preallocated buffer per layer and family that the decoder
writes the new key and value into, and beam search reorders hypotheses through a cache
indirection instead of gathering the cache.

    step_model = InPlaceStep(encoder, decoder, config)      # decoder: decoder.inplace.onnx
    hyps = search(step_model, src_ids, GenerationOptions(beam_size=4))

States are used once: `step` and `select` take a state and return the one to use next; the
state passed in is spent (stepping or selecting it again raises ValueError), because `step`
writes into the buffers it holds and the buffers a new state no longer holds go back at once.
The search algorithms (runtime/search.py) keep only the state they were given back.

Memory (runtime/kinds/buffer_pool.py): a generation's buffers belong to its `Lease`, which
`start` takes from the step model's pool (waiting while `generations` others hold buffers).
A buffer replaced by another (the shorter ones `grown` copied from, the ones `select` gathered
from into new ones) returns to the pool as soon as the new state is made; the rest, and the
generation's slot, when its last state is gone, or at once when `step` or `select` fails. The
pool keeps free buffers up to a cap, by default the bytes of a batch-32 beam-4 cache at
max_len (`EDGESEQ_CACHE_POOL_MB` overrides it; 0 keeps none); `EDGESEQ_CACHE_GENERATIONS`
(default 2) bounds the generations holding buffers at once. Buffers grow up to max_len
(`max_positions`: past it for positional "relative"); a step at that position raises
`CacheFullError` (the search's step budget stops before it).

Rows are grouped in blocks of `width` (an input's hypotheses in beam search, 1 in greedy
search): row n * W + w reads position t from buffer row n * W + indirection[n, w, t]
(runtime/kinds/indirection.py, shared with the device buffers of in_place_device.py).
`select` is then one of three things:
- every row stays in its block (beam reordering): the indirection rows are gathered, the
  buffers are kept;
- whole blocks are kept (finished inputs leave, greedy rows leave): the kept blocks are
  moved down inside the buffers (and the cross K/V), the indirection moves with them;
- anything else (the first beam step repeats each input's row): every row's positions are
  gathered through the indirection into new buffers, whose blocks are the runs of rows that
  came from the same old block.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .. import constants as C
from ..config import ModelConfig
from ..errors import OptionsError
from .buffer_pool import GENERATIONS, BufferPool, Lease, size_class
from .indirection import (
    check_live,
    check_room,
    cross_rows,
    grown_indirection,
    mark_written,
    plan_select,
)
from .ort_step import Layers, OrtStep

MIN_CACHE_LEN = 64  # first buffer length (positions), at least; grows by doubling
POOL_MB_ENV = "EDGESEQ_CACHE_POOL_MB"  # MiB of free buffers the pool keeps (default: below)
GENERATIONS_ENV = "EDGESEQ_CACHE_GENERATIONS"  # generations holding buffers at once
POOL_ROWS = 32 * 4  # the default cap holds the cache of this many rows (batch 32, beam 4)
Runs = tuple[tuple[int, int, int], ...]  # (first new row, first old row, length) per run


@dataclass
class InPlaceState:
    """Cross K/V and src_mask as `OrtState`'s, with one row per block (B / width rows) for a
    decoder that takes them per input (`per_input_cross`); source_rows (B,) as `OrtState`'s;
    the cache as buffers, L-tuples of (B, H, M, dh) with `past` positions filled; `width`
    rows per block; `indirection` int32 (B / width, width, M)."""

    cross_k: Layers
    cross_v: Layers
    src_mask: np.ndarray
    source_rows: np.ndarray
    cache_k: Layers
    cache_v: Layers
    past: int
    width: int
    indirection: np.ndarray
    lease: Lease  # where the buffers came from (given back when the last state goes)
    # The decoder's IO binding with the arrays above bound (and the OrtValues the buffers are
    # bound through, kept alive with it); None until the first step after a change of arrays.
    binding: tuple[ort.IOBinding, list[ort.OrtValue]] | None = None
    spent: bool = False  # passed to step or select, which returned the state to use instead

    @property
    def batch(self) -> int:
        """Rows in the state."""
        return len(self.source_rows)

    @property
    def past_len(self) -> int:
        """Target positions already cached."""
        return self.past

    @property
    def cache_len(self) -> int:
        """Positions the buffers hold."""
        return int(self.cache_k[0].shape[2])


class InPlaceStep(OrtStep):
    """`OrtStep` (the CPU encoder and its state handling) whose decoder is the in-place
    cache graph, run with IO binding so that each buffer is both past and present."""

    def __init__(
        self,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        config: ModelConfig,
        pool_bytes: int | None = None,
        generations: int | None = None,
    ) -> None:
        """`pool_bytes`: free buffers kept (default: $EDGESEQ_CACHE_POOL_MB, else
        `default_pool_bytes`); `generations`: generations holding buffers at once (default:
        $EDGESEQ_CACHE_GENERATIONS, else 2)."""
        super().__init__(encoder, decoder, config)
        env_bytes, env_generations = pool_settings(config)
        self.pool = BufferPool(
            env_bytes if pool_bytes is None else pool_bytes,
            env_generations if generations is None else generations,
        )
        self.names[C.PRESENT_K] = C.layer_names(C.PRESENT_K, self.layers)
        self.names[C.PRESENT_V] = C.layer_names(C.PRESENT_V, self.layers)
        self.per_input = per_input_cross(decoder)

    def buffers(self, lease: Lease, rows: int, length: int) -> Layers:
        """L buffers (rows, H, length, dh) from the pool (contents undefined), in the
        decoder's cache dtype (`cache_dtype`: float16 in an fp16 bundle)."""
        shape = (rows, self.config.n_heads, length, self.config.d_head)
        return tuple(lease.take(shape, self.cache_dtype) for _ in range(self.layers))

    def start(self, src_ids: np.ndarray) -> InPlaceState:  # type: ignore[override]
        """Wait for a generation slot, run the encoder on src_ids int64 (B, S); empty buffers
        of max(64, 2 S) positions (at most max_positions), one row per block."""
        lease = Lease(self.pool)
        try:
            first = super().start(src_ids)
            rows = first.batch
            length = cache_length(self.max_positions, src_ids.shape[1])
            return InPlaceState(
                first.cross_k, first.cross_v, first.src_mask, first.source_rows,
                self.buffers(lease, rows, length), self.buffers(lease, rows, length), 0, 1,
                np.zeros((rows, 1, length), np.int32), lease,
            )  # fmt: skip
        except BaseException:
            lease.close()
            raise

    def grown(self, state: InPlaceState) -> InPlaceState:
        """`state` with buffers twice as long (at most max_positions), filled positions copied."""
        length = min(self.max_positions, 2 * state.cache_len)
        cache = []
        for old in (*state.cache_k, *state.cache_v):
            new = state.lease.take((*old.shape[:2], length, old.shape[3]), old.dtype)
            new[:, :, : state.past] = old[:, :, : state.past]
            cache.append(new)
        indirection = grown_indirection(state.indirection, state.past, length)
        source = (state.cross_k, state.cross_v, state.src_mask, state.source_rows)
        replaced = state.cache_k + state.cache_v
        return self._moved(source, tuple(cache), state.width, indirection, state, replaced)

    def _moved(
        self,
        source: tuple[Layers, Layers, np.ndarray, np.ndarray],
        cache: Layers,
        width: int,
        indirection: np.ndarray,
        state: InPlaceState,
        replaced: Layers = (),
    ) -> InPlaceState:
        """A state after `state`: cross K/V, src_mask and source_rows `source`, buffers
        `cache` (L keys then L values). `state` is spent, and its buffers `replaced` (read for
        the last time) go back to the pool now."""
        layers = self.layers
        moved = InPlaceState(
            *source, cache[:layers], cache[layers:], state.past, width, indirection, state.lease
        )
        state.spent = True
        if replaced:
            state.binding = None  # bound to the buffers given back
            state.lease.give(replaced)
        return moved

    @staticmethod
    def _copy(
        array: np.ndarray, rows: np.ndarray, runs: Runs | None, past: int, lease: Lease
    ) -> np.ndarray:
        """`array`'s rows `rows` (its first `past` positions). Rows in increasing order (their
        `runs`) are moved down inside `array` (only those that move) and a prefix view is
        returned, so dropping rows allocates nothing; other orders are copied into a new
        buffer."""
        if runs is not None:
            _compacted(array[:, :, :past], runs)  # a view: moves the rows inside `array`
            return array[: len(rows)]
        new = lease.take((len(rows), *array.shape[1:]), array.dtype)
        new[:, :, :past] = array[rows, :, :past]
        return new

    def bind(self, state: InPlaceState) -> tuple[ort.IOBinding, list[ort.OrtValue]]:
        """A decoder IO binding of what stays the same from step to step: cross K/V, src_mask,
        beam_width, and each buffer as both past and present."""
        binding = self.decoder.io_binding()
        for family, arrays in ((C.CROSS_K, state.cross_k), (C.CROSS_V, state.cross_v)):
            for name, array in zip(self.names[family], arrays, strict=True):
                binding.bind_cpu_input(name, array)
        binding.bind_cpu_input(C.SRC_MASK, state.src_mask)
        binding.bind_cpu_input(C.BEAM_WIDTH, np.array([state.width], np.int32))
        values = []
        for past_family, present_family, arrays in (
            (C.PAST_K, C.PRESENT_K, state.cache_k),
            (C.PAST_V, C.PRESENT_V, state.cache_v),
        ):
            names = zip(self.names[past_family], self.names[present_family], arrays, strict=True)
            for past_name, present_name, array in names:
                value = ort.OrtValue.ortvalue_from_numpy(array)  # the buffer's own memory
                binding.bind_ortvalue_input(past_name, value)
                binding.bind_ortvalue_output(present_name, value)
                values.append(value)
        return binding, values

    def _decoded(  # type: ignore[override]
        self, state: InPlaceState, input_ids: np.ndarray, heads: tuple[str, ...]
    ) -> tuple[list[np.ndarray], InPlaceState]:
        """`step` and `step_top` (OrtStep's) on input_ids int64 (B, 1): outputs `heads`, and
        the state with position past_len written into its buffers (the same buffers, unless
        they had to grow)."""
        check_one_token(input_ids)
        check_live(state)
        try:
            check_room(state.past, self.max_positions)
            if state.past >= state.cache_len:
                state = self.grown(state)
            return self._run(state, input_ids, heads)
        except BaseException:
            _abandon(state)
            raise

    def _run(
        self, state: InPlaceState, input_ids: np.ndarray, heads: tuple[str, ...]
    ) -> tuple[list[np.ndarray], InPlaceState]:
        """`_decoded` once the buffers have room for position past_len: outputs `heads` are
        bound to new arrays, the others not (logits, when not read, are not copied out)."""
        if state.binding is None:
            state.binding = self.bind(state)
        binding, past, rows = state.binding[0], state.past, state.batch
        binding.bind_cpu_input(C.INPUT_IDS, np.ascontiguousarray(input_ids, dtype=np.int64))
        binding.bind_cpu_input(C.CACHE_MASK, np.ones((rows, past + 1), np.int32))
        binding.bind_cpu_input(C.PAST_LENGTH, np.array([past], np.int32))
        binding.bind_cpu_input(C.CACHE_INDIRECTION, state.indirection)
        shapes = {C.LOGITS: (rows, 1, self.vocab_size), C.LOG_NORMALIZER: (rows,)}
        out = [
            np.empty(shapes.get(name, (rows, self.top_width)), np.float32)
            if name != C.TOPK_IDS
            else np.empty((rows, self.top_width), np.int64)
            for name in heads
        ]
        for name, array in zip(heads, out, strict=True):
            binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
        self.decoder.run_with_iobinding(binding)
        mark_written(state.indirection, past)
        state.past = past + 1
        return out, state

    def _outer(
        self, state: InPlaceState, rows: np.ndarray, width: int, compact: bool = False
    ) -> tuple[Layers, Layers, np.ndarray, np.ndarray]:
        """Cross K/V, src_mask and source_rows of batch rows `rows` (B',) in blocks of `width`
        (`cross_rows`): the same arrays when every cross row keeps its source, else gathered;
        with `compact`, rows that leave (the kept ones increasing) move the cross rows that
        stay down inside their arrays instead of copying them out."""
        source_rows = state.source_rows[rows]
        kept = cross_rows(state.source_rows, state.width, rows, width, self.per_input)
        if kept is None:
            return state.cross_k, state.cross_v, state.src_mask, source_rows
        runs = _runs(kept) if compact else None
        arrays = (*state.cross_k, *state.cross_v)
        if runs is not None:
            cross = tuple(_compacted(a, runs) for a in arrays)
        else:
            cross = tuple(np.take(a, kept, axis=0) for a in arrays)
        layers = self.layers
        return cross[:layers], cross[layers:], np.take(state.src_mask, kept, axis=0), source_rows

    def select(self, state: InPlaceState, rows: np.ndarray) -> InPlaceState:  # type: ignore[override]
        """Gather batch rows (int64 (B',), may repeat); see the module docstring."""
        check_live(state)
        try:
            return self._select(state, np.asarray(rows, dtype=np.int64))
        except BaseException:
            _abandon(state)
            raise

    def _select(self, state: InPlaceState, rows: np.ndarray) -> InPlaceState:
        """`select` on a live state."""
        plan = plan_select(state.indirection, state.width, state.past, rows)
        if plan.kind == "reorder":
            # The rows of a block share their source row, so cross K/V and mask stay as
            # they are, and so does the binding.
            outer = (state.cross_k, state.cross_v, state.src_mask, state.source_rows)
            cache = state.cache_k + state.cache_v
            moved = self._moved(outer, cache, plan.width, plan.indirection, state)
            moved.binding = state.binding
            return moved
        past, buffers = state.past, state.cache_k + state.cache_v
        if plan.source is not None:  # whole blocks kept
            runs = _runs(plan.source)
            outer = self._outer(state, plan.source, plan.width, compact=runs is not None)
            cache = tuple(self._copy(a, plan.source, runs, past, state.lease) for a in buffers)
            replaced = () if runs is not None else buffers  # copied
            return self._moved(outer, cache, plan.width, plan.indirection, state, replaced)
        # Resolve the indirection: row i's position t is in old buffer row held[i, t].
        assert plan.held is not None
        outer = self._outer(state, rows, plan.width)
        positions = np.arange(past)
        resolved = []
        for array in buffers:
            new = state.lease.take((len(rows), *array.shape[1:]), array.dtype)
            new[:, :, :past] = array[plan.held, :, positions].transpose(0, 2, 1, 3)
            resolved.append(new)
        return self._moved(outer, tuple(resolved), plan.width, plan.indirection, state, buffers)


def per_input_cross(decoder: ort.InferenceSession) -> bool:
    """Whether an in-place decoder takes its cross K/V with one row per input (per block:
    their first axis is `C.INPUTS`, export/kinds/seq2seq/in_place_graph.py) rather than one
    per row (`C.BATCH`, graphs exported before)."""
    first = C.layer_names(C.CROSS_K, 1)[0]
    shape = next(arg.shape for arg in decoder.get_inputs() if arg.name == first)
    return shape[0] == C.INPUTS


def cache_length(max_len: int, src_len: int) -> int:
    """Positions of a new generation's buffers for sources of `src_len` tokens:
    max(MIN_CACHE_LEN, 2 src_len), at most max_len (they grow by doubling from there)."""
    return min(max_len, max(MIN_CACHE_LEN, 2 * src_len))


def check_one_token(input_ids: np.ndarray) -> None:
    """Refuse input_ids (B, N) with N != 1: the in-place decoder takes one token per row."""
    if input_ids.shape[1] != 1:
        raise ValueError("the in-place cache decoder takes one new token per row")


def default_pool_bytes(config: ModelConfig) -> int:
    """Bytes of the in-place cache of `POOL_ROWS` rows (batch 32, beam 4) at max_len: 2 L
    buffers (keys, values) of (rows, H, max_len, dh) float32, each its size class's capacity."""
    size = POOL_ROWS * config.n_heads * config.max_len * config.d_head
    return 2 * config.n_decoder_layers * 2 ** size_class(size) * 4


def pool_settings(config: ModelConfig, environ: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """(bytes of free buffers kept, generations holding buffers at once) for `config`:
    $EDGESEQ_CACHE_POOL_MB (MiB, >= 0) else `default_pool_bytes`, and
    $EDGESEQ_CACHE_GENERATIONS (>= 1) else 2."""
    megabytes = _env_int(environ, POOL_MB_ENV, 0, "MiB of free cache buffers kept; 0: none")
    generations = _env_int(environ, GENERATIONS_ENV, 1, "beam generations holding a cache")
    pool_bytes = default_pool_bytes(config) if megabytes is None else megabytes * 2**20
    return pool_bytes, GENERATIONS if generations is None else generations


def _env_int(environ: Mapping[str, str], name: str, least: int, meaning: str) -> int | None:
    """The integer in environment variable `name` (None when unset or empty)."""
    text = environ.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < least:
        raise OptionsError(
            f"{name} must be an integer >= {least} ({meaning}), got {text!r}; "
            "unset it for the default"
        )
    return int(text)


def _abandon(state: InPlaceState) -> None:
    """A generation that failed: its buffers go back to the pool and its slot frees now."""
    state.spent, state.binding = True, None
    state.lease.close()


def _runs(rows: np.ndarray) -> Runs | None:
    """Increasing `rows` (B',) as (first new row, first old row, length) of its runs of
    consecutive rows; None when `rows` is not increasing."""
    if not len(rows) or not (np.diff(rows) > 0).all():
        return None
    starts = np.flatnonzero(np.diff(rows, prepend=rows[0] - 2) != 1)
    lengths = np.diff(np.append(starts, len(rows)))
    return tuple((int(t), int(rows[t]), int(n)) for t, n in zip(starts, lengths, strict=True))


def _compacted(array: np.ndarray, runs: Runs) -> np.ndarray:
    """`array`'s rows given by `runs` (`_runs`), moved down inside `array`: its first rows,
    a view."""
    for target, source, length in runs:
        if target != source:
            array[target : target + length] = array[source : source + length]
    return array[: sum(length for _, _, length in runs)]
