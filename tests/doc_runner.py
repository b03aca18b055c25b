"""Run a docs page's commands in order, as a reader runs them, and compare what they print with
what the page shows (tests/test_opus_mt_page.py, tests/test_doc_pages.py).

A page's steps, in page order:

- each `$ command` line of a ```bash / ```sh / ```console or plain ``` block, the lines
  under it (up to the next `$ `) being the output the page shows (`...` in a line stands
  for any text; timing values such as `[ 12.3s]`, `4.1 s` or `9 ms`, and differences such as
  `2.7e-06` or `7e-08`, are compared as numbers of any value);
- each ```python block, run with `python` in the working directory, compared with the
  ```text block that follows it, if any.

Markers the runner recognises, written on the page for the reader too:

- a command whose comment says `# not run here` (a download, an install from the hub), or a
  python block whose first line says it, is skipped;
- a command ending in ` &` (a server) starts in the background; it is stopped (SIGINT, as
  Ctrl-C) after the page's last step, and its output is compared then;
- a command whose shown output has an `error: ` line must exit 1; every other must exit 0;
- a command ending in a here-document (`<<'EOF'`) takes the lines up to its terminator.

Output is compared against stdout followed by stderr (warnings come after the outputs).
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from test_readme import SHELL_FENCES, run, shows, strip_comment

FENCES = {*SHELL_FENCES, ""}  # a plain ``` block of `$ ` lines is a shell session too

NOT_RUN = "# not run here"
# Timing values, and measured differences in scientific notation (parity's max|Δ|, which vary
# with the thread count): compared as any value. The verdict beside each (`ok`) is compared.
TIMING = re.compile(r"\[\s*\d+(\.\d+)?s\]|\b\d+(\.\d+)? ?(s|ms)\b|\b\d(\.\d)?e[+-]\d\d\b")


@dataclass
class Step:
    """One command or python block of a page, with the output the page shows."""

    where: str  # "page.md:line"
    kind: str  # "shell" or "python"
    text: str  # the command (comment removed) or the python code
    output: list[str] = field(default_factory=list)
    skip: bool = False  # marked `# not run here`
    background: bool = False  # ends in ` &`


def page_steps(name: str, text: str) -> list[Step]:
    """The steps of one Markdown page (see the module docstring), in page order."""
    steps: list[Step] = []
    fence, body, start, heredoc = None, [], 0, None
    first = 0  # the index of the current block's first step: output belongs to its own block
    for number, line in enumerate(text.splitlines(), 1):
        if heredoc is not None:  # the body of a `<<'EOF'` command: part of the command
            steps[-1].text += "\n" + line
            heredoc = None if line == heredoc else heredoc
            continue
        if fence is None:
            if match := re.match(r"```(\w*)\s*$", line):
                fence, body, start, first = match.group(1), [], number, len(steps)
            continue
        if line.startswith("```"):
            if fence == "python":
                skip = bool(body) and body[0].startswith(NOT_RUN)
                steps.append(Step(f"{name}:{start}", "python", "\n".join(body) + "\n", [], skip))
            elif fence == "text" and steps and steps[-1].kind == "python":
                steps[-1].output = body
            fence = None
        elif fence in FENCES and line.startswith("$ "):
            command = strip_comment(line[2:])
            background = command.endswith(" &")
            command = command.removesuffix(" &").strip() if background else command
            steps.append(
                Step(f"{name}:{number}", "shell", command, [], NOT_RUN in line, background)
            )
            if match := re.search(r"<<-?'?(\w+)'?\s*$", command):
                heredoc = match.group(1)
        elif fence in FENCES and len(steps) > first and steps[-1].kind == "shell":
            steps[-1].output.append(line)
        else:
            body.append(line)
    return steps


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def untimed(lines: list[str]) -> list[str]:
    """Lines with every timing value replaced by `...` (any text)."""
    return [TIMING.sub("...", line) for line in lines]


def mismatch(step: Step, returncode: int, stdout: str, stderr: str) -> str | None:
    """Why `step` failed (wrong exit code, an output line the page shows missing), or None."""
    expected = 1 if any(line.startswith("error: ") for line in step.output) else 0
    printed = f"{stdout}\n{stderr}"
    if step.background:
        expected = returncode  # a server stopped by SIGINT: its exit code is checked elsewhere
    if returncode != expected:
        return f"{step.where}: $ {step.text}\nexit {returncode}, not {expected}\n{printed}"
    if not shows(untimed(step.output), "\n".join(untimed(printed.splitlines()))):
        shown = "\n".join(step.output)
        return f"{step.where}: $ {step.text}\nthe page shows:\n{shown}\nit printed:\n{printed}"
    return None


def run_steps(
    steps: list[Step],
    workdir: Path,
    env: dict[str, str],
    replace: dict[str, str] | None = None,
    timeout: float = 300,
) -> list[str]:
    """Run `steps` in order in `workdir` (each command's text with `replace`'s keys replaced by
    their values first) and return one message per step that did not do what the page shows;
    the first failing foreground step ends the run."""
    replace = replace or {}

    def rewrite(text: str) -> str:
        for old, new in replace.items():
            text = text.replace(old, new)
        return text

    failures: list[str] = []
    servers: list[tuple[Step, subprocess.Popen]] = []
    try:
        for step in steps:
            if step.skip:
                continue
            output = [rewrite(line) for line in step.output]
            step = Step(step.where, step.kind, rewrite(step.text), output, False, step.background)
            if step.background:
                proc = subprocess.Popen(
                    ["bash", "-c", f"exec {step.text}"], cwd=workdir, env=env, text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                )  # fmt: skip
                servers.append((step, proc))
                continue
            if step.kind == "python":
                script = workdir / "doc_example.py"
                script.write_text(step.text, encoding="utf-8")
                proc = run(f"python {script.name}", workdir, env, timeout)
            else:
                proc = run(step.text, workdir, env, timeout)
            if problem := mismatch(step, proc.returncode, proc.stdout, proc.stderr):
                failures.append(problem)
                break
    finally:
        for step, proc in servers:
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=60)
            if problem := mismatch(step, proc.returncode, stdout, stderr):
                failures.append(problem)
    return failures
