"""An optional bearer token for `edgeseq serve` and its Ray deployment.

    key = read_api_key(path, os.environ)     # --api-key-file, else $EDGESEQ_API_KEY, else None
    key.accepts(request.headers.get("authorization"))   # "Bearer <key>" -> True
    refusal(key, path, authorization)        # None, or the 401 to answer instead

Every route but `/health` (load balancers probe it without credentials) answers 401 without
a valid `Authorization: Bearer <key>` header: an empty body and `WWW-Authenticate: Bearer`,
nothing that says whether a key was missing or wrong. `/metrics` is open unless the server is
started with `--metrics-auth` (it holds counts and latencies, no request content, and
Prometheus scrapers usually run without credentials inside the network).

Only the sha256 of the key is kept: a presented token is hashed and the two digests are
compared with `hmac.compare_digest`, so the comparison time depends neither on where the
bytes differ nor on the token's length, and a Ray deployment's arguments (which Ray stores
and shows in its dashboard) hold the digest, not the key.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from starlette.responses import Response

from ..errors import EdgeseqError

ENV_VAR = "EDGESEQ_API_KEY"
MIN_KEY_CHARS = 16
OPEN_PATHS = frozenset({"/health"})  # what answers without a key
METRICS_PATH = "/metrics"
MAKE_KEY = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


class ApiKeyError(EdgeseqError):
    """The API key given to `edgeseq serve` is unreadable, empty or too weak."""


@dataclass(frozen=True)
class ApiKey:
    """A server's key, kept as the hex sha256 of its UTF-8 bytes."""

    sha256: str

    @classmethod
    def of(cls, secret: str) -> ApiKey:
        return cls(hashlib.sha256(secret.encode("utf-8")).hexdigest())

    def accepts(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header value carries this key as a bearer token."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        presented = hashlib.sha256(token.strip().encode("utf-8", "replace")).hexdigest()
        same = hmac.compare_digest(presented.encode(), self.sha256.encode())
        return same and scheme.lower() == "bearer"


def check_secret(secret: str, where: str) -> str:
    """`secret` without surrounding whitespace; ApiKeyError if it is shorter than
    MIN_KEY_CHARS or holds characters a bearer token cannot carry."""
    secret = secret.strip()
    if not secret:
        raise ApiKeyError(f"{where} is empty; put a key in it ({MAKE_KEY})")
    if not all("!" <= c <= "~" for c in secret):
        raise ApiKeyError(
            f"{where} holds spaces or characters outside printable ASCII, which an "
            f"Authorization: Bearer header cannot carry; make a key with {MAKE_KEY}"
        )
    if len(secret) < MIN_KEY_CHARS:
        raise ApiKeyError(
            f"{where} holds a key of {len(secret)} characters; use at least "
            f"{MIN_KEY_CHARS} ({MAKE_KEY})"
        )
    return secret


def read_api_key(path: str | Path | None, environ: Mapping[str, str]) -> ApiKey | None:
    """The key of `--api-key-file PATH` (first line), else of the EDGESEQ_API_KEY variable,
    else None (no authentication). A set but empty variable is an error, not "no key"."""
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ApiKeyError(f"--api-key-file {path} cannot be read: {exc}") from None
        lines = text.splitlines()
        return ApiKey.of(check_secret(lines[0] if lines else "", f"--api-key-file {path}"))
    if ENV_VAR in environ:
        return ApiKey.of(check_secret(environ[ENV_VAR], f"the variable {ENV_VAR}"))
    return None


def api_key_digest(
    digest: str | None, path: str | Path | None, environ: Mapping[str, str]
) -> str | None:
    """The key's sha256 for a Ray deployment: `digest` as given (what `edgeseq serve --ray`
    passes), else that of `path` or EDGESEQ_API_KEY (read_api_key); None for no key."""
    if digest is not None:
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ApiKeyError("api_key_sha256 must be 64 lowercase hex digits (a sha256)")
        return digest
    key = read_api_key(path, environ)
    return key.sha256 if key is not None else None


def unauthorized() -> Response:
    """401, no body, `WWW-Authenticate: Bearer`."""
    return Response(status_code=401, headers={"WWW-Authenticate": "Bearer"})


def refusal(
    key: ApiKey | None, path: str, authorization: str | None, metrics_open: bool = True
) -> Response | None:
    """The 401 to answer for a request to `path`, or None when it may proceed: always
    without a key, on /health, on /metrics while `metrics_open`, or with the key."""
    path = "/" + path.strip("/")
    if key is None or path in OPEN_PATHS or (metrics_open and path == METRICS_PATH):
        return None
    return None if key.accepts(authorization) else unauthorized()


def is_loopback(host: str) -> bool:
    """Whether binding `host` reaches this machine only ("localhost", 127.0.0.0/8, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to a reachable address


def exposure_warning(host: str, key: ApiKey | None) -> str | None:
    """The warning to print once at start when `host` is reachable from other machines and
    no key is set; None otherwise."""
    if key is not None or is_loopback(host):
        return None
    return (
        f"warning: serving on {host} without an API key: anyone who can reach this port can "
        f"run the model; set --api-key-file FILE or {ENV_VAR}, or bind 127.0.0.1"
    )
