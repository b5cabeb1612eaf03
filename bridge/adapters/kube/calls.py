"""API-call accounting and error wrapping for the Kubernetes adapter.

Every request goes through ``ApiCalls.run``: it counts the call per (verb, resource), so the
daemon can export the counts and a benchmark can show calls per tick follow changes, not
nodes; and it turns the client's exceptions into ``KubeApiError`` with a capped, redacted body
(the client's own ``str()`` of an exception dumps headers; we never log those).
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from bridge.errors import AdapterError

BODY_CAP = 300
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


_SECRETS: set[str] = set()
_SECRETS_LOCK = threading.Lock()


def register_secret(value: str | None) -> None:
    """A credential in use (the bearer token): blanked out of every error text, wherever it
    appears (an error body may echo it without the "Bearer" word)."""
    if value and len(value) >= 8:
        with _SECRETS_LOCK:
            _SECRETS.add(value)


def sanitize(text: str, cap: int = BODY_CAP) -> str:
    """Cap, strip control characters, and redact our credentials and anything that looks
    like a bearer token."""
    with _SECRETS_LOCK:
        secrets = tuple(_SECRETS)
    for secret in secrets:
        text = text.replace(secret, "<redacted>")
    text = _BEARER.sub(r"\1<redacted>", text)
    text = _CONTROL.sub(" ", text)
    return text if len(text) <= cap else text[:cap] + "...(capped)"


class KubeApiError(AdapterError):
    """A Kubernetes request failed. ``status`` is the HTTP status, or None when no answer came."""

    def __init__(self, verb: str, resource: str, name: str, status: int | None, detail: str) -> None:
        self.verb = verb
        self.resource = resource
        self.name = name
        self.status = status
        where = f"{verb} {resource}" + (f" {name}" if name else "")
        code = f"HTTP {status}" if status is not None else "no response"
        super().__init__("kubernetes", f"{where}: {code}: {sanitize(detail)}")


class KubeConflictError(KubeApiError):
    """Optimistic concurrency lost every retry: someone else kept changing the object."""


def _status_message(body: str | None) -> str:
    if not body:
        return ""
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    if isinstance(doc, Mapping):
        return str(doc.get("message") or doc.get("reason") or body)
    return body


class ApiCalls:
    """Thread-safe counters of API requests per (verb, resource), and of failures per status."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: Counter[tuple[str, str]] = Counter()
        self._errors: Counter[tuple[str, str, str]] = Counter()

    def count(self, verb: str, resource: str) -> None:
        with self._lock:
            self._calls[(verb, resource)] += 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        """(verb, resource) -> requests made so far, e.g. ("patch", "nodes") -> 3."""
        with self._lock:
            return dict(self._calls)

    def errors(self) -> dict[tuple[str, str, str], int]:
        """(verb, resource, status) -> failed requests; status "none" = no answer."""
        with self._lock:
            return dict(self._errors)

    def total(self) -> int:
        with self._lock:
            return sum(self._calls.values())

    def run(self, verb: str, resource: str, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` counting it; client exceptions become KubeApiError."""
        self.count(verb, resource)
        try:
            return fn(*args, **kwargs)
        except ApiException as e:
            status = int(e.status) if e.status is not None else None
            self._fail(verb, resource, str(status))
            raise KubeApiError(verb, resource, name, status, f"{e.reason or ''} {_status_message(e.body)}".strip()) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            self._fail(verb, resource, "none")
            raise KubeApiError(verb, resource, name, None, type(e).__name__ + ": " + str(e)) from None

    def _fail(self, verb: str, resource: str, status: str) -> None:
        with self._lock:
            self._errors[(verb, resource, status)] += 1


def send_json(api_client: Any, method: str, path: str, body: Mapping[str, Any], *, _preload_content: bool = False,
              _request_timeout: float | None = None) -> Any:
    """A write whose JSON body goes out exactly as built; returns the raw response (for
    ``read_json``), raises ``ApiException`` on a non-2xx answer like the generated methods.

    Why: the generated client (37.x) coerces a dict body into its model and serializes time
    fields back with ``datetime.isoformat()``, which drops a zero microsecond; a MicroTime (a
    Lease's renewTime or acquireTime) of exactly ``.000000`` then goes out as ``...:50+00:00``
    and a real apiserver answers 400 ("cannot parse ... as .000000"). Found on the real
    control plane; the project's emulator accepted it."""
    del _preload_content  # always raw: the caller decodes with read_json
    m, url, headers, data, post = api_client.param_serialize(
        method, path, header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=dict(body), auth_settings=["BearerToken"])
    resp = api_client.call_api(m, url, headers, data, post, _request_timeout=_request_timeout)
    if not 200 <= int(resp.status) <= 299:
        raw = resp.read()
        raise ApiException(status=resp.status, reason=resp.reason,
                           body=raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw)
    return resp.response


def read_json(resp: Any) -> Any:
    """The body of a raw (``_preload_content=False``) response, decoded; the connection
    released. A body that is not a JSON object is an AdapterError, like any bad answer."""
    try:
        doc = json.loads(resp.data)
    except (ValueError, TypeError) as e:
        raise AdapterError("kubernetes", f"response is not JSON: {sanitize(str(e))}") from None
    finally:
        resp.release_conn()
    if not isinstance(doc, dict):
        raise AdapterError("kubernetes", f"response is not a JSON object but {type(doc).__name__}")
    return doc
