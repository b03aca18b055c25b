"""A batch of rows at different positions, stepped through the bundle's step-batching decoder
(`decoder.steps.onnx`, exported with `edgeseq export --variants ...,steps`; docs/bundle.md).

    steps = StepsDecoder.open(generator)         # None when the variant has no steps graph
    batch = LiveBatch(steps)
    slots = batch.join(sources)                  # one row per source, in free or new slots
    logits = batch.step(last_ids)                # (slots, V) next-token logits of every slot
    batch.leave(finished_slots)                  # their slots are free for the next joiners
    order = batch.compact()                      # None, or the old slots now 0, 1, ...

The rows share one padded cache tensor per layer, (slots, H, T, dh). Row r's own columns are
start[r] .. T-1: a row that joins when the cache has T columns sees none of them (`tgt_mask`
hides them) and its first token goes into column T. Its position (the row of the positional
table) is its own step count, fed as `position_ids`; its keys carry their positions, so the
columns of other rows may sit anywhere. A row that leaves frees its slot: the next row to
join takes it in place (its cross K/V and source mask are written over the old ones), so a
batch whose rows come and go copies no cache. A free slot still runs (a `<pad>` at position
0 that sees only itself) until a row takes it; once half the slots are free `compact` keeps
only the rows in flight, and `trim` cuts the leading columns no row sees once they are half
the cache. The cross K/V are zero-padded to the longest source (hidden by `src_mask`).

Where the cache lives: on the CPU the K/V are numpy arrays, written in place (`HostTensors`);
on CUDA they are OrtValues on the GPU (`DeviceTensors`): the encoder and the steps graph
write them there through IO binding, and joining, compacting and trimming are small graphs on
the same provider (runtime/device_rows.py), so per step only the ids, positions, masks and
logits cross the bus. The same code runs on the CPU provider in the tests. The K/V are in the
steps graph's cache dtype: float32, or float16 in an fp16 bundle (logits stay float32).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from .. import constants as C
from ..device_rows import DeviceRows, bind_input
from ..generator import Generator
from ..graph_variants import STEPS, open_graph_variant
from ..kinds.ort_step import input_dtype
from ..padding import right_pad

Layers = list[Any]  # one (B, H, T, dh) tensor per decoder layer: numpy arrays or OrtValues


def _shape(tensor: np.ndarray | ort.OrtValue) -> tuple[int, ...]:
    """The shape of a numpy array or an OrtValue."""
    return tuple(tensor.shape) if isinstance(tensor, np.ndarray) else tuple(tensor.shape())


class HostTensors:
    """The live batch's K/V edits on numpy arrays, (B, H, T, dh) each."""

    def encode(self, steps: StepsDecoder, src_ids: np.ndarray) -> tuple[Layers, Layers]:
        """Cross K and V of src_ids int64 (B, S): two L-lists of (B, H, S, dh) arrays."""
        out = steps.encoder.run(list(steps.cross_names), {C.SRC_IDS: src_ids})
        return out[: steps.layers], out[steps.layers :]

    def run(self, steps: StepsDecoder, feeds: dict[str, Any]) -> tuple[np.ndarray, Layers]:
        """The steps graph on `feeds` -> logits (R, 1, V) and the L keys then L values."""
        logits, *present = steps.decoder.run(steps.outputs, feeds)
        return logits, present

    def pad(self, arrays: Layers, extra_rows: int = 0, width: int | None = None) -> Layers:
        """Zero rows after the last and zero columns up to `width` (default: as they are)."""
        out = []
        for old in arrays:
            batch, heads, length, d_head = old.shape
            shape = (batch + extra_rows, heads, length if width is None else width, d_head)
            new = np.zeros(shape, old.dtype)
            new[:batch, :, :length] = old
            out.append(new)
        return out

    def write(self, arrays: Layers, slots: np.ndarray, new: Layers) -> Layers:
        """Rows `slots` of each array replaced by new (N, H, S', dh), S' <= the array's columns
        (the columns past S' keep what they held), in place."""
        for old, rows in zip(arrays, new, strict=True):
            old[slots, :, : rows.shape[2]] = rows
        return arrays

    def take(
        self, arrays: Layers, rows: np.ndarray, first: int = 0, last: int | None = None
    ) -> Layers:
        """Rows `rows`, columns first..last of each array (contiguous copies)."""
        return [np.ascontiguousarray(a[rows, :, first:last]) for a in arrays]


