"""vLLM's sleep mode over HTTP: a thin typed client of one vLLM server's dev endpoints.

``POST /sleep?level=1|2``, ``POST /wake_up[?tags=weights&tags=kv_cache]``, ``GET /is_sleeping``
exist only when the server runs with ``VLLM_SERVER_DEV_MODE=1`` and ``--enable-sleep-mode``.
Warm lending (docs/warm-lending.md) puts a lent node's replica to sleep and wakes it at the
reclaim; a wrong answer must never be read as "asleep" or "awake", so every answer that is not
exactly vLLM's raises an AdapterError saying what came back (callers fail closed: a wake that
fails means a cold start). No retries here: sleep and wake are not idempotent in time (a wake
takes seconds), the caller's lifecycle decides.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from typing import Any

import requests

from bridge import logs
from bridge.config import PoolConfig
from bridge.errors import AdapterError

from .protocols import SleepControl

log = logs.get(__name__)

SYSTEM = "vllm"
LEVELS = (1, 2)  # 1: weights to host memory, KV cache discarded; 2: both discarded
TAGS = ("weights", "kv_cache")
BODY_CAP = 200  # characters of an error body kept in a message
READ_CAP = 65536  # bytes of an answer read at most


class SleepModeUnavailable(AdapterError):
    """The server has no sleep endpoints (vLLM's 404 for an unregistered route): not started with VLLM_SERVER_DEV_MODE=1 and
    --enable-sleep-mode, or the URL is not a vLLM server. Warm lending cannot use it."""


class VllmSleepClient:
    """SleepControl for the vLLM server at ``base_url`` (e.g. ``http://10.0.0.7:8000``).
    ``timeout_s`` bounds each call: /sleep and /wake_up return only once the copy is done
    (seconds from host memory, about a minute for level 2, which reloads the weights)."""

    def __init__(self, base_url: str, *, timeout_s: float = 120.0, session: requests.Session | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url: expected http(s)://host:port, got {base_url!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: expected > 0, got {timeout_s!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._session = session if session is not None else requests.Session()

    def sleep(self, level: int = 1) -> None:
        if level not in LEVELS:
            raise ValueError(f"level: expected 1 or 2, got {level!r}")
        self._call("POST", "sleep", {"level": str(level)})
        log.info("vllm_sleep_mode", step="sleep", reason=f"level {level}", url=self.base_url)

    def wake_up(self, tags: Collection[str] = ()) -> None:
        unknown = set(tags) - set(TAGS)
        if unknown:
            raise ValueError(f"tags: unknown {', '.join(sorted(unknown))}; expected {', '.join(TAGS)}")
        self._call("POST", "wake_up", {"tags": list(tags)} if tags else None)
        log.info("vllm_sleep_mode", step="wake_up", reason=f"tags {','.join(tags) or 'all'}", url=self.base_url)

    def is_sleeping(self) -> bool:
        text = self._call("GET", "is_sleeping", None)
        try:
            doc: Any = json.loads(text)
        except ValueError:
            raise AdapterError(SYSTEM, f"GET {self.base_url}/is_sleeping: expected JSON, got {_cap(text)!r}") from None
        value = doc.get("is_sleeping") if isinstance(doc, dict) else None
        if not isinstance(value, bool):
            raise AdapterError(SYSTEM, f"GET {self.base_url}/is_sleeping: expected {{\"is_sleeping\": true|false}}, "
                                       f"got {_cap(text)!r}")
        return value

    def _call(self, method: str, path: str, params: dict[str, Any] | None) -> str:
        """The answer's body (at most ``READ_CAP`` bytes read: an answer is a few bytes of JSON,
        a server sending more is not read into memory)."""
        url = f"{self.base_url}/{path}"
        try:
            with self._session.request(method, url, params=params, timeout=self.timeout_s, stream=True,
                                       allow_redirects=False) as resp:
                status, raw = resp.status_code, resp.raw.read(READ_CAP + 1, decode_content=True)
        except requests.RequestException as exc:
            raise AdapterError(SYSTEM, f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        text = raw[:READ_CAP].decode("utf-8", "replace") + ("..." if len(raw) > READ_CAP else "")
        if status == 404 and _route_missing(text):
            raise SleepModeUnavailable(SYSTEM, f"{method} {url}: 404: no sleep mode here (vLLM needs "
                                               "VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode)")
        if status != 200:
            raise AdapterError(SYSTEM, f"{method} {url}: HTTP {status}: {_cap(text)}")
        return text


def _route_missing(text: str) -> bool:
    """vLLM's (FastAPI's) answer for a route it did not register: ``{"detail": "Not Found"}``.
    Any other 404 (a proxy's, an unknown replica's) is reported with its body."""
    try:
        return bool(json.loads(text) == {"detail": "Not Found"})
    except ValueError:
        return False


def _cap(text: str) -> str:
    return text if len(text) <= BODY_CAP else text[:BODY_CAP] + "..."


SleepControlFor = Callable[[str, "str | None"], SleepControl]  # (pool, pod IP) -> the pod's sleep control


def sleep_controls(pools: Sequence[PoolConfig]) -> SleepControlFor:
    """A client per call for the pods of warm pools (``pools[].warm_lending``) only: asked for
    another pool's pod, or one without an IP, it raises AdapterError (the lifecycle falls back cold)."""
    warm = {p.name: p for p in pools if p.warm_lending}

    def control(pool: str, ip: str | None) -> SleepControl:
        cfg = warm.get(pool)
        if cfg is None:
            raise AdapterError(SYSTEM, f"pool {pool}: warm_lending is off: no sleep control")
        if not ip:
            raise AdapterError(SYSTEM, f"pool {pool}: the pod has no IP yet: no sleep control")
        host = f"[{ip}]" if ":" in ip else ip
        return VllmSleepClient(f"http://{host}:{cfg.vllm_port}", timeout_s=cfg.wake_s)

    return control
