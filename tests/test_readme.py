"""The README's commands, run as written, so that the README cannot drift from the code.

Every command of README.md is listed below, in CHEAP or in SLOW, and
`test_every_readme_command_is_listed` fails when the README gains a command that is in
neither (or loses one that is): a new command must be given a test here.

- A command is a `$ ` line of a ```bash / ```sh / ```console block (the lines under it, up to
  the next `$ `, are the output the README shows; `...` in them stands for any text), or the
  command cell of a results table. A trailing `# comment` is not part of it.
- CHEAP commands (a few seconds: the built-in model, `--help`) run in every `pytest`, alone, in
  a temporary directory, with this interpreter's bin/ first on PATH: exit code 0, and every
  line the README shows appears in the output, in order.
- SLOW commands (installs, `make`, the export, full evaluations and benchmarks: minutes each)
  run block by block, as a reader runs them, only with EDGESEQ_README_SLOW=1 (`make test`
  runs the slow marker too, and these would take it from minutes to an hour). A block with
  `pip install` runs in a fresh virtual environment; `make` and `pip` run in the repository,
  the rest in one working directory shared by the file's tests (`models/`, `benchmarks/`
  linked from the repository), so the results table finds the quick start's bundle.

The README's Python example runs too (its ```text block is its output), the synopses of the
commands table are checked against each command's `--help`, and every link of README.md,
docs/ and models/*/README.md must point at a file and heading that exist (anchors as GitHub
computes them from headings). README.md and docs/*.md stay within their
sizes: line counts, prose lines of at most 120 characters, table cells of at most 300.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent  # the virtual environment running the tests
SLOW_ENV = "EDGESEQ_README_SLOW"
SHELL_FENCES = {"bash", "sh", "console", "shell"}
MAX_README_LINES = 130
MAX_DOC_LINES = 450
MAX_PROSE_CHARS = 120  # a line outside code blocks and tables
MAX_CELL_CHARS = 300  # a table cell that is not one code span
MAX_ROW_CHARS = 400  # a whole table row: wider than that reads better as a list

# Run in every pytest: a few seconds each.
CHEAP = {
    "edgeseq generate g2p-en hello world": "the built-in int8 bundle",
    "edgeseq models": "lists the built-in bundles",
}
# Run only with EDGESEQ_README_SLOW=1, each with the reason it is slow.
SLOW = {
    "pip install .": "installs edgeseq and its dependencies into a fresh virtual environment",
    "pip install '.[train]'": "installs torch into a fresh virtual environment",
    "make wheel": "creates .venv with every extra, then builds the wheel",
    "pip install dist/edgeseq-0.1.0-py3-none-any.whl": "installs the wheel into a fresh venv",
    "make demo": "exports the shipped model and benchmarks it (minutes)",
    "make test": "the whole test suite (run without EDGESEQ_README_SLOW: no recursion)",
    "edgeseq export models/g2p-en --out bundles/g2p-en --variants fp32,int8": (
        "exports the shipped 7+7-layer model with its parity levels and int8 gate"
    ),
    "edgeseq generate bundles/g2p-en --provider cpu hello world quokkaesque": "needs the export",
    "echo pronunciation | edgeseq generate bundles/g2p-en --provider cpu --variant int8": "export",
    "edgeseq inspect bundles/g2p-en": "needs the export",
    "edgeseq evaluate models/g2p-en --split test --threads 2": "6,456 words through PyTorch",
    "edgeseq evaluate models/g2p-en --split test --threads 2 --beam 4": "the same, beam 4",
    "python benchmarks/variant_accuracy.py bundles/g2p-en --split test --threads 2": (
        "6,456 words through the int8 bundle of the export"
    ),
    "edgeseq bench bundles/g2p-en --checkpoint models/g2p-en --inputs 64 --repeats 3 "
    "--rounds 3 --threads 1": "3 rounds of PyTorch and onnxruntime",
    "make test-families": "builds and exports four d_model-512, 6+6-layer models (~20 min)",
    "make bench-marian": (
        "builds an opus-mt-sized Marian and Optimum's venv, exports, 3 passes of 6 engines"
    ),
}


@dataclass
class Command:
    """One README command: the line after `$ ` (without its comment) and what it prints."""

    line: str
    block: int  # the shell block it is in; a table's command is a block of its own
    output: list[str] = field(default_factory=list)


@dataclass
class Readme:
    commands: list[Command]
    orphans: list[str]  # lines of a shell block before its first `$ ` command
    synopses: list[str]  # the commands table's `edgeseq ...` cells
    python: list[tuple[str, str | None]]  # each ```python block and the ```text block after it


def cells(row: str) -> list[str]:
    """The cells of a Markdown table row (`\\|` inside a cell is a literal bar)."""
    parts = re.split(r"(?<!\\)\|", row.strip().strip("|"))
    return [p.strip().replace("\\|", "|") for p in parts]


def strip_comment(line: str) -> str:
    return re.sub(r"\s+#\s.*$", "", line).strip()


def parse_readme(text: str) -> Readme:
    commands: list[Command] = []
    orphans: list[str] = []
    synopses: list[str] = []
    python: list[tuple[str, str | None]] = []
    lines = text.splitlines()
    block, fence, body, header = -1, None, [], None
    for i, line in enumerate(lines):
        if fence is not None:
            if line.startswith("```"):
                if fence == "python":
                    python.append(("\n".join(body) + "\n", None))
                elif fence == "text" and python and python[-1][1] is None:
                    python[-1] = (python[-1][0], "\n".join(body) + "\n")
                fence = None
            elif fence in SHELL_FENCES:
                if line.startswith("$ "):
                    commands.append(Command(strip_comment(line[2:]), block))
                elif commands and commands[-1].block == block:
                    commands[-1].output.append(line)
                elif line.strip():
                    orphans.append(line)
            else:
                body.append(line)
            continue
        if match := re.match(r"```(\w*)\s*$", line):
            fence, body = match.group(1), []
            block += fence in SHELL_FENCES
        elif line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|--"):
            header = cells(line)
        elif line.startswith("|") and header and not line.startswith("|--"):
            row = cells(line)
            if header[-1] == "command":  # a results table: its last cell is a command
                block += 1
                commands.append(Command(strip_comment(row[-1].strip("`")), block))
            elif header[0] == "command":  # the commands table: synopses
                synopses += re.findall(r"`(edgeseq [^`]*)`", row[0])
        elif not line.startswith("|"):
            header = None
    return Readme(commands, orphans, synopses, python)


README_TEXT = README.read_text(encoding="utf-8")
PARSED = parse_readme(README_TEXT)


def shows(expected: list[str], output: str) -> bool:
    """Every line the README shows is a line of the output, in order (`...`: any text)."""
    patterns = [
        re.compile(".*".join(re.escape(part) for part in line.rstrip().split("...")))
        for line in expected
    ]
    found = 0
    for line in output.splitlines():
        if found < len(patterns) and patterns[found].fullmatch(line.rstrip()):
            found += 1
    return found == len(patterns)


def base_env() -> dict[str, str]:
    """This environment with the tests' bin/ first on PATH; outputs are the CPU's (the README
    shows a machine without a GPU)."""
    env = {**os.environ, "EDGESEQ_PROVIDER": "cpu"}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    return env


def run(command: str, cwd: Path, env: dict[str, str], timeout: float):
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check(command: Command, proc) -> None:
    assert proc.returncode == 0, f"$ {command.line}\nexit {proc.returncode}\n{proc.stderr}"
    assert shows(command.output, proc.stdout), (
        f"$ {command.line}\nthe README shows:\n"
        + "\n".join(command.output)
        + f"\nthe command printed:\n{proc.stdout}"
    )


# -- the list ---------------------------------------------------------------------------------
def test_every_readme_command_is_listed() -> None:
    found = {c.line for c in PARSED.commands}
    listed = set(CHEAP) | set(SLOW)
    assert not set(CHEAP) & set(SLOW)
    assert sorted(found - listed) == [], "README commands that no test runs: add them here"
    assert sorted(listed - found) == [], "commands listed here that the README no longer has"


def test_every_shell_block_line_is_a_command_or_its_output() -> None:
    assert PARSED.orphans == [], "write commands as `$ command` lines"


def test_the_parser_finds_commands_outputs_and_tables() -> None:
    """A guard for the tests above: a parser that finds nothing would pass them."""
    by_line = {c.line: c for c in PARSED.commands}
    assert by_line["edgeseq generate g2p-en hello world"].output == ["HH AH0 L OW1", "W ER1 L D"]
    assert "edgeseq evaluate models/g2p-en --split test --threads 2" in by_line
    assert any(s.startswith("edgeseq export CKPT") for s in PARSED.synopses)
    assert len(PARSED.python) >= 1
    sample = "```bash\n$ a x  # note\nout\n```\n\n| a | command |\n|---|---|\n| 1 | `b y` |\n"
    parsed = parse_readme(sample)
    assert [(c.line, c.output, c.block) for c in parsed.commands] == [
        ("a x", ["out"], 0),
        ("b y", [], 1),
    ]
    assert shows(["x ... z"], "w\nx long y z\n") and not shows(["x ... z"], "x y\n")


# -- cheap: every pytest ----------------------------------------------------------------------
@pytest.mark.parametrize("line", sorted(CHEAP))
def test_cheap_command(line: str, tmp_path) -> None:
    [command] = [c for c in PARSED.commands if c.line == line] or [Command(line, -1)]
    check(command, run(line, tmp_path, base_env(), timeout=120))


def test_the_python_example(tmp_path) -> None:
    """The README's Python block (the built-in model: no export needed) prints its ```text."""
    for code, expected in PARSED.python:
        assert expected is not None, f"a ```text block of its output must follow:\n{code}"
        script = tmp_path / "example.py"
        script.write_text(code, encoding="utf-8")
        proc = run(f"python {script}", tmp_path, base_env(), timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == expected


def edgeseq_help(args: list[str]) -> str:
    proc = run(" ".join(["edgeseq", *args, "--help"]), ROOT, base_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_commands_table_matches_the_cli() -> None:
    """Every subcommand has a row, and every option and file a row names exists."""
    listed = re.findall(r"^  (\w+) ", edgeseq_help([]).split("Commands:")[1], re.M)
    in_table = {s.split()[1] for s in PARSED.synopses}
    assert sorted(set(listed) - in_table) == [], "subcommands missing from the commands table"
    assert sorted(in_table - set(listed)) == [], "table rows for subcommands that do not exist"
    for name in sorted(in_table):
        options = set(re.findall(r"--[a-z0-9-]+", edgeseq_help([name])))
        for synopsis in (s for s in PARSED.synopses if s.split()[1] == name):
            named = set(re.findall(r"--[a-z0-9-]+", synopsis))
            assert named <= options, f"{synopsis}: no {sorted(named - options)}"
            for path in re.findall(r"\S+/\S+\.json", synopsis):
                assert (ROOT / path).is_file(), f"{synopsis}: no {path}"


# -- slow: EDGESEQ_README_SLOW=1 --------------------------------------------------------------
SLOW_BLOCKS = [
    [c for c in PARSED.commands if c.block == block]
    for block in dict.fromkeys(c.block for c in PARSED.commands if c.line in SLOW)
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A reader's working directory: the repository's models/ and benchmarks/, and the bundles
    the quick start exports (kept for the results table)."""
    path = tmp_path_factory.mktemp("readme")
    for name in ("models", "benchmarks"):
        (path / name).symlink_to(ROOT / name)
    return path


def fresh_venv(path: Path) -> dict[str, str]:
    """An environment whose `pip` and `edgeseq` are those of a new, empty virtual environment."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    env = {**os.environ, "EDGESEQ_PROVIDER": "cpu", "VIRTUAL_ENV": str(path)}
    rest = [p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != BIN]
    env["PATH"] = os.pathsep.join([str(path / "bin"), *rest])
    return env


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get(SLOW_ENV) != "1",
    reason=f"{SLOW_ENV}=1 runs the README's slow commands (installs, make, export: minutes)",
)
@pytest.mark.parametrize("commands", SLOW_BLOCKS, ids=[b[0].line for b in SLOW_BLOCKS])
def test_slow_block(commands: list[Command], workdir: Path, tmp_path) -> None:
    lines = [c.line for c in commands]
    if any(line.startswith("make ") for line in lines) and not shutil.which("make"):
        pytest.skip("no make on this machine")
    if any("vs_ctranslate2" in line for line in lines) and not importlib.util.find_spec(
        "ctranslate2"
    ):
        pytest.skip("the bench extra (ctranslate2) is not installed")
    exports = any(line.startswith("edgeseq export") for line in lines)
    needs_bundle = any("bundles/g2p-en" in line for line in lines) and not exports
    if needs_bundle and not (workdir / "bundles" / "g2p-en").is_dir():
        pytest.skip("needs the quick start's export (run the whole file)")
    installs = any(line.startswith("pip install") for line in lines)
    env = fresh_venv(tmp_path / "venv") if installs else base_env()
    for command in commands:
        in_repo = command.line.startswith(("make ", "pip "))
        cmd_env = env
        if command.line == "make test":  # the suite runs this file: no slow tests inside it
            cmd_env = {k: v for k, v in env.items() if k != SLOW_ENV}
        proc = run(command.line, ROOT if in_repo else workdir, cmd_env, timeout=3600)
        check(command, proc)


# -- the documents ----------------------------------------------------------------------------
FENCE = re.compile(r"\s{0,3}(```|~~~)")


def github_anchor(title: str) -> str:
    """The anchor GitHub gives a heading's text: links and images reduced to their text, HTML
    tags dropped, lower case, every character but letters, digits, `_`, `-` and spaces
    dropped, spaces made `-` (a second equal anchor gets `-1`: see `headings`)."""
    title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", title)
    title = re.sub(r"<[^>]+>", "", title).strip().lower()
    return "".join(c for c in title if c.isalnum() or c in "_- ").replace(" ", "-")


def headings(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (code blocks skipped), with `-1`, `-2`
    ... for repeated ones, and the ids of its HTML anchors (`<a id="x">`, `<a name="x">`)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fence = not fence
        elif not fence and (match := re.match(r" {0,3}#{1,6}\s+(.*?)(\s+#+)?\s*$", line)):
            anchor = github_anchor(match.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            anchors.add(anchor if count == 0 else f"{anchor}-{count}")
        if not fence:
            anchors.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line))
    return anchors


def prose(text: str) -> str:
    """`text` without fenced code blocks and inline code spans (their brackets are not links)."""
    lines, fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fence = not fence
        elif not fence:
            lines.append(re.sub(r"(`+)[^`]+?\1", "", line))
    return "\n".join(lines)


def broken_links(doc: Path) -> list[str]:
    """Each link of `doc` (`[text](target)`, `[text]: target`, and a bare `page.md#anchor`)
    whose file does not exist or whose file has no heading of that anchor."""
    text = prose(doc.read_text(encoding="utf-8"))
    targets = re.findall(r"\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)", text)
    targets += re.findall(r"^\s{0,3}\[[^\]]+\]:\s+<?([^\s>]+)", text, re.M)
    bare = re.sub(r"\]\([^)]*\)", "]", text)  # what is left outside the links
    targets += re.findall(r"(?<![\w/.:-])([\w./-]+\.md#[\w-]+)", bare)
    bad = []
    for target in targets:
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # a URL or mailto:
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            bad.append(f"{target}: no {path}")
        elif anchor and file.suffix == ".md" and anchor not in headings(file):
            bad.append(f"{target}: no heading #{anchor} in {file.name}")
    return bad


DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINKING = [*DOCS, *sorted((ROOT / "models").glob("*/README.md"))]  # every page a reader opens


def test_the_link_check_finds_missing_files_and_anchors(tmp_path: Path) -> None:
    """A guard for the test below: GitHub's anchors, repeated headings, code skipped."""
    assert github_anchor("What users run today: `benchmarks/vs_optimum.py`") == (
        "what-users-run-today-benchmarksvs_optimumpy"
    )
    assert github_anchor("A [linked](x.md) *heading*, 2×") == "a-linked-heading-2"
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## Part\n\n## Part\n\n```\n# not a heading\n[x](gone.md)\n```\n"
        "[a](#part-1) [b](#part-2) [c](page.md#title) [d](gone.md) `[e](gone2.md)`\n"
        "[f](#not-a-heading) see page.md#nowhere or <https://x.org/y.md#z>\n[g]: other.md\n",
        encoding="utf-8",
    )
    assert headings(page) == {"title", "part", "part-1"}
    assert broken_links(page) == [
        "#part-2: no heading #part-2 in page.md",
        "gone.md: no gone.md",
        "#not-a-heading: no heading #not-a-heading in page.md",
        "other.md: no other.md",
        "page.md#nowhere: no heading #nowhere in page.md",
    ]


@pytest.mark.parametrize("doc", LINKING, ids=[str(p.relative_to(ROOT)) for p in LINKING])
def test_every_link_resolves(doc: Path) -> None:
    assert broken_links(doc) == []


def test_the_readme_and_docs_stay_short() -> None:
    assert len(README_TEXT.splitlines()) <= MAX_README_LINES
    long = {
        p.name: n
        for p in DOCS[1:]
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_DOC_LINES
    }
    assert long == {}


def too_wide(text: str) -> list[str]:
    """`line N: ...` per prose line over MAX_PROSE_CHARS, table row over MAX_ROW_CHARS and
    cell over MAX_CELL_CHARS; fenced code and one-code-span cells (commands) are exempt."""
    found, fence = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
        elif fence:
            continue
        elif line.lstrip().startswith("|"):  # a table row, perhaps indented in a list
            if len(line) > MAX_ROW_CHARS:
                found.append(f"line {number}: a table row of {len(line)} characters")
            found += [
                f"line {number}: a cell of {len(cell)} characters"
                for cell in cells(line)
                if len(cell) > MAX_CELL_CHARS and not re.fullmatch(r"`[^`]*`", cell)
            ]
        elif len(line) > MAX_PROSE_CHARS:
            found.append(f"line {number}: {len(line)} characters")
    return found


def test_the_width_check_finds_long_lines_and_cells() -> None:
    """A guard for the test below: a checker that finds nothing would pass it."""
    cell = "x" * (MAX_CELL_CHARS + 1)
    rows = f"| a | b |\n|---|---|\n| {cell} | `{cell}` |\n  | {'t' * 200} |\n"
    rows += f"| {'u' * 200} | {'v' * 200} |\n"  # cells within the limit, the row over it
    sample = f"{'p' * 121}\n```\n{'c' * 200}\n```\n{rows}"
    found = ["line 1: 121 characters", "line 7: a table row of 611 characters"]
    found += ["line 7: a cell of 301 characters", "line 9: a table row of 407 characters"]
    assert too_wide(sample) == found


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_prose_lines_and_table_cells_stay_narrow(doc: Path) -> None:
    """Prose lines of at most 120 characters and table cells of at most 300: what does not
    fit is split into prose or more rows."""
    assert too_wide(doc.read_text(encoding="utf-8")) == []
