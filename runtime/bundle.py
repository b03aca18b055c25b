"""Load a bundle directory and refuse one that is incomplete, tampered, too new or mismatched.

    bundle = load_bundle("bundles/rev")            # checks manifest, versions, every sha256
    encoder_path, decoder_path = bundle.graphs("fp32")
    bundle.config.max_len, bundle.tokenizers.source.encode("abc")
    check_graph_pair(bundle, encoder_session, decoder_session)   # once sessions exist

Every refusal is a `BundleError` naming the file and the problem. The format is written by
the exporter (`edgeseq export`) and documented in docs/bundle.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

import onnxruntime as ort

from . import constants as C
from .builtin import resolve_bundle
from .config import ModelConfig
from .errors import BundleError, ConfigError, OptionsError, TokenizerError
from .external_data import check_external_data
from .graph_variants import read_graph_variants
from .languages import Languages
from .manifest import check_files, check_inside, read_manifest
from .options import MODEL_DEFAULTS, GenerationOptions
from .tokenizer import Tokenizer, TokenizerPair
from .vocabulary import check_vocabulary

# Static dims of the per-layer cross/cache tensors [batch, heads, len, d_head] checked per graph.
KV_AXES = {1: "n_heads", 3: "d_head"}
METADATA_PREFIX = "edgeseq."
PER_GRAPH_METADATA = {"edgeseq.graph"}  # differs between the two graphs by design


@dataclass(frozen=True)
class Bundle:
    """A checked bundle: its config, tokenizers, manifest and graph files per variant."""

    path: Path
    config: ModelConfig
    tokenizers: TokenizerPair
    manifest: dict[str, Any]
    # variant name -> (encoder path, decoder path), or (model path,) for a GPT or BERT bundle
    variants: dict[str, tuple[Path, ...]]
    task: dict[str, Any] | None = None  # what the model was trained on, when recorded
    # extra graphs (runtime/graph_variants.py): variant key -> {precision: graph path}
    graph_variants: dict[str, dict[str, Path]] = dataclass_field(default_factory=dict)
    languages: Languages | None = None  # a multilingual model's codes (runtime/languages.py)
    # the source's generation settings, GenerationOptions fields (docs/bundle.md), or None
    generation: dict[str, Any] | None = None
    # task name -> the text put before every input for it (T5's task_specific_params)
    task_prefixes: dict[str, str] = dataclass_field(default_factory=dict)

    def task_prefix(self, task: str) -> str:
        """The text put before every input for `task`; OptionsError (one line, listing the
        bundle's tasks) when the bundle has no such task."""
        if task not in self.task_prefixes:
            known = ", ".join(sorted(self.task_prefixes)) or "none (it records no task prefixes)"
            raise OptionsError(f"unknown task {task!r}; this bundle's tasks: {known}")
        return self.task_prefixes[task]

    @property
    def default_variant(self) -> str:
        """The variant loaded when none is named: fp32 when the bundle has it, else the first
        listed (a built-in bundle ships int8 only)."""
        return "fp32" if "fp32" in self.variants else next(iter(self.variants))

    @property
    def architecture(self) -> str:
        """The model kind: "encoder-decoder", "decoder-only" (GPT) or "encoder-only" (BERT)."""
        return self.config.architecture

    def _files(self, variant: str) -> tuple[Path, ...]:
        if variant not in self.variants:
            raise BundleError(
                f"{self.path} has no variant {variant!r}; it has "
                f"{', '.join(sorted(self.variants))} (variants are chosen at export: "
                "edgeseq export --variants fp32,int8,fp16,ort)"
            )
        return self.variants[variant]

    def graphs(self, variant: str = "fp32") -> tuple[Path, Path]:
        """(encoder path, decoder path) of `variant`, or BundleError listing the variants."""
        files = self._files(variant)
        if len(files) != 2:
            raise BundleError(
                f"{self.path} is a {self.architecture} bundle with one graph per variant, "
                "not an encoder and a decoder"
            )
        return files[0], files[1]

    def model_graph(self, variant: str = "fp32") -> Path:
        """The one graph of `variant` in a GPT or BERT bundle (model.onnx, model.int8.onnx)."""
        files = self._files(variant)
        if len(files) != 1:
            raise BundleError(f"{self.path} is an encoder-decoder bundle: it has two graphs")
        return files[0]


def version_key(version: str) -> tuple[int, ...]:
    """ "1.17.0" / "1.31.1+cu13" / "1.20.0rc1" -> (1, 17, 0) for comparisons."""
    parts = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def check_onnxruntime(manifest: dict[str, Any], path: Path, installed: str | None = None) -> None:
    """Refuse a bundle that needs a newer onnxruntime than the installed one; when fused
    attention is what the installed one lacks, the message names `--no-fuse` too."""
    installed = installed or ort.__version__
    needed = manifest.get("min_onnxruntime")
    if needed is None:
        return
    if not isinstance(needed, str) or not version_key(needed):
        raise BundleError(f"{path / C.MANIFEST_FILE}: min_onnxruntime {needed!r} is not a version")
    if version_key(installed) < version_key(needed):
        fix = "upgrade it (pip install -U onnxruntime-gpu, or onnxruntime)"
        fused = manifest.get(C.MANIFEST_FUSED_ATTENTION) is True
        if fused and version_key(installed) < version_key(C.MIN_ORT_FUSED_ATTENTION):
            fix += (
                f", or re-export the bundle with `edgeseq export --no-fuse` (its fused attention "
                f"needs {C.MIN_ORT_FUSED_ATTENTION}; --no-fuse writes standard ONNX operators)"
            )
        raise BundleError(
            f"{path} needs onnxruntime >= {needed} but {installed} is installed: {fix}"
        )


def _read_config(path: Path) -> dict[str, Any]:
    config_path = path / C.CONFIG_FILE
    try:
        data = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{config_path} cannot be read: {exc}; re-export the bundle") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise BundleError(f'{config_path} has no "model" object; re-export the bundle')
    return data


def _variants(path: Path, manifest: dict[str, Any]) -> dict[str, tuple[Path, ...]]:
    variants = manifest.get("variants")
    if not isinstance(variants, dict) or not variants:
        raise BundleError(f"{path / C.MANIFEST_FILE} lists no graph variants; re-export")
    out: dict[str, tuple[Path, ...]] = {}
    for name, entry in variants.items():
        if isinstance(entry, dict) and isinstance(entry.get("model"), str):  # GPT or BERT
            out[name] = (check_inside(path, entry["model"]),)
            continue
        files = [
            entry.get(graph) if isinstance(entry, dict) else None
            for graph in ("encoder", "decoder")
        ]
        if not all(isinstance(f, str) for f in files):
            raise BundleError(
                f"{path / C.MANIFEST_FILE}: variant {name!r} does not name an encoder and a "
                "decoder graph; re-export"
            )
        out[name] = (check_inside(path, files[0]), check_inside(path, files[1]))
    return out


def load_bundle(path: str | Path) -> Bundle:
    """Read and check the bundle at `path` (a directory, or the name of a built-in bundle
    such as "g2p-en": runtime/builtin.py): manifest format version, minimum onnxruntime,
    the sha256 of every listed file (and that config, tokenizers and graphs are listed),
    each graph's external data file (runtime/external_data.py), the model config, the
    tokenizers and their vocabulary fingerprints (runtime/vocabulary.py) against those the
    graphs and manifest record. Raises BundleError naming the file and problem."""
    path = resolve_bundle(path)
    if not path.is_dir():
        raise BundleError(
            f"{path} is a file, not a bundle directory (export one with edgeseq export)"
        )
    manifest = read_manifest(path)
    check_onnxruntime(manifest, path)
    variants = _variants(path, manifest)
    listed = set(manifest.get("files") or {})
    needed = {C.CONFIG_FILE, C.TOKENIZER_FILE}
    needed |= {p.relative_to(path).as_posix() for pair in variants.values() for p in pair}
    for name in sorted(needed - listed):
        if not (path / name).exists():
            raise BundleError(f"{path / name} is missing from the bundle; re-export it")
        raise BundleError(
            f"{path / name} is not listed in {C.MANIFEST_FILE}, so its checksum cannot be "
            "verified; re-export the bundle"
        )
    check_files(path, manifest)  # every listed file: present and matching its sha256
    data = _read_config(path)
    try:
        config = ModelConfig.from_dict(data["model"]).validate()
    except ConfigError as exc:
        raise BundleError(f"{path / C.CONFIG_FILE}: {exc}") from None
    extra = read_graph_variants(path, manifest, listed, config)
    one_graph = {len(files) == 1 for files in variants.values()}
    if one_graph != {config.architecture != "encoder-decoder"} or (
        extra and config.architecture != C.ENCODER_DECODER
    ):
        raise BundleError(
            f"{path}: config.json describes an {config.architecture} model but the manifest's "
            "variants do not have its graphs; re-export the bundle"
        )
    names = data.get("tokenizers") or {}
    tokenizers = _tokenizers(path, names, listed)
    check_tokenizers(path, config, tokenizers)
    files = {side: names.get(side, C.TOKENIZER_FILE) for side in ("source", "target")}
    graphs = {p for pair in variants.values() for p in pair}
    graphs |= {p for by_precision in extra.values() for p in by_precision.values()}
    for graph in sorted(g for g in graphs if g.suffix == ".onnx"):
        check_external_data(path, graph, listed)  # weights beside a graph: its own, listed
    check_vocabulary(path, manifest, files, sorted(graphs))
    try:
        languages = Languages.from_config(data.get("languages"), tokenizers.target)
    except BundleError as exc:
        raise BundleError(f"{path}: {exc}") from None
    generation = read_generation(data.get("generation"), config_path=path / C.CONFIG_FILE)
    prefixes = read_task_prefixes(data.get("task_prefixes"), path / C.CONFIG_FILE)
    return Bundle(
        path, config, tokenizers, manifest, variants, data.get("task"), extra, languages,
        generation, prefixes,
    )  # fmt: skip


def read_task_prefixes(data: Any, config_path: Path) -> dict[str, str]:
    """config.json's "task_prefixes" object (empty when absent), checked: task name -> the
    text put before each input."""
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise BundleError(
            f'{config_path}: "task_prefixes" is not an object of texts; re-export the bundle'
        )
    return dict(data)


def read_generation(data: Any, config_path: Path) -> dict[str, Any] | None:
    """config.json's "generation" object (None when absent), checked: GenerationOptions
    fields that a model may set (runtime/options.py MODEL_DEFAULTS), valid values."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise BundleError(f'{config_path}: "generation" is not an object; re-export the bundle')
    unknown = sorted(set(data) - set(MODEL_DEFAULTS))
    if unknown:
        raise BundleError(
            f'{config_path}: "generation" has unknown settings {unknown} (known: '
            f"{', '.join(MODEL_DEFAULTS)}); re-export the bundle or upgrade edgeseq"
        )
    try:
        options = GenerationOptions(**data)
    except (OptionsError, TypeError) as exc:
        raise BundleError(f'{config_path}: "generation": {exc}; re-export the bundle') from None
    return {name: getattr(options, name) for name in data}


def check_tokenizers(path: Path, config: ModelConfig, tokenizers: TokenizerPair) -> None:
    """Refuse tokenizers that are not the model's: each side's vocabulary size must equal
    config.json's (src_vocab_size, tgt_vocab_size) and its special ids config.json's ids."""
    for side, tok, size, key in (
        ("source", tokenizers.source, config.src_vocab_size, "src_vocab_size"),
        ("target", tokenizers.target, config.tgt_vocab_size, "tgt_vocab_size"),
    ):
        if tok.vocab_size != size:
            raise BundleError(
                f"{path}: the {side} tokenizer has {tok.vocab_size} ids but config.json's "
                f"{key} is {size}: the tokenizer is not this model's; re-export the bundle"
            )
        for name in ("pad_id", "bos_id", "eos_id", "unk_id"):
            if getattr(tok, name) != getattr(config, name):
                raise BundleError(
                    f"{path}: the {side} tokenizer's {name} is {getattr(tok, name)} but "
                    f"config.json's is {getattr(config, name)}; re-export the bundle"
                )


def _tokenizers(path: Path, names: dict[str, Any], listed: set[str]) -> TokenizerPair:
    """The source and target tokenizers named in config.json (default: tokenizer.json)."""
    loaded: dict[str, Tokenizer] = {}
    for side in ("source", "target"):
        name = names.get(side, C.TOKENIZER_FILE)
        if not isinstance(name, str) or name not in listed:
            raise BundleError(
                f"{path / C.CONFIG_FILE}: {side} tokenizer {name!r} is not a file listed in "
                f"{C.MANIFEST_FILE}; re-export"
            )
        if name not in loaded:
            try:
                loaded[name] = Tokenizer.load(path / name)
            except TokenizerError as exc:
                raise BundleError(f"{path / name}: {exc}") from None
        loaded[side] = loaded[name]
    return TokenizerPair(loaded["source"], loaded["target"])


def _io(session: ort.InferenceSession) -> dict[str, Any]:
    """{name: NodeArg} of a session's inputs and outputs."""
    return {arg.name: arg for arg in [*session.get_inputs(), *session.get_outputs()]}


def check_graph_pair(
    bundle: Bundle,
    encoder: ort.InferenceSession,
    decoder: ort.InferenceSession,
    variant: str = "fp32",
) -> None:
    """Refuse graphs that lack the contract's inputs/outputs, disagree with config.json, or
    come from different models: K/V dims, dtypes and `edgeseq.*` metadata_props must agree."""
    encoder_path, decoder_path = bundle.graphs(variant)
    problems: list[str] = []
    layers = bundle.config.n_decoder_layers
    graphs = (
        (encoder_path, encoder, C.ENCODER_INPUTS, C.encoder_outputs(layers)),
        (decoder_path, decoder, C.decoder_inputs(layers), C.decoder_outputs(layers)),
    )
    for file, session, inputs, outputs in graphs:
        got_in = {arg.name for arg in session.get_inputs()}
        got_out = {arg.name for arg in session.get_outputs()}
        missing = [n for n in inputs if n not in got_in] + [n for n in outputs if n not in got_out]
        known = (*inputs, *outputs, *C.optional_outputs(got_out))
        extra = sorted(n for n in got_in | got_out if n not in known)
        if missing or extra:
            raise BundleError(
                f"{file} does not match config.json's {layers} decoder layers "
                f"(missing inputs/outputs {missing[:4]}, unexpected {extra[:4]}); "
                "re-export the bundle"
            )
    cfg = bundle.config
    enc_io, dec_io = _io(encoder), _io(decoder)
    cross = (C.CROSS_K, C.CROSS_V)
    kv = [(encoder_path, enc_io[n]) for f in cross for n in C.layer_names(f, layers)]
    kv += [
        (decoder_path, dec_io[n])
        for f in (C.PAST_K, C.PAST_V, C.CROSS_K, C.CROSS_V)
        for n in C.layer_names(f, layers)
    ]
    for axis, field in KV_AXES.items():
        want = getattr(cfg, field)
        found = {arg.shape[axis] for _, arg in kv if len(arg.shape) == 4}
        wrong = sorted(d for d in found if isinstance(d, int) and d != want)
        if wrong:
            problems.append(f"{field}: the graphs' K/V tensors have {wrong[0]}, config.json {want}")
    dtypes = sorted({arg.type for _, arg in kv})
    if len(dtypes) > 1:
        problems.append(f"the K/V tensors mix dtypes {', '.join(dtypes)}")
    logits = dec_io[C.LOGITS]
    if isinstance(logits.shape[-1], int) and logits.shape[-1] != cfg.tgt_vocab_size:
        problems.append(f"{decoder_path.name} logits width {logits.shape[-1]}, config.json ")
        problems[-1] += f"tgt_vocab_size {cfg.tgt_vocab_size}"
    problems = _metadata_problems(bundle, encoder_path, encoder, decoder_path, decoder) + problems
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BundleError(
            f"{bundle.path}: encoder, decoder and config.json do not belong together: "
            f"{problems[0]}{more}; re-export the bundle"
        )


def _metadata_problems(
    bundle: Bundle,
    encoder_path: Path,
    encoder: ort.InferenceSession,
    decoder_path: Path,
    decoder: ort.InferenceSession,
) -> list[str]:
    """Disagreements between the graphs' `edgeseq.*` metadata_props and with config.json."""
    enc = encoder.get_modelmeta().custom_metadata_map
    dec = decoder.get_modelmeta().custom_metadata_map
    config = bundle.config.to_dict() | {"d_head": bundle.config.d_head}
    problems: list[str] = []
    derived: list[str] = []
    keys = sorted(k for k in set(enc) | set(dec) if k.startswith(METADATA_PREFIX))
    for key in keys:
        if key in PER_GRAPH_METADATA:
            continue
        field = key[len(METADATA_PREFIX) :]
        if key in enc and key in dec and enc[key] != dec[key]:
            problems.append(
                f"{field}: {encoder_path.name} says {enc[key]}, {decoder_path.name} {dec[key]}"
            )
        elif field in config:
            value = config[field]
            text = str(value).lower() if isinstance(value, bool) else str(value)
            said = {meta[key] for meta in (enc, dec) if key in meta} - {text}
            if said:
                problem = f"config.json says {field} {text} but the graphs say {said.pop()}"
                derived.append(problem) if field == "d_head" else problems.append(problem)
    return problems + derived  # the root cause first: d_head follows from d_model, n_heads


def check_model_graph(bundle: Bundle, session: ort.InferenceSession, variant: str) -> None:
    """Refuse a GPT or BERT graph whose inputs, outputs or widths disagree with config.json."""
    cfg, path = bundle.config, bundle.model_graph(variant)
    if cfg.architecture == C.DECODER_ONLY:
        inputs, outputs = C.gpt_inputs(cfg.n_decoder_layers), C.gpt_outputs(cfg.n_decoder_layers)
    else:
        inputs, outputs = C.BERT_INPUTS, C.BERT_OUTPUTS
    got_in = tuple(arg.name for arg in session.get_inputs())
    got_out = tuple(arg.name for arg in session.get_outputs())
    if set(got_in) != set(inputs) or set(got_out) != set(outputs):
        missing = [n for n in (*inputs, *outputs) if n not in (*got_in, *got_out)]
        raise BundleError(
            f"{path} does not match config.json's {cfg.architecture} model (missing "
            f"inputs/outputs {missing[:4]}); re-export the bundle"
        )
    width = {arg.name: arg.shape for arg in session.get_outputs()}[C.LOGITS][-1]
    if isinstance(width, int) and width != cfg.tgt_vocab_size:
        raise BundleError(
            f"{path}: logits width {width} but config.json's tgt_vocab_size is "
            f"{cfg.tgt_vocab_size}; re-export the bundle"
        )
