"""Every `edgeseq` command (and wheel) that README.md and docs/*.md write agrees with the CLI.

Commands are found in two places: lines of fenced code blocks that start with `edgeseq ` (or
`$ edgeseq `), continued by a trailing backslash or by indented lines (a synopsis), and inline
code spans that start with `edgeseq ` (they may cross a line break).

- Each names a subcommand that exists and only options that subcommand has.
- A runnable command (a code-block line, or an inline span that names a path: it has a `/`)
  gives the subcommand's required options (`edgeseq train ... --out DIR`).
- A synopsis (a code-block command whose first argument is an uppercase placeholder or an
  optional `[...]`, as `edgeseq generate BUNDLE [TEXT ...] [--input FILE] ...`) names every
  option of the subcommand (either side of a `--flag/--no-flag` pair), as `--help` lists them.

The options come from the click commands themselves (`cli.get_command`), not from a copy.
A wheel file the docs name is the one `make wheel` builds: pyproject.toml's version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from edgeseq.cli.main import COMMANDS, cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OPTION = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")
SYNOPSIS = re.compile(r"edgeseq [a-z]+ ([A-Z]|\[)")


@dataclass
class DocCommand:
    where: str  # "page.md:line"
    text: str  # the command, continuation lines joined, without a trailing `# comment`
    runnable: bool
    synopsis: bool


def _strip_comment(line: str) -> str:
    return re.sub(r"\s+#\s.*$", "", line).rstrip()


def is_command(line: str) -> bool:
    """A code-block line that runs `edgeseq` (not a diagram's "edgeseq checkpoint ──┐")."""
    return line.startswith("edgeseq ") and "─" not in line


def find_commands(name: str, text: str) -> list[DocCommand]:
    """The `edgeseq ...` commands of one Markdown page (see the module docstring)."""
    found: list[DocCommand] = []
    lines = text.splitlines()
    fence, prose = False, []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fence = not fence
            prose.append("")
        elif not fence:
            prose.append(line)
        elif is_command(body := re.sub(r"^\$ ", "", line.strip())):
            start, parts = i, [_strip_comment(body)]
            while i + 1 < len(lines) and (
                parts[-1].endswith("\\") or re.match(r"\s+\[", lines[i + 1])
            ):
                parts[-1] = parts[-1].rstrip("\\").rstrip()
                i += 1
                parts.append(_strip_comment(lines[i].strip()))
            command = " ".join(parts)
            found.append(
                DocCommand(f"{name}:{start + 1}", command, True, bool(SYNOPSIS.match(command)))
            )
            prose.append("")
        else:
            prose.append("")
        i += 1
    joined = "\n".join(prose)
    for match in re.finditer(r"`(edgeseq [^`]+)`", joined):
        number = joined.count("\n", 0, match.start()) + 1
        command = " ".join(match.group(1).split())
        found.append(DocCommand(f"{name}:{number}", command, "/" in command, False))
    return found


@dataclass
class Options:
    names: set[str]  # every option string, both sides of a flag pair
    groups: list[set[str]]  # one set per option: naming any one of it names the option
    required: list[str]


def options_of(subcommand: str) -> Options:
    command = cli.get_command(click.Context(cli), subcommand)
    assert command is not None, subcommand
    params = [p for p in command.params if isinstance(p, click.Option)]
    groups = [{o for o in (*p.opts, *p.secondary_opts) if o.startswith("--")} for p in params]
    groups = [g for g in groups if g and g != {"--help"}]
    required = [min(g) for p, g in zip(params, groups, strict=False) if p.required]
    return Options({o for g in groups for o in g} | {"--help"}, groups, required)


COMMANDS_IN_DOCS = [c for doc in DOCS for c in find_commands(doc.name, doc.read_text("utf-8"))]


def test_the_finder_sees_blocks_spans_continuations_and_synopses() -> None:
    """A guard for the tests below: a finder that finds nothing would pass them."""
    page = (
        "Run `edgeseq train --task reverse\n--out runs/rev` first.\n\n```\n"
        "$ edgeseq bench b --threads 1 \\\n  --inputs 8   # note\n"
        "edgeseq generate BUNDLE [--beam N]\n                 [--json]\n```\n"
    )
    found = [(c.where, c.text, c.runnable, c.synopsis) for c in find_commands("p.md", page)]
    assert found == [
        ("p.md:5", "edgeseq bench b --threads 1 --inputs 8", True, False),
        ("p.md:7", "edgeseq generate BUNDLE [--beam N] [--json]", True, True),
        ("p.md:1", "edgeseq train --task reverse --out runs/rev", True, False),
    ]
    assert len(COMMANDS_IN_DOCS) > 100
    assert {c.text.split()[1] for c in COMMANDS_IN_DOCS} == set(COMMANDS)
    assert any(c.synopsis and c.text.startswith("edgeseq export") for c in COMMANDS_IN_DOCS)
    assert options_of("train").required == ["--out"]


@pytest.mark.parametrize("command", COMMANDS_IN_DOCS, ids=[c.where for c in COMMANDS_IN_DOCS])
def test_a_doc_command_matches_the_cli(command: DocCommand) -> None:
    subcommand = command.text.split()[1]
    assert subcommand in COMMANDS, f"{command.where}: no command {subcommand!r}: {command.text}"
    options = options_of(subcommand)
    named = set(OPTION.findall(command.text))
    assert sorted(named - options.names) == [], f"{command.where}: {command.text}"
    if command.runnable:
        missing = [o for o in options.required if o not in named]
        assert missing == [], f"{command.where}: required {missing}: {command.text}"
    if command.synopsis:
        missing = [sorted(g) for g in options.groups if not g & named]
        assert missing == [], f"{command.where}: the synopsis lacks {missing}"


def test_wheel_names_are_the_wheel_make_builds() -> None:
    """A wheel file the docs or deploy/ name is the one `make wheel` writes: this version's."""
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    texts = [*DOCS, *sorted((ROOT / "deploy").iterdir())]
    named = {
        (path.name, wheel)
        for path in texts
        if path.is_file()
        for wheel in re.findall(r"edgeseq-[\w.]+-py3-none-any\.whl", path.read_text("utf-8"))
    }
    assert named, "no wheel named: the pattern no longer matches the docs"
    expected = f"edgeseq-{version.group(1)}-py3-none-any.whl"
    assert sorted(n for n in named if n[1] != expected) == []
