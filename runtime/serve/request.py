"""The `POST /v1/generate` contract, shared by the HTTP server and the Ray Serve deployment:
parse and check a request body, and render its answer.

Request body (JSON):

    {"inputs": ["hello", "world"],
     "options": {"beam_size": 4, "n_best": 2}}       # any GenerationOptions field but batch_size
                                                     # ("target_lang": "fra_Latn",
                                                     #  "split_sentences": true, ...)

An option left out takes the bundle's generation setting (config.json "generation"), else
edgeseq's default, as `edgeseq generate` without the flag does (`Generator.resolve`).

Answer: `{"results": [...]}`, one object per input in order, each exactly what
`edgeseq generate --json` prints for it (runtime/results.py): `index` counts from 1, and an
empty input is not run (`"skipped": "empty"`), except by a GPT bundle, which continues it.

Refusals raise `RequestError` carrying the HTTP status: 400 (body is not JSON), 413 (too many
inputs, an input with too many characters, a body too large), 422 (wrong types, unknown or
impossible options, an input longer than the model's max_len without `truncate`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from ..errors import EdgeseqError, InputTooLongError, MissingDependencyError, OptionsError
from ..generator import Generator, Result
from ..results import result_json
from ..search import GenerationOptions

# Options a request may set: every GenerationOptions field but the engine batch size.
REQUEST_OPTIONS = tuple(f.name for f in fields(GenerationOptions) if f.name != "batch_size")
BOOLEAN_OPTIONS = ("sample", "truncate", "split_sentences")


class RequestError(EdgeseqError):
    """A request the server refuses; `status` is the HTTP status code to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    """Bounds on one request."""

    max_inputs: int = 256  # inputs per request (413 above)
    max_chars: int = 1000  # characters per input (413 above)
    max_body_bytes: int = 1 << 20  # request body (413 above)


@dataclass(frozen=True)
class GenerateRequest:
    """A checked request: every input, the non-empty ones to run, and the options."""

    inputs: list[str]
    to_run: list[int]  # indices into `inputs` of the non-empty ones
    options: GenerationOptions
    source_tokens: int  # tokens with </s> of the inputs to run (for the batch token budget)

    @property
    def texts(self) -> list[str]:
        """The non-empty inputs, the ones the model runs."""
        return [self.inputs[i] for i in self.to_run]


def parse_generate(body: bytes, generator: Generator, limits: Limits) -> GenerateRequest:
    """Check a `POST /v1/generate` body; raise RequestError with the status and reason."""
    if len(body) > limits.max_body_bytes:
        raise RequestError(
            413, f"request body has {len(body)} bytes, at most {limits.max_body_bytes} allowed"
        )
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise RequestError(422, 'request body must be a JSON object: {"inputs": [...]}')
    unknown = sorted(set(payload) - {"inputs", "options"})
    if unknown:
        raise RequestError(422, f"unknown fields {unknown}: a request has inputs and options")
    inputs = payload.get("inputs")
    if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
        raise RequestError(422, '"inputs" must be a list of strings')
    if len(inputs) > limits.max_inputs:
        raise RequestError(
            413, f"{len(inputs)} inputs in one request, at most {limits.max_inputs}: split it"
        )
    for index, text in enumerate(inputs, start=1):
        if len(text) > limits.max_chars:
            raise RequestError(
                413, f"input {index} has {len(text)} characters, at most {limits.max_chars}"
            )
    try:
        options = generator.resolve(parse_options(payload.get("options", {})))
    except OptionsError as exc:
        raise RequestError(422, str(exc)) from None
    to_run = [i for i, text in enumerate(inputs) if text or generator.runs_empty_input]
    tokens = 0
    for i in to_run:
        try:
            tokens += len(generator.encode_input(inputs[i], options).ids)
        except MissingDependencyError as exc:  # split_sentences without the split extra
            raise RequestError(422, str(exc)) from None
        except InputTooLongError as exc:
            if options.split_sentences:
                raise RequestError(422, f"input {i + 1}, {exc}") from None
            length = len(generator.tokenizers.source.encode(inputs[i])) + 1
            raise RequestError(
                422,
                f"input {i + 1} has {length} source tokens with </s> but the model's max_len "
                f'is {generator.config.max_len}; shorten it or set "truncate": true in options',
            ) from None
    return GenerateRequest(inputs, to_run, options, tokens)


def parse_options(raw: Any) -> GenerationOptions:
    """GenerationOptions from a request's "options" object; GenerationOptions itself checks
    the values (422 with its message)."""
    if not isinstance(raw, dict):
        raise RequestError(422, '"options" must be a JSON object')
    unknown = sorted(set(raw) - set(REQUEST_OPTIONS))
    if unknown:
        raise RequestError(422, f"unknown options {unknown}; known: {', '.join(REQUEST_OPTIONS)}")
    for name in BOOLEAN_OPTIONS:
        if name in raw and not isinstance(raw[name], bool):
            raise RequestError(422, f'option "{name}" must be true or false')
    try:
        return GenerationOptions(**raw)
    except OptionsError as exc:
        raise RequestError(422, str(exc)) from None


def render(request: GenerateRequest, results: list[Result], generator: Generator) -> dict:
    """The answer: {"results": [one `generate --json` object per input]}."""
    by_index = dict(zip(request.to_run, results, strict=True))
    target = generator.tokenizers.target
    return {
        "results": [
            result_json(i + 1, text, by_index.get(i), target)
            for i, text in enumerate(request.inputs)
        ]
    }


def model_summary(generator: Generator, variant: str) -> dict[str, Any]:
    """`GET /v1/model`: what is served, from the manifest (variant, versions, parity)."""
    manifest = generator.bundle.manifest
    parity = manifest.get("parity", {})
    entry = manifest.get("variants", {}).get(variant, {})
    config = generator.config
    return {
        "bundle": generator.bundle.path.name,
        "variant": variant,
        "device": generator.device,
        "task": (generator.bundle.task or {}).get("name"),
        "edgeseq_version": manifest.get("edgeseq_version"),
        "format_version": manifest.get("format_version"),
        "created_utc": manifest.get("created_utc"),
        "opset": manifest.get("opset"),
        "min_onnxruntime": manifest.get("min_onnxruntime"),
        "exporter": manifest.get("exporter", {}),
        "parity": {"passed": parity.get("passed"), "verified": entry.get("verified")},
        "max_len": config.max_len,
        "src_vocab_size": config.src_vocab_size,
        "tgt_vocab_size": config.tgt_vocab_size,
    }
