"""The decoder-only (GPT) kind in the runtime: `model.onnx` as a `StepModel`
(runtime/step.py), so runtime/search.py's greedy, beam search and sampling continue prompts
unchanged, and `GPTGenerator`, which `Generator.load` returns for such a bundle.

    gpt = Generator.load("bundles/words")              # a GPTGenerator
    [r] = gpt.generate(["photo"])                      # r.text "photon": prompt + continuation
    step_model = OrtGPTStep(session, config)
    tokens = greedy_search(step_model, prompt_ids, max_new_tokens=20)

`start(prompt_ids)` takes right-padded prompts int64 (B, S) without `<s>` (S may be 0: every
row starts from `<s>` alone) and only remembers them. The first `step` receives `<s>` (B, 1),
what search feeds first, and runs `<s>` + prompt in one call (past length 0), returning the
logits at each row's last real token as (B, 1, V). Later steps feed new tokens after the
cache. The pads of shorter prompts stay in the cache, hidden by `attention_mask`; a row's
positions count its real tokens only, so a prompt's continuation does not depend on the
other prompts of its batch (docs/bundle-lm.md, "GPT: one KV-cached decoder graph").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .. import constants as C
from ..bundle import Bundle, check_model_graph
from ..config import ModelConfig
from ..device_rows import DeviceRows, bind_input
from ..errors import InputTooLongError, OptionsError
from ..generator import Generator, OpenOptions
from ..providers import open_session
from ..results import Result, Source
from ..search import GenerationOptions
from .ort_step import input_dtype

Cache = tuple[np.ndarray | ort.OrtValue, ...]  # one (B, H, P, dh) tensor per layer


@dataclass(frozen=True)
class GPTState:
    """The cache (L keys then L values, each (B, H, P, dh) float32, or float16 in an fp16
    bundle: numpy arrays, or OrtValues on the device for `OrtBoundGPTStep`), its mask int64
    (B, P), each row's next position int64 (B,), and the prompt int64 (B, S) still to run
    (None once run)."""

    past_k: Cache
    past_v: Cache
    mask: np.ndarray
    next_pos: np.ndarray
    prompt: np.ndarray | None

    @property
    def batch(self) -> int:
        """Rows in the state."""
        return int(self.next_pos.shape[0])

    @property
    def past_len(self) -> int:
        """Cache slots filled, pads of shorter prompts included."""
        return int(self.mask.shape[1])


class OrtGPTStep:
    """Runs a GPT bundle's `model.onnx` one step at a time on an onnxruntime session."""

    def __init__(self, session: ort.InferenceSession, config: ModelConfig) -> None:
        self.session = session
        self.config = config
        self.max_len, self.vocab_size = config.max_len, config.tgt_vocab_size
        self.bos_id, self.eos_id, self.pad_id = config.bos_id, config.eos_id, config.pad_id
        self.layers = config.n_decoder_layers
        self.outputs = list(C.gpt_outputs(self.layers))
        self.cache_dtype = input_dtype(session, C.PAST_KEY % 0)  # float16 in fp16 bundles

    def start(self, prompt_ids: np.ndarray) -> GPTState:
        """Remember right-padded prompts int64 (B, S) (S may be 0); the cache is empty."""
        prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(len(prompt_ids), -1)
        batch, cfg = prompt.shape[0], self.config
        empty = np.zeros((batch, cfg.n_heads, 0, cfg.d_head), dtype=self.cache_dtype)
        cache = (empty,) * self.layers
        mask = np.zeros((batch, 0), dtype=np.int64)
        return GPTState(cache, cache, mask, np.zeros(batch, dtype=np.int64), prompt)

    def step(self, state: GPTState, input_ids: np.ndarray) -> tuple[np.ndarray, GPTState]:
        """input_ids int64 (B, N) -> logits float32 (B, N, V) (the first step: N = 1, the
        logits after `<s>` + the whole prompt) and the extended state."""
        ids = np.asarray(input_ids, dtype=np.int64)
        batch, new = ids.shape
        last = None
        if state.prompt is not None:
            if new != 1:
                raise OptionsError("the first step of a GPT takes one token (<s>)")
            keep = (state.prompt != self.pad_id).astype(np.int64)
            ids = np.concatenate([ids, state.prompt], axis=1)  # (B, 1+S)
            mask = np.concatenate([np.ones((batch, 1), np.int64), keep], axis=1)
            positions = np.cumsum(mask, axis=1) - 1  # a pad repeats the last real position
            last = keep.sum(axis=1)  # index of each row's last real token in `ids`
        else:
            mask = np.ones((batch, new), dtype=np.int64)
            positions = state.next_pos[:, None] + np.arange(new, dtype=np.int64)
        if int(positions.max()) >= self.max_len:
            raise InputTooLongError(
                f"the sequence needs {int(positions.max()) + 1} positions but the model's "
                f"max_len is {self.max_len}; shorten the prompt or generate fewer tokens"
            )
        full_mask = np.concatenate([state.mask, mask], axis=1)
        feeds = {C.INPUT_IDS: ids, C.ATTENTION_MASK: full_mask, C.POSITION_IDS: positions}
        logits, past_k, past_v = self.run(feeds, state)
        if last is not None:
            logits = logits[np.arange(batch), last][:, None]  # (B, 1, V)
        next_pos = positions.max(axis=1) + 1
        new_state = GPTState(past_k, past_v, full_mask, next_pos, None)
        return np.asarray(logits, dtype=np.float32), new_state

    def run(self, feeds: dict[str, np.ndarray], state: GPTState) -> tuple[np.ndarray, Cache, Cache]:
        """One graph run on `feeds` (ids, mask, positions) and `state`'s cache -> logits
        (B, N, V) on the host and the presents, L keys and L values (B, H, P + N, dh)."""
        feeds = dict(feeds)
        for i in range(self.layers):
            feeds[C.PAST_KEY % i] = state.past_k[i]
            feeds[C.PAST_VALUE % i] = state.past_v[i]
        logits, *presents = self.session.run(self.outputs, feeds)
        return logits, tuple(presents[0::2]), tuple(presents[1::2])

    def take_cache(self, state: GPTState, rows: np.ndarray) -> tuple[Cache, Cache]:
        """Rows `rows` (int64 (B',)) of `state`'s cache: L keys and L values."""
        return tuple(t[rows] for t in state.past_k), tuple(t[rows] for t in state.past_v)

    def select(self, state: GPTState, rows: np.ndarray) -> GPTState:
        """A state holding batch rows `rows` (int64 (B',), may repeat) of `state`."""
        idx = np.asarray(rows, dtype=np.int64)
        past_k, past_v = self.take_cache(state, idx)
        return GPTState(
            past_k,
            past_v,
            state.mask[idx],
            state.next_pos[idx],
            None if state.prompt is None else state.prompt[idx],
        )


