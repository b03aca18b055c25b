"""A batch of rows at different positions, stepped through the bundle's step-batching decoder
(`decoder.steps.onnx`, exported with `edgeseq export --variants ...,steps`; docs/bundle.md).

    steps = StepsDecoder.open(generator)         # None when the variant has no steps graph
    batch = LiveBatch(steps)
    batch.update(keep, sources)                  # rows `keep` stay (in order), sources join
    logits = batch.step(last_ids)                # (B, V) next-token logits of every row

The rows share one padded cache tensor per layer, (B, H, T, dh). Row r's own slots are the
columns start[r] .. T-1: a row joining a batch whose cache has T columns gets T zero columns
that `tgt_mask` hides from it, and its first token goes into column T. Its position (the row
of the positional table) is its own step count, fed as `position_ids`; its keys carry their
positions, so the columns of other rows may sit anywhere. When rows leave, the columns that
no remaining row sees are cut, and the cross K/V (zero-padded to the longest source, hidden
by `src_mask`) are cut to the longest remaining source. A rebuild copies every tensor once;
a step without rows leaving or joining copies nothing but what the graph itself appends.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from .. import constants as C
from ..errors import BundleError
from ..generator import Generator
from ..padding import right_pad
from ..providers import DISABLED_OPTIMIZERS

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
        entry = (bundle.manifest.get("steps") or {}).get(generator.variant)
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            return None
        encoder, decoder = (
            getattr(step_model, "encoder", None),
            getattr(step_model, "decoder", None),
        )
        if encoder is None or decoder is None:
            return None
        name = entry["file"]
        if name not in (bundle.manifest.get("files") or {}):
            raise BundleError(
                f"{bundle.path / name} is not listed in {C.MANIFEST_FILE}, so its checksum "
                "cannot be verified; re-export the bundle"
            )
        try:
            session = ort.InferenceSession(
                str(bundle.path / name),
                decoder.get_session_options(),
                providers=decoder.get_providers(),
                disabled_optimizers=DISABLED_OPTIMIZERS,
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise BundleError(f"onnxruntime cannot load {bundle.path / name}: {exc}") from None
        layers = generator.config.n_decoder_layers
        got = {a.name for a in session.get_inputs()} | {a.name for a in session.get_outputs()}
        want = {*C.steps_decoder_inputs(layers), *C.decoder_outputs(layers)}
        if got != want:
            raise BundleError(
                f"{bundle.path / name} does not have the step-batching decoder's inputs and "
                f"outputs for {layers} decoder layers; re-export the bundle"
            )
        return cls(encoder, session, generator)

    def encode(self, src_ids: np.ndarray) -> tuple[Layers, Layers]:
        """Cross K and V of src_ids int64 (B, S) right-padded: two L-lists of (B, H, S, dh)."""
        out = self.encoder.run(list(self.cross_names), {C.SRC_IDS: src_ids})
        return out[: self.layers], out[self.layers :]


class LiveBatch:
    """The decoder state of the rows in flight (see the module docstring)."""

    def __init__(self, steps: StepsDecoder) -> None:
        self.steps = steps
        cfg = steps.config
        self.heads, self.d_head = cfg.n_heads, cfg.d_head
        empty = np.zeros((0, cfg.n_heads, 0, cfg.d_head), np.float32)
        self.past_k: Layers = [empty] * steps.layers
        self.past_v: Layers = [empty] * steps.layers
        self.cross_k: Layers = [empty] * steps.layers
        self.cross_v: Layers = [empty] * steps.layers
        self.src_mask = np.zeros((0, 0), dtype=bool)  # (B, S)
        self.src_len = np.zeros(0, np.int64)  # (B,) real source tokens of each row
        self.start = np.zeros(0, np.int64)  # (B,) each row's first cache column
        self.position = np.zeros(0, np.int64)  # (B,) position of each row's next token

    @property
    def rows(self) -> int:
        """Rows in the batch."""
        return int(self.start.shape[0])

    @property
    def cache_len(self) -> int:
        """Columns of the shared cache (T)."""
        return int(self.past_k[0].shape[2])

    def update(self, keep: np.ndarray, sources: Sequence[Sequence[int]]) -> None:
        """Keep rows `keep` (int64 indices, in that order) and append one row per source (ids
        ending with `</s>`; one encoder run for all), cutting columns and source positions no
        row needs any more."""
        keep = np.asarray(keep, dtype=np.int64)
        if not len(sources) and np.array_equal(keep, np.arange(self.rows)):
            return
        kept, joined = len(keep), len(sources)
        trim = int(self.start[keep].min()) if kept else self.cache_len
        length = self.cache_len - trim
        src_len = np.array([len(s) for s in sources], dtype=np.int64)
        width = int(max(self.src_len[keep].max() if kept else 0, src_len.max() if joined else 0))
        if joined:
            src_ids = right_pad(sources, self.steps.pad_id)
            new_k, new_v = self.steps.encode(src_ids)
        rows = kept + joined

        def cache(old: np.ndarray) -> np.ndarray:
            out = np.zeros((rows, self.heads, length, self.d_head), old.dtype)
            out[:kept] = old[keep, :, trim:]
            return out

        def cross(old: np.ndarray, new: np.ndarray | None) -> np.ndarray:
            out = np.zeros((rows, self.heads, width, self.d_head), old.dtype)
            common = min(width, old.shape[2])
            out[:kept, :, :common] = old[keep, :, :common]
            if new is not None:
                out[kept:, :, : new.shape[2]] = new
            return out

        self.past_k = [cache(a) for a in self.past_k]
        self.past_v = [cache(a) for a in self.past_v]
        self.cross_k = [cross(a, new_k[i] if joined else None) for i, a in enumerate(self.cross_k)]
        self.cross_v = [cross(a, new_v[i] if joined else None) for i, a in enumerate(self.cross_v)]
        mask = np.zeros((rows, width), dtype=bool)
        common = min(width, self.src_mask.shape[1])
        mask[:kept, :common] = self.src_mask[keep, :common]
        if joined:
            mask[kept:, : src_ids.shape[1]] = src_ids != self.steps.pad_id
        self.src_mask = mask
        self.src_len = np.concatenate([self.src_len[keep], src_len])
        self.start = np.concatenate([self.start[keep] - trim, np.full(joined, length)])
        self.position = np.concatenate([self.position[keep], np.zeros(joined, np.int64)])

    def step(self, last_ids: np.ndarray) -> np.ndarray:
        """Feed each row's last token (int64 (B,)) at its position -> logits float32 (B, V)
        of its next token; the cache gains one column."""
        steps = self.steps
        feeds = {
            C.INPUT_IDS: np.ascontiguousarray(last_ids, dtype=np.int64)[:, None],
            C.POSITION_IDS: self.position[:, None],
            C.TGT_MASK: np.arange(self.cache_len + 1)[None, :] >= self.start[:, None],
            C.SRC_MASK: self.src_mask,
        }
        feeds.update(zip(steps.past_names, [*self.past_k, *self.past_v], strict=True))
        feeds.update(zip(steps.cross_names, [*self.cross_k, *self.cross_v], strict=True))
        logits, *present = steps.decoder.run(steps.outputs, feeds)
        self.past_k, self.past_v = present[: steps.layers], present[steps.layers :]
        self.position = self.position + 1
        return logits[:, -1].astype(np.float32, copy=False)
