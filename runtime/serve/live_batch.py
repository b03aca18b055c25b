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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from .. import constants as C
from ..generator import Generator
from ..graph_variants import STEPS, open_graph_variant
from ..padding import right_pad

Layers = list[np.ndarray]  # one (B, H, T, dh) array per decoder layer


class StepsDecoder:
    """The encoder session of a loaded generator and a session of its variant's steps graph."""

    def __init__(
        self, encoder: ort.InferenceSession, decoder: ort.InferenceSession, generator: Generator
    ) -> None:
        cfg = generator.config
        self.encoder, self.decoder, self.config = encoder, decoder, cfg
        self.layers, self.pad_id = cfg.n_decoder_layers, cfg.pad_id
        self.cross_names = C.encoder_outputs(self.layers)[1:]  # cross_k.*, then cross_v.*
        self.past_names = (
            *C.layer_names(C.PAST_K, self.layers),
            *C.layer_names(C.PAST_V, self.layers),
        )
        self.outputs = list(C.decoder_outputs(self.layers))  # logits, present_k.*, present_v.*

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

    def encode(self, src_ids: np.ndarray) -> tuple[Layers, Layers]:
        """Cross K and V of src_ids int64 (B, S) right-padded: two L-lists of (B, H, S, dh)."""
        out = self.encoder.run(list(self.cross_names), {C.SRC_IDS: src_ids})
        return out[: self.layers], out[self.layers :]


class LiveBatch:
    """The decoder state of the rows in flight, one slot per row (see the module docstring)."""

    def __init__(self, steps: StepsDecoder) -> None:
        self.steps = steps
        cfg = steps.config
        self.heads, self.d_head = cfg.n_heads, cfg.d_head
        empty = np.zeros((0, cfg.n_heads, 0, cfg.d_head), np.float32)
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
        return int(self.past_k[0].shape[2])

    def leave(self, slots: Sequence[int]) -> None:
        """Free `slots`: their rows are done (their state stays until a row takes the slot)."""
        self.live[np.asarray(slots, dtype=np.int64)] = False

    def join(self, sources: Sequence[Sequence[int]]) -> list[int]:
        """Place one row per source (ids ending with `</s>`; one encoder run for all) in free
        slots, then in new slots at the end; return the slots, in source order."""
        if not sources:
            return []
        src_ids = right_pad(sources, self.steps.pad_id)  # (n, S_new)
        new_k, new_v = self.steps.encode(src_ids)
        width = src_ids.shape[1]
        if width > self.src_mask.shape[1]:
            self._widen(width)
        free = np.flatnonzero(~self.live)[: len(sources)]
        extra = len(sources) - len(free)
        if extra:
            self._append(extra)
        slots = np.concatenate([free, np.arange(self.rows - extra, self.rows)])
        for old, new in ((self.cross_k, new_k), (self.cross_v, new_v)):
            for layer, array in enumerate(old):
                array[slots, :, :width] = new[layer]  # written over the slot's last row
        self.src_mask[slots] = False
        self.src_mask[slots, :width] = src_ids != self.steps.pad_id
        self.src_len[slots] = [len(s) for s in sources]
        self.start[slots] = self.cache_len
        self.position[slots] = 0
        self.live[slots] = True
        return slots.tolist()

    def _widen(self, width: int) -> None:
        """Zero-pad the cross K/V and the source mask to `width` source positions."""

        def widen(old: np.ndarray) -> np.ndarray:
            out = np.zeros((old.shape[0], self.heads, width, self.d_head), old.dtype)
            out[:, :, : old.shape[2]] = old
            return out

        self.cross_k = [widen(a) for a in self.cross_k]
        self.cross_v = [widen(a) for a in self.cross_v]
        mask = np.zeros((self.rows, width), dtype=bool)
        mask[:, : self.src_mask.shape[1]] = self.src_mask
        self.src_mask = mask

    def _append(self, count: int) -> None:
        """Add `count` free slots at the end (zeros; a copy of every tensor)."""

        def grow(old: np.ndarray) -> np.ndarray:
            zeros = np.zeros((count, *old.shape[1:]), old.dtype)
            return np.concatenate([old, zeros])

        self.past_k, self.past_v = [grow(a) for a in self.past_k], [grow(a) for a in self.past_v]
        self.cross_k = [grow(a) for a in self.cross_k]
        self.cross_v = [grow(a) for a in self.cross_v]
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
        self.past_k = [np.ascontiguousarray(a[keep, :, first:]) for a in self.past_k]
        self.past_v = [np.ascontiguousarray(a[keep, :, first:]) for a in self.past_v]
        self.cross_k = [np.ascontiguousarray(a[keep, :, :width]) for a in self.cross_k]
        self.cross_v = [np.ascontiguousarray(a[keep, :, :width]) for a in self.cross_v]
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
        self.past_k = [np.ascontiguousarray(a[:, :, first:]) for a in self.past_k]
        self.past_v = [np.ascontiguousarray(a[:, :, first:]) for a in self.past_v]
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
        logits, *present = steps.decoder.run(steps.outputs, feeds)
        self.past_k, self.past_v = present[: steps.layers], present[steps.layers :]
        self.position = self.position + live
        return logits[:, -1].astype(np.float32, copy=False)