class DeviceTensors:
    """The same edits on OrtValues on the steps graph's device (runtime/device_rows.py)."""

    def __init__(self, steps: StepsDecoder, device_type: str, device_id: int = 0) -> None:
        self.rows = DeviceRows.like(steps.decoder, device_type, device_id)
        self.device_type, self.device_id = device_type, device_id

    def encode(self, steps: StepsDecoder, src_ids: np.ndarray) -> tuple[Layers, Layers]:
        """`HostTensors.encode` with the cross K/V written on the device."""
        binding = steps.encoder.io_binding()
        binding.bind_cpu_input(C.SRC_IDS, np.ascontiguousarray(src_ids, dtype=np.int64))
        for name in steps.cross_names:
            binding.bind_output(name, self.device_type, self.device_id)
        steps.encoder.run_with_iobinding(binding)
        out = binding.get_outputs()
        return out[: steps.layers], out[steps.layers :]

    def run(self, steps: StepsDecoder, feeds: dict[str, Any]) -> tuple[np.ndarray, Layers]:
        """`HostTensors.run` with the K/V bound in place: the logits come to the host, the
        cache stays on the device."""
        binding = steps.decoder.io_binding()
        for name, value in feeds.items():
            bind_input(binding, name, value)
        binding.bind_output(C.LOGITS, "cpu")
        for name in steps.outputs[1:]:
            binding.bind_output(name, self.device_type, self.device_id)
        steps.decoder.run_with_iobinding(binding)
        logits, *present = binding.get_outputs()
        return logits.numpy(), present

    def pad(self, values: Layers, extra_rows: int = 0, width: int | None = None) -> Layers:
        """`HostTensors.pad` on the device."""
        return list(self.rows.pad(values, extra_rows, width))

    def write(self, values: Layers, slots: np.ndarray, new: Layers) -> Layers:
        """`HostTensors.write` on the device (new copies; new's columns padded first)."""
        width = _shape(values[0])[2]
        return list(self.rows.write(values, slots, self.rows.pad(new, 0, width)))

    def take(
        self, values: Layers, rows: np.ndarray, first: int = 0, last: int | None = None
    ) -> Layers:
        """`HostTensors.take` on the device."""
        return list(self.rows.take(values, rows, first, last))


class StepsDecoder:
    """The encoder session of a loaded generator and a session of its variant's steps graph."""

    def __init__(
        self, encoder: ort.InferenceSession, decoder: ort.InferenceSession, generator: Generator
    ) -> None:
        cfg = generator.config
        self.encoder, self.decoder, self.config = encoder, decoder, cfg
        self.device = generator.device  # "cuda": the live batch's K/V stay there
        self.layers, self.pad_id = cfg.n_decoder_layers, cfg.pad_id
        self.cross_names = C.encoder_outputs(self.layers)[1:]  # cross_k.*, then cross_v.*
        self.past_names = (
            *C.layer_names(C.PAST_K, self.layers),
            *C.layer_names(C.PAST_V, self.layers),
        )
        self.outputs = list(C.decoder_outputs(self.layers))  # logits, present_k.*, present_v.*
        self.cache_dtype = input_dtype(decoder, self.past_names[0])  # float16 in fp16 bundles

    @classmethod
    def open(cls, generator: Generator) -> StepsDecoder | None:
        """The steps graph of `generator`'s variant on the decoder's providers and options, or
        None when the bundle has none for that variant (or is not an encoder–decoder)."""
        bundle, step_model = generator.bundle, generator.step_model
        encoder, decoder = (
            getattr(step_model, "encoder", None),
            getattr(step_model, "decoder", None),
        )
        if encoder is None or decoder is None:
            return None
        session = open_graph_variant(
            bundle,
            STEPS.key,
            generator.variant,
            decoder.get_providers(),
            decoder.get_session_options(),
        )
        if session is None:
            return None
        return cls(encoder, session, generator)

    def tensors(self) -> HostTensors | DeviceTensors:
        """Where a live batch of this decoder keeps its K/V: numpy, or the GPU on CUDA."""
        return DeviceTensors(self, "cuda") if self.device == "cuda" else HostTensors()


