"""The Ray application's ingress (runtime/serve/ray_app.py) without a cluster: what it answers
when the model replica answers, is too slow, is full, or dies with the request. Marked `ray`
(it needs the ray package, not a cluster: a second or two); skipped when ray is not installed.
tests/test_serve_ray_faults.py kills a real replica."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytestmark = pytest.mark.ray
pytest.importorskip("ray.serve", reason="the ray extra is not installed (make test-ray)")
pytest.importorskip("starlette", reason="the serve extra is not installed")

from ray.exceptions import ActorDiedError, ActorUnavailableError  # noqa: E402
from ray.serve.exceptions import BackPressureError  # noqa: E402
from starlette.requests import Request  # noqa: E402

from edgeseq.runtime.serve.auth import ApiKey  # noqa: E402
from edgeseq.runtime.serve.ray_app import ARGS, EdgeseqIngress, build  # noqa: E402

KEY = "ingress-t3st-k3y-0123"
BEARER = [(b"authorization", f"Bearer {KEY}".encode())]


class FakeResponse:
    """What `handle.answer.remote(...)` returns: awaitable, cancellable."""

    def __init__(self, outcome: Any, delay_s: float) -> None:
        self.outcome, self.delay_s, self.cancelled = outcome, delay_s, False

    def __await__(self):
        return self._wait().__await__()

    async def _wait(self) -> Any:
        await asyncio.sleep(self.delay_s)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def cancel(self) -> None:
        self.cancelled = True


class FakeModel:
    """A DeploymentHandle to the model deployment, answering every call with `outcome`."""

    def __init__(self, outcome: Any, delay_s: float = 0.0) -> None:
        self.outcome, self.delay_s = outcome, delay_s
        self.calls: list[tuple[str, bytes]] = []
        self.responses: list[FakeResponse] = []
        self.answer = self  # handle.answer.remote(...)

    def remote(self, route: str, body: bytes) -> FakeResponse:
        self.calls.append((route, body))
        self.responses.append(FakeResponse(self.outcome, self.delay_s))
        return self.responses[-1]


def ask(model: FakeModel, method: str, path: str, headers=(), body=b"", timeout_s=5.0):
    """(status, headers, body) of the ingress's answer to one request."""
    ingress = EdgeseqIngress.func_or_class(model, timeout_s, ApiKey.of(KEY).sha256)
    scope = {"type": "http", "method": method, "path": path, "query_string": b"",
             "headers": list(headers), "root_path": ""}  # fmt: skip

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    response = asyncio.run(ingress(Request(scope, receive)))
    return response.status_code, dict(response.headers), response.body


def test_the_replica_answer_passes_through() -> None:
    model = FakeModel((200, {"results": []}))
    status, _, body = ask(model, "POST", "/v1/generate", BEARER, b'{"inputs": []}')
    assert (status, json.loads(body)) == (200, {"results": []})
    assert model.calls == [("/v1/generate", b'{"inputs": []}')]
    model = FakeModel((422, {"error": "bad"}))
    assert ask(model, "POST", "/prefix/v1/generate/", BEARER)[0] == 422
    assert model.calls == [("/v1/generate", b"")]


def test_the_key_is_checked_before_the_model_is_asked() -> None:
    model = FakeModel((200, {"status": "ready"}))
    for method, path in (("POST", "/v1/generate"), ("GET", "/v1/model"), ("GET", "/x")):
        status, headers, body = ask(model, method, path, [(b"authorization", b"Bearer no")])
        assert (status, body, headers["www-authenticate"]) == (401, b"", "Bearer")
    assert model.calls == []
    assert ask(model, "GET", "/health")[0] == 200  # open
    status, _, body = ask(model, "GET", "/x", BEARER)
    assert status == 404 and model.calls == [("/health", b"")]


@pytest.mark.parametrize(
    "died",
    [ActorDiedError(), ActorUnavailableError("gone", b"\x01" * 16)],
    ids=["died", "unavailable"],
)
def test_a_replica_lost_with_the_request_is_a_503_with_retry_after(died) -> None:
    status, headers, body = ask(FakeModel(died), "POST", "/v1/generate", BEARER)
    assert status == 503 and headers["retry-after"] == "1"
    assert "retry" in json.loads(body)["error"]


def test_a_fault_in_the_replica_is_a_json_500_without_retry_after() -> None:
    status, headers, body = ask(FakeModel(ValueError("boom")), "POST", "/v1/generate", BEARER)
    assert status == 500 and "retry-after" not in headers
    assert json.loads(body) == {"error": "the replica failed: ValueError"}


def test_a_full_queue_is_a_429_with_retry_after() -> None:
    full = BackPressureError(num_queued_requests=8, max_queued_requests=8)
    status, headers, _ = ask(FakeModel(full), "POST", "/v1/generate", BEARER)
    assert status == 429 and headers["retry-after"] == "1"


def test_past_the_timeout_a_504_and_the_request_is_cancelled() -> None:
    model = FakeModel((200, {"results": []}), delay_s=5)
    status, _, body = ask(model, "POST", "/v1/generate", BEARER, timeout_s=0.2)
    assert status == 504 and "within 0.2 s" in json.loads(body)["error"]
    assert model.responses[0].cancelled


def test_build_makes_an_ingress_in_front_of_the_replicas() -> None:
    app = build({"bundle": "/srv/b", "replicas": "2", "max_replicas": "4", "timeout_s": "7",
                 "max_queue": "16", "max_batch": "8"})  # fmt: skip
    ingress = app._bound_deployment
    assert ingress.name == "EdgeseqIngress" and ingress.num_replicas == 2
    assert ingress.ray_actor_options["num_cpus"] == 0  # takes no core from the replicas
    assert ingress.max_queued_requests == 16
    [model] = ingress.init_args
    assert model._bound_deployment.name == "EdgeseqDeployment"
    assert model._bound_deployment._deployment_config.autoscaling_config.max_replicas == 4
    assert model._bound_deployment.max_ongoing_requests == 16  # 2 x max_batch
    assert ingress.init_kwargs == {"timeout_s": 7.0, "api_key_sha256": None}
    assert "timeout_s" in ARGS
