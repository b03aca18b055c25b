"""runtime/web/tokenizer.mjs (the browser tokenizer) against runtime/tokenizer.py.

Each case saves a tokenizer (char or word, with a normalizer such as the NFC + Lowercase that
a g2p bundle declares) and compares the JavaScript ids and decoded text with Python's on texts
chosen to break a careless port: composed and decomposed accents, capitals that lowercase to
two code points, final sigma, surrounding spaces, symbols outside the vocabulary. Needs only
Node.js (skipped with the reason when it is absent); about a second per case.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from tokenizers import Regex, normalizers, pre_tokenizers

from edgeseq.runtime.tokenizer import Tokenizer, build_normalizer

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is absent (apt install nodejs)")
HELPER = Path(__file__).parent / "edge" / "encode.mjs"

TEXTS = [
    "hello",
    "Hello",
    "ÉCOLE",
    "e\u0301cole",  # e + combining acute: NFC composes it
    "ﬁne",  # U+FB01 ligature: NFKC splits it
    "İstanbul",  # lowercases to i + combining dot
    "ΟΔΟΣ",  # final sigma
    "  padded  ",
    "a b\tc",
    "don't",
    "x<unk>y",
    "",
    "straße",
    "123 ?!",
    "\ufeffbom\u0085",  # U+FEFF is not White_Space, U+0085 is: String.trim disagrees
    "\u3000wide\u2003",
]


def js_encode(path: Path, texts: list[str]) -> list[dict] | dict:
    """ids and decoded text of each text from the JavaScript tokenizer (or {"error": ...})."""
    result = subprocess.run(
        [NODE, str(HELPER), str(path)], input=json.dumps(texts), capture_output=True,
        text=True, check=True, timeout=60,
    )  # fmt: skip
    return json.loads(result.stdout)


CORPUS = ["hello ecole istanbul odos strasse don't fine padded abc", "ÉCOLE éσςß ΟΔΟΣ İ 123?!"]
NORMALIZERS = {
    "none": None,
    "nfc-lowercase": normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()]),
    "nfkc-strip": normalizers.Sequence([normalizers.NFKC(), normalizers.Strip()]),
    "nfd-stripaccents-lower": normalizers.Sequence(
        [normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase()]
    ),
    "replace-prepend": normalizers.Sequence(
        [normalizers.Replace(Regex(r"\s+"), " "), normalizers.Prepend("^")]
    ),
    "strip-left": normalizers.Strip(left=True, right=False),
    "g2p": build_normalizer(("nfc", "strip", "lowercase")),  # what the g2p task trains with
}


@pytest.mark.parametrize("kind", ["char", "word"])
@pytest.mark.parametrize("normalizer", sorted(NORMALIZERS))
def test_ids_and_text_equal_python(tmp_path: Path, kind: str, normalizer: str) -> None:
    tok = Tokenizer.train(kind, [*CORPUS, *TEXTS])
    if NORMALIZERS[normalizer] is not None:
        tok.hf.normalizer = NORMALIZERS[normalizer]
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    got = js_encode(path, TEXTS)
    want = [{"ids": tok.encode(t), "text": tok.decode(tok.encode(t))} for t in TEXTS]
    assert got == want


def test_whitespace_pretokenizer_sequence_equals_python(tmp_path: Path) -> None:
    tok = Tokenizer.train_word(CORPUS)
    tok.hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Whitespace()]
    )
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    got = js_encode(path, TEXTS)
    assert [g["ids"] for g in got] == [tok.encode(t) for t in TEXTS]


def test_unknown_normalizer_is_refused(tmp_path: Path) -> None:
    tok = Tokenizer.train_char(CORPUS)
    data = json.loads(tok.to_str())
    data["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": ""}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    got = js_encode(path, ["abc"])
    assert "error" in got
    assert 'normalizer "Precompiled" is not supported' in got["error"]


def test_bpe_model_is_refused(tmp_path: Path) -> None:
    tok = Tokenizer.train_bpe(CORPUS * 5, vocab_size=60)
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    got = js_encode(path, ["abc"])
    assert "error" in got
    assert 'tokenizer model "BPE" is not supported' in got["error"]