class LiveBatch:
    """The decoder state of the rows in flight, one slot per row (see the module docstring)."""

    def __init__(self, steps: StepsDecoder, tensors: HostTensors | DeviceTensors | None = None):
        self.steps = steps
        self.tensors = tensors or steps.tensors()  # where the K/V live (module docstring)
        cfg = steps.config
        empty = np.zeros((0, cfg.n_heads, 0, cfg.d_head), steps.cache_dtype)
        if isinstance(self.tensors, DeviceTensors):
            empty = ort.OrtValue.ortvalue_from_numpy(empty, self.tensors.device_type)
        self.past_k: Layers = [empty] * steps.layers
        self.past_v: Layers = [empty] * steps.layers
        self.cross_k: Layers = [empty] * steps.layers
        self.cross_v: Layers = [empty] * steps.layers
        self.src_mask = np.zeros((0, 0), dtype=bool)  # (R, S)
        self.src_len = np.zeros(0, np.int64)  # (R,) real source tokens of each slot's row
        self.start = np.zeros(0, np.int64)  # (R,) each row's first cache column
        self.position = np.zeros(0, np.int64)  # (R,) position of each row's next token
        self.live = np.zeros(0, dtype=bool)  # (R,) slots holding a row in flight

    @property
    def rows(self) -> int:
        """Slots in the batch (rows in flight and free slots)."""
        return int(self.live.shape[0])

    @property
    def cache_len(self) -> int:
        """Columns of the shared cache (T)."""
        return _shape(self.past_k[0])[2]

    def leave(self, slots: Sequence[int]) -> None:
        """Free `slots`: their rows are done (their state stays until a row takes the slot)."""
        self.live[np.asarray(slots, dtype=np.int64)] = False

    def join(self, sources: Sequence[Sequence[int]]) -> list[int]:
        """Place one row per source (ids ending with `</s>`; one encoder run for all) in free
        slots, then in new slots at the end; return the slots, in source order."""
        if not sources:
            return []
        src_ids = right_pad(sources, self.steps.pad_id)  # (n, S_new)
        new_k, new_v = self.tensors.encode(self.steps, src_ids)
        width = src_ids.shape[1]
        if width > self.src_mask.shape[1]:
            self._widen(width)
        free = np.flatnonzero(~self.live)[: len(sources)]
        extra = len(sources) - len(free)
        if extra:
            self._append(extra)
        slots = np.concatenate([free, np.arange(self.rows - extra, self.rows)])
        layers = self.steps.layers  # written over the slots' last rows
        cross = self.tensors.write([*self.cross_k, *self.cross_v], slots, [*new_k, *new_v])
        self.cross_k, self.cross_v = cross[:layers], cross[layers:]
        self.src_mask[slots] = False
        self.src_mask[slots, :width] = src_ids != self.steps.pad_id
        self.src_len[slots] = [len(s) for s in sources]
        self.start[slots] = self.cache_len
        self.position[slots] = 0
        self.live[slots] = True
        return slots.tolist()

    def _widen(self, width: int) -> None:
        """Zero-pad the cross K/V and the source mask to `width` source positions."""
        layers = self.steps.layers
        cross = self.tensors.pad([*self.cross_k, *self.cross_v], 0, width)
        self.cross_k, self.cross_v = cross[:layers], cross[layers:]
        mask = np.zeros((self.rows, width), dtype=bool)
        mask[:, : self.src_mask.shape[1]] = self.src_mask
        self.src_mask = mask

    def _append(self, count: int) -> None:
        """Add `count` free slots at the end (zeros; a copy of every tensor)."""

        def grow(old: np.ndarray) -> np.ndarray:
            zeros = np.zeros((count, *old.shape[1:]), old.dtype)
            return np.concatenate([old, zeros])

        layers = self.steps.layers
        kv = self.tensors.pad([*self.past_k, *self.past_v, *self.cross_k, *self.cross_v], count)
        self.past_k, self.past_v = kv[:layers], kv[layers : 2 * layers]
        self.cross_k, self.cross_v = kv[2 * layers : 3 * layers], kv[3 * layers :]
        self.src_mask = grow(self.src_mask)
        self.src_len, self.start = grow(self.src_len), grow(self.start)
        self.position, self.live = grow(self.position), grow(self.live)

    def compact(self) -> np.ndarray | None:
        """Once half the slots (or more) are free, keep only the rows in flight (their order
        kept), their source positions and the cache columns they see; return their old slots
        (the new slot i held old slot order[i]), or None when nothing moved."""
        free = self.rows - int(self.live.sum())
        if not free or 2 * free < self.rows:
            return None
        keep = np.flatnonzero(self.live)
        first = int(self.start[keep].min()) if len(keep) else self.cache_len
        width = int(self.src_len[keep].max()) if len(keep) else 0
        layers, take = self.steps.layers, self.tensors.take
        past = take([*self.past_k, *self.past_v], keep, first)
        cross = take([*self.cross_k, *self.cross_v], keep, 0, width)
        self.past_k, self.past_v = past[:layers], past[layers:]
        self.cross_k, self.cross_v = cross[:layers], cross[layers:]
        self.src_mask = np.ascontiguousarray(self.src_mask[keep, :width])
        self.src_len, self.start = self.src_len[keep], self.start[keep] - first
        self.position, self.live = self.position[keep], self.live[keep]
        return keep

    def trim(self) -> None:
        """Cut the leading cache columns that no row in flight sees, once they are at least
        half the cache (one copy of the rest; the graph copies the whole cache every step)."""
        first = int(self.start[self.live].min()) if self.live.any() else self.cache_len
        if not first or 2 * first < self.cache_len:
            return
        layers = self.steps.layers
        past = self.tensors.take([*self.past_k, *self.past_v], np.arange(self.rows), first)
        self.past_k, self.past_v = past[:layers], past[layers:]
        self.start = np.maximum(self.start - first, 0)

    def step(self, last_ids: np.ndarray) -> np.ndarray:
        """Feed each slot's last token (int64 (R,); anything for a free slot) at its position
        -> logits float32 (R, V) of its next token (a free slot's are meaningless); the cache
        gains one column."""
        steps, live, length = self.steps, self.live, self.cache_len
        start = np.where(live, self.start, length)  # a free slot sees only its own column
        feeds = {
            C.INPUT_IDS: np.where(live, last_ids, steps.pad_id).astype(np.int64)[:, None],
            C.POSITION_IDS: np.where(live, self.position, 0)[:, None],
            C.TGT_MASK: np.arange(length + 1)[None, :] >= start[:, None],
            C.SRC_MASK: self.src_mask,
        }
        feeds.update(zip(steps.past_names, [*self.past_k, *self.past_v], strict=True))
        feeds.update(zip(steps.cross_names, [*self.cross_k, *self.cross_v], strict=True))
        logits, present = self.tensors.run(steps, feeds)
        self.past_k, self.past_v = present[: steps.layers], present[steps.layers :]
        self.position = self.position + live
        return logits[:, -1].astype(np.float32, copy=False)
