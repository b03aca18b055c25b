"""`edgeseq generate BUNDLE [TEXT ...]`: generate with a bundle; needs no torch.

    edgeseq generate bundles/rev "abcdef"                   # greedy, one output line
    edgeseq generate bundles/rev --input words.txt --beam 4 --json
    cat words.txt | edgeseq generate bundles/rev --sample --top-p 0.9 --seed 1

Input handling (also in `--help` and docs/runtime.md): see `INPUT_RULES`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from edgeseq.runtime.errors import InputFileError, InputTooLongError
from edgeseq.runtime.generator import Generator, Result, Source
from edgeseq.runtime.graph_search import SEARCH_MODES
from edgeseq.runtime.progress import progress_bar
from edgeseq.runtime.results import result_json as results_json
from edgeseq.runtime.search import GenerationOptions
from edgeseq.runtime.tokenizer import utf8_text

from .options import provider_option, threads_option, variant_option

INPUT_RULES = """\b
Input: the TEXT arguments; without them, the lines of --input FILE, or of stdin.
One output line (or JSON object) per input, in input order.
\b
- Inputs are normalised by the bundle's tokenizer first (the G2P model: Unicode
  NFC, surrounding whitespace stripped, lowercased).
- Empty line (or only whitespace): an empty output line (JSON: "skipped": "empty");
  the model is not run.
- Only symbols outside the source vocabulary (emoji, another script): an empty
  output line (JSON: "skipped": "unknown") and one warning naming the lines; the
  model is not run. Some unknown symbols among known ones are fed as <unk>, with
  one warning listing them.
- An output cut at max_len or --max-new-tokens before </s>: one warning naming the
  lines (JSON: "finished": false).
- A line longer than the model's max_len (tokens + </s>) is an error naming the
  line, before anything is generated; with --truncate it is cut, with one warning.
- Bytes that are not UTF-8 are replaced by U+FFFD (then usually <unk>); one
  warning names the lines.
- With --split-sentences each line is split into sentences (sentencex, in the
  source language), each sentence generated (and checked against max_len), and
  the outputs joined in order with a space (none for Chinese, Japanese, Thai...).

[model default]: an option not given takes the bundle's generation setting
(config.json "generation": what the imported model's generation_config sets,
recorded at export; edgeseq inspect shows it), else edgeseq's default: greedy,
length penalty 1.0, early stopping true, no bans, no forced </s>, max_len.
An option given always wins. --sample ignores the model's beam size.
"""


@dataclass(frozen=True)
class InputLine:
    """One input: where it came from ("line 3" / "argument 2"), its text, and whether
    undecodable bytes were replaced."""

    label: str
    number: int
    text: str
    replaced: bool = False


def warn(message: str) -> None:
    """One warning line on stderr."""
    click.echo(f"warning: {message}", err=True)


def split_lines(data: bytes) -> list[tuple[str, bool]]:
    """(text, replaced) per line of `data`: line endings (\\n, \\r\\n) and a UTF-8 BOM are
    removed; undecodable bytes become U+FFFD and mark the line."""
    if not data:
        return []
    raw = data.split(b"\n")
    if raw[-1] == b"":
        raw.pop()
    out = []
    for number, line in enumerate(raw):
        line = line.removesuffix(b"\r")
        if number == 0:
            line = line.removeprefix(b"\xef\xbb\xbf")
        try:
            out.append((line.decode("utf-8"), False))
        except UnicodeDecodeError:
            out.append((line.decode("utf-8", errors="replace"), True))
    return out


def _argument_text(text: str) -> tuple[str, bool]:
    """An argv string with undecodable bytes (surrogate escapes) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        try:
            raw = text.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError:  # a surrogate no byte escapes to (an in-process caller)
            return utf8_text(text), True
        return raw.decode("utf-8", errors="replace"), True