class OrtBoundGPTStep(OrtGPTStep):
    """OrtGPTStep whose cache lives on `device_type` ("cuda", or "cpu" for testing): the
    presents are bound to device memory and fed back as the next step's past, rows are
    gathered on the device (runtime/device_rows.py); the ids, mask, positions and logits
    are what crosses to the host. The empty cache of `start` stays a host array."""

    def __init__(
        self,
        session: ort.InferenceSession,
        config: ModelConfig,
        device_type: str = "cuda",
        device_id: int = 0,
    ) -> None:
        super().__init__(session, config)
        self.device_type, self.device_id = device_type, device_id
        self.rows = DeviceRows.like(session, device_type, device_id)

    def run(self, feeds: dict[str, np.ndarray], state: GPTState) -> tuple[np.ndarray, Cache, Cache]:
        """`OrtGPTStep.run` with IO binding: the logits to the host, the presents on the
        device."""
        binding = self.session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for i in range(self.layers):
            for name, value in (
                (C.PAST_KEY % i, state.past_k[i]),
                (C.PAST_VALUE % i, state.past_v[i]),
            ):
                bind_input(binding, name, value)
        binding.bind_output(C.LOGITS, "cpu")
        for name in self.outputs[1:]:
            binding.bind_output(name, self.device_type, self.device_id)
        self.session.run_with_iobinding(binding)
        logits, *presents = binding.get_outputs()  # in binding order
        return logits.numpy(), tuple(presents[0::2]), tuple(presents[1::2])

    def take_cache(self, state: GPTState, rows: np.ndarray) -> tuple[Cache, Cache]:
        """Rows `rows` of the cache, gathered on the device (the empty cache on the host)."""
        if state.past_len == 0:
            return super().take_cache(state, rows)
        cache = self.rows.gather([*state.past_k, *state.past_v], rows)
        return tuple(cache[: self.layers]), tuple(cache[self.layers :])