def read_inputs(texts: tuple[str, ...], input_file: str | None) -> list[InputLine]:
    """The inputs: TEXT arguments, else --input FILE ("-": stdin), else stdin."""
    if texts and input_file is not None:
        raise click.UsageError("give TEXT arguments or --input FILE, not both")
    if texts:
        return [InputLine("argument", n, *_argument_text(t)) for n, t in enumerate(texts, start=1)]
    if input_file is None or input_file == "-":
        stdin = sys.stdin
        data = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode()
    else:
        path = Path(input_file)
        if not path.is_file():
            what = "a directory" if path.is_dir() else "not a file" if path.exists() else "missing"
            raise InputFileError(
                f"--input {input_file} is {what}; give a text file, one input a line"
            )
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InputFileError(f"--input {input_file} cannot be read: {exc.strerror}") from None
    return [InputLine("line", n, t, r) for n, (t, r) in enumerate(split_lines(data), start=1)]


def encode_inputs(
    generator: Generator, lines: list[InputLine], options: GenerationOptions
) -> dict[int, Source]:
    """Encode every input up front as resolved `options` run it (so an over-long line fails
    before any output); print one warning each for replaced bytes, inputs with no known
    symbol, unknown symbols and truncation."""
    sources: dict[int, Source] = {}
    for index, line in enumerate(lines):
        try:
            sources[index] = generator.encode_input(line.text, options)
        except InputTooLongError as exc:
            if options.split_sentences:
                raise InputTooLongError(f"{line.label} {line.number}, {exc}") from None
            length = len(generator.tokenizers.source.encode(line.text)) + 1
            raise InputTooLongError(
                f"{line.label} {line.number} has {length} source tokens with </s> but the "
                f"model's max_len is {generator.config.max_len}; shorten it or pass --truncate"
            ) from None
    replaced = [f"{line.label} {line.number}" for line in lines if line.replaced]
    if replaced:
        warn(f"not valid UTF-8, bytes replaced by U+FFFD: {_first(replaced)}")
    nothing = [f"{lines[i].label} {lines[i].number}" for i, s in sources.items()
               if s.skipped == "unknown"]  # fmt: skip
    if nothing:
        warn(f"no symbol of the source vocabulary, output left empty: {_first(nothing)}")
    run = {i: s for i, s in sources.items() if not s.skipped}
    unknown = sorted({s for source in run.values() for s in source.unknown})
    if unknown:
        where = [f"{lines[i].label} {lines[i].number}" for i, s in run.items() if s.unknown]
        shown = " ".join(repr(s) for s in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
        warn(f"symbols outside the source vocabulary, fed as <unk>: {shown} ({_first(where)})")
    truncated = [f"{lines[i].label} {lines[i].number}" for i, s in sources.items() if s.truncated]
    if truncated:
        limit = generator.config.max_len
        warn(f"cut to max_len {limit} tokens (with </s>): {_first(truncated)}")
    return sources


def _id_lists(text: str | None) -> tuple[tuple[int, ...], ...] | None:
    """--bad-words-ids JSON ("[[5], [7, 8]]") as tuples; None when not given."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(w, list) for w in value):
        raise click.UsageError(
            f'--bad-words-ids takes a JSON list of id lists, e.g. "[[5]]"; got {text}'
        )
    return tuple(tuple(w) for w in value)


def _first(labels: list[str], shown: int = 5) -> str:
    """ "line 2, line 7" or "line 2, line 7, ... (12 inputs)"."""
    text = ", ".join(labels[:shown])
    return text if len(labels) <= shown else f"{text}, ... ({len(labels)} inputs)"


def result_json(line: InputLine, result: Result | None, generator: Generator) -> dict[str, Any]:
    """The JSON object printed for one input with --json (see runtime/results.py)."""
    return results_json(line.number, line.text, result, generator.tokenizers.target)


@click.command(epilog=INPUT_RULES)
@click.argument("bundle", type=click.Path(path_type=Path))
@click.argument("texts", nargs=-1)
@click.option(
    "--input", "input_file", metavar="FILE", help="Read input lines from FILE (- = stdin)."
)
@click.option("--beam", type=int, default=None, help="Beam size (1: greedy). [model default]")
@click.option(
    "--n-best",
    type=int,
    default=1,
    show_default=True,
    help="Hypotheses per input (--json; <= --beam).",
)
@click.option(
    "--length-penalty",
    type=float,
    default=None,
    help="Beam ranking: logprob / length**penalty. [model default]",
)
@click.option(
    "--early-stopping",
    type=click.Choice(["true", "false", "never"]),
    default=None,
    help="Beam search stops an input at --beam finished outputs (true), or when no live beam "
    "can beat them (false, never: as transformers). [model default]",
)
@click.option("--no-repeat-ngram-size", type=int, help="No n-gram of N twice. [model default]")
@click.option("--min-new-tokens", type=int, help="No </s> before N tokens. [model default]")
@click.option(
    "--bad-words-ids", metavar="JSON", help="Ids never output: [[5], [7, 8]]. [model default]"
)
@click.option("--forced-eos/--no-forced-eos", default=None, help="</s> at the cap. [model default]")
@click.option("--renormalize/--no-renormalize", default=None, help="Re-normalise. [model default]")
@click.option(
    "--split-sentences",
    is_flag=True,
    help="Split each input into sentences (needs the split extra), generate them, join the "
    "outputs in order.",
)
@click.option("--sample", is_flag=True, help="Sample instead of taking the most likely token.")
@click.option("--temperature", type=float, default=None, help="Sampling temperature (default 1.0).")
@click.option("--top-k", type=int, default=None, help="Sample among the k most likely tokens.")
@click.option("--top-p", type=float, default=None, help="Nucleus sampling threshold in (0, 1].")
@click.option("--seed", type=int, default=None, help="Seed: same seed + same input = same sample.")
@click.option(
    "--batch-size", type=int, default=32, show_default=True, help="Inputs per engine batch."
)
@click.option(
    "--max-new-tokens", type=int, default=None, help="Cap on generated tokens. [model default]"
)
@provider_option()
@threads_option()
@variant_option()
@click.option(
    "--search",
    "search_mode",
    type=click.Choice(SEARCH_MODES),
    default="auto",
    show_default=True,
    help="auto: greedy and beam search run in the bundle's one-graph search variant when "
    "it has one (one onnxruntime call per batch): on CUDA always, on the CPU while a "
    "batch's hypotheses (inputs x beam) times one decoder step's compute stay within a "
    "budget (8 hypotheses on g2p-en), else in the Python loop; graph: insist on the "
    "variant; loop: always the Python loop. Sampling and --stream use the loop.",
)
@click.option(
    "--target-lang", default=None, help="Target language code of a multilingual model's list."
)
@click.option("--source-lang", default=None, help="Source language code (default: the model's).")
@click.option(
    "--target-prefix",
    default=None,
    help="Text every output starts with (forced after the target language; it counts in "
    "--max-new-tokens and is part of the output).",
)
@click.option(
    "--task",
    default=None,
    help="A task the bundle records (T5's task_specific_params, e.g. translation_en_to_de): "
    "its prefix goes before every input.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per input line.")
@click.option(
    "--truncate", is_flag=True, help="Cut over-long inputs to max_len instead of failing."
)
@click.option(
    "--stream", is_flag=True, help="Print tokens as they are generated (greedy/sampling)."
)
def generate(
    bundle: Path,
    texts: tuple[str, ...],
    input_file: str | None,
    beam: int | None,
    n_best: int,
    length_penalty: float | None,
    early_stopping: str | None,
    no_repeat_ngram_size: int | None,
    min_new_tokens: int | None,
    bad_words_ids: str | None,
    forced_eos: bool | None,
    renormalize: bool | None,
    split_sentences: bool,
    sample: bool,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    batch_size: int,
    max_new_tokens: int | None,
    provider: str | None,
    threads: int | None,
    variant: str | None,
    search_mode: str,
    target_lang: str | None,
    source_lang: str | None,
    target_prefix: str | None,
    task: str | None,
    as_json: bool,
    truncate: bool,
    stream: bool,
) -> None:
    """Generate outputs for TEXT arguments, or for input lines, with the bundle BUNDLE (a
    directory, or a built-in model name such as g2p-en: `edgeseq models` lists them)."""
    sampling = {"--temperature": temperature, "--top-k": top_k, "--top-p": top_p, "--seed": seed}
    given = [name for name, value in sampling.items() if value is not None]
    if given and not sample:
        raise click.UsageError(f"{', '.join(given)} only apply with --sample")
    if n_best > 1 and not as_json:
        raise click.UsageError("--n-best prints its list with --json only")
    if stream and (as_json or (beam or 1) > 1 or split_sentences):
        raise click.UsageError(
            "--stream works with greedy or sampling and plain output, on whole inputs"
        )
    if search_mode == "graph" and (sample or stream):
        raise click.UsageError("--search graph runs greedy and beam search; --sample and "
                               "--stream run on the Python loop (use --search auto)")  # fmt: skip
    options = GenerationOptions(
        max_new_tokens=max_new_tokens,
        beam_size=beam,
        n_best=n_best,
        length_penalty=length_penalty,
        early_stopping={"true": True, "false": False}.get(early_stopping or "", early_stopping),
        no_repeat_ngram_size=no_repeat_ngram_size,
        min_new_tokens=min_new_tokens,
        bad_words_ids=_id_lists(bad_words_ids),
        forced_eos=forced_eos,
        renormalize=renormalize,
        split_sentences=split_sentences,
        sample=sample,
        temperature=1.0 if temperature is None else temperature,
        top_k=top_k or 0,
        top_p=1.0 if top_p is None else top_p,
        seed=seed,
        batch_size=batch_size,
        truncate=truncate,
        source_lang=source_lang,
        target_lang=target_lang,
        target_prefix=target_prefix,
        task=task,
    )
    generator = Generator.load(
        bundle, providers=provider, threads=threads, variant=variant, search=search_mode
    )
    # the model's default languages and generation settings; unknown codes
    options = generator.resolve(options)
    lines = read_inputs(texts, input_file)
    # checks and warnings before any output
    encode_inputs(generator, lines, options)
    if stream:
        for line in lines:
            for piece in generator.stream(line.text, options):
                click.echo(piece, nl=False)
            click.echo()
        return
    # A bar for inputs longer than one batch, when output goes to a file or pipe (a bar
    # between output lines on the same terminal would garble them).
    # Chunks of batch_size lines are exactly the groups Generator.generate batches, so the
    # CLI and the API give the same outputs (which matters for int8 graphs).
    shown = len(lines) > batch_size and not sys.stdout.isatty()
    cut: list[str] = []
    with progress_bar(len(lines) if shown else 0, "line", "generate", disable=not shown) as bar:
        for start in range(0, len(lines), batch_size):
            chunk = lines[start : start + batch_size]
            results = generator.generate([line.text for line in chunk], options)
            for line, result in zip(chunk, results, strict=True):
                if not result.finished and not result.skipped:
                    cut.append(f"{line.label} {line.number}")
                if as_json:
                    row = result_json(line, result, generator)
                    click.echo(json.dumps(row, ensure_ascii=False))
                else:
                    click.echo(result.text)
            bar.update(len(chunk))
    if cut:
        cap = options.max_new_tokens  # the flag's, else the model's generation default
        limit = f"--max-new-tokens {cap}" if max_new_tokens else "the model's max_len"
        limit = f"the model's max_new_tokens {cap}" if cap and not max_new_tokens else limit
        warn(f"output cut at {limit} before </s>: {_first(cut)}")