def open_model_graph(bundle: Bundle, how: OpenOptions) -> tuple[ort.InferenceSession, str]:
    """The checked session of a one-graph bundle's `how.variant` and its device ("cuda" or
    "cpu"); search "graph" is refused (these kinds have no one-graph search variant)."""
    if how.search == "graph":
        raise OptionsError(
            f"{bundle.path} is a {bundle.architecture} bundle: it has no one-graph "
            "search variant (use search 'auto' or 'loop')"
        )
    graph = bundle.model_graph(how.variant)
    session, device = open_session(graph, how.providers, how.threads, how.optimization)
    check_model_graph(bundle, session, how.variant)
    return session, device


class GPTGenerator(Generator):
    """Continues prompts with a GPT bundle; the search code is the encoder–decoder's."""

    runs_empty_input = True

    @classmethod
    def open(cls, bundle: Bundle, how: OpenOptions) -> GPTGenerator:
        """Open `model.onnx` of `how.variant` (see `Generator.load`); the search always runs
        in Python (a GPT bundle has no one-graph search variant)."""
        session, device = open_model_graph(bundle, how)
        if device == "cuda":
            step: OrtGPTStep = OrtBoundGPTStep(session, bundle.config, "cuda")
        else:
            step = OrtGPTStep(session, bundle.config)
        return cls(bundle, step, device, None, "loop")

    def encode(self, text: str, truncate: bool = False, source_lang: str | None = None) -> Source:
        """Token ids of the normalised prompt (no `<s>`, no `</s>`; may be empty). The
        prompt and `<s>` must leave the positional table room for one new token:
        InputTooLongError, or with `truncate` the prompt's last tokens are kept. A prompt
        of unknown symbols only is `skipped` "unknown". `source_lang` is always None here
        (`resolve` refuses languages for a model without a language list)."""
        ids, unknown = self.tokenize(text)
        if ids and len(unknown) == len(ids):
            return Source((), False, unknown, "unknown")
        limit = self.config.max_len - 2  # <s>, the prompt and one new token
        truncated = len(ids) > limit
        if truncated and not truncate:
            raise InputTooLongError(
                f"the prompt has {len(ids)} tokens but the model's max_len "
                f"{self.config.max_len} leaves room for {limit} (with <s> and one new token); "
                "shorten it or pass truncate=True"
            )
        return Source(tuple(ids[len(ids) - limit :] if truncated else ids), truncated, unknown)

    def _options(self, sources: Sequence[Source], options: GenerationOptions) -> GenerationOptions:
        """`options` with max_new_tokens within what the longest prompt leaves of max_len."""
        room = self.config.max_len - 1 - max((len(s.ids) for s in sources), default=0)
        wanted = options.max_new_tokens
        fitted = room if wanted is None else min(wanted, room)
        return dataclasses.replace(options, max_new_tokens=fitted)

    def generate(
        self, texts: Sequence[str], options: GenerationOptions | None = None
    ) -> list[Result]:
        """One Result per prompt, in order (batched as `Generator.generate`): `text` is the
        normalised prompt + the continuation. A batch generates at most as many tokens as
        its longest prompt leaves of max_len."""
        if isinstance(texts, str):
            raise OptionsError("generate() takes a list of texts; wrap a single text in [ ]")
        options = options or GenerationOptions()
        results: list[Result] = []
        for start in range(0, len(texts), options.batch_size):
            chunk = list(texts[start : start + options.batch_size])
            sources = [self.encode(t, options.truncate) for t in chunk]
            fitted = self._options([s for s in sources if not s.skipped], options)
            results += [self._with_prompt(r) for r in super().generate(chunk, fitted)]
        return results

    def _with_prompt(self, result: Result) -> Result:
        """`result` with the decoded prompt in front of each hypothesis's text."""
        if result.skipped:
            return result
        prompt = self.tokenizers.source.decode(list(result.source.ids))
        nbest = tuple(dataclasses.replace(c, text=prompt + c.text) for c in result.nbest)
        return dataclasses.replace(result, text=prompt + result.text, nbest=nbest)

    def stream(self, text: str, options: GenerationOptions | None = None) -> Iterator[str]:
        """Yield the normalised prompt, then each piece of the continuation as it is chosen
        (greedy or sampling); the pieces join to `generate([text], options)[0].text`."""
        options = options or GenerationOptions()
        source = self.encode(text, options.truncate)
        if source.skipped:
            return iter(())
        pieces = super().stream(text, self._options([source], options))
        prompt = self.tokenizers.source.decode(list(source.ids))
        return _prepend(prompt, pieces)


def _prepend(first: str, rest: Iterator[str]) -> Iterator[str]:
    if first:
        yield first
    yield from rest


GENERATOR = GPTGenerator
