"""The web view's routes: each page beside its JSON endpoint (``/pool`` and ``/api/pool`` ...),
from ``WebSource`` (reads) and ``pages`` (pure documents). Read-only: GET only, no form
posts, no cookies; bad input gets a 4xx page (or JSON) naming the field and the problem."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from bridge import logs
from bridge.config import Config
from bridge.errors import AdapterError
from bridge.web import pages, svg
from bridge.web.pages import BadInput
from bridge.web.source import WebSource

log = logs.get(__name__)
HERE = Path(__file__).parent
MAX_DAYS = 90.0
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?|\.[0-9]+")
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), 127)}  # shown, not sent: a NUL or ESC from the client's path


def _once(got: list[str], name: str) -> str | None:
    """The one value of a query parameter or header; given more than once it is refused (which
    one would be meant?)."""
    if len(got) > 1:
        raise BadInput(400, f"{name}: given {len(got)} times, expected once")
    return got[0] if got else None


def _param(request: Request, name: str) -> str | None:
    return _once(request.query_params.getlist(name), name)


def _pool_param(request: Request, config: Config) -> str:
    raw = _param(request, "pool")
    names = [p.name for p in config.pools]
    if raw is None or raw == "":
        return names[0]
    if raw not in names:
        raise BadInput(404, f"pool: no pool named {raw[:40]!r} (pools: {', '.join(names)})")
    return raw


def _days_param(request: Request, default: float) -> float:
    raw = _param(request, "days")
    if raw is None or raw == "":
        return default
    if not _DECIMAL.fullmatch(raw):  # not float()'s wider grammar: "1_0", " 7", "1e3", "nan"
        raise BadInput(400, f"days: expected a number of days such as 7 or 0.5, got {raw[:40]!r}")
    days = float(raw)
    if not 0 < days <= MAX_DAYS:
        raise BadInput(400, f"days: must be > 0 and <= {MAX_DAYS:g}, got {raw[:40]!r}")
    return days


def _base(request: Request) -> str:
    """The view's public prefix (``web.root_path``) for links and redirects: inside the /static
    mount the scope's ``root_path`` ends in ``/static`` (its error pages linked /static/pool)."""
    return str(request.scope.get("app_root_path", request.scope.get("root_path", "")))


def _is_api(request: Request) -> bool:
    """A request under /api/ below the root path (uvicorn puts ``root_path`` in front of the
    path: /gpu-bridge/api/nope got an HTML 404)."""
    path: str = request.scope["path"]
    base = _base(request)
    if base and path.startswith(base + "/"):
        path = path[len(base):]
    return path.startswith("/api/")


def build_app(source: WebSource) -> Starlette:
    """The ASGI application over ``source``."""
    config = source.config
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals["pools"] = [p.name for p in config.pools]

    def user_of(request: Request) -> str | None:
        header = config.web.user_header
        if header is None:
            return None
        # twice: the client's own before the proxy's, if the proxy appends
        return pages.check_user(_once(request.headers.getlist(header), header), header)

    def render(request: Request, page: str, doc: dict[str, Any], **extra: Any) -> Response:
        return templates.TemplateResponse(request, page, {"doc": doc, "base": _base(request), **extra})

    def endpoint(build: Callable[[Request], tuple[str, dict[str, Any], dict[str, Any]]], *, as_json: bool) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            try:
                page, doc, extra = await run_in_threadpool(build, request)
            except BadInput as exc:
                return error(request, exc.status, exc.message, as_json=as_json)
            except AdapterError as exc:  # the details (addresses, the client's own text) stay in the log
                log.warning("web_read_failed", path=request.url.path, error=str(exc))
                return error(request, 503, f"cannot read {exc.system} now (the web view's log has the details)",
                             as_json=as_json)
            if as_json:
                return JSONResponse(doc)
            return render(request, page, doc, **extra)

        return handle

    def error(request: Request, status: int, message: str, *, as_json: bool) -> Response:
        if as_json:
            return JSONResponse({"error": message, "status": status}, status_code=status)
        return templates.TemplateResponse(
            request, "error.html", {"status": status, "message": message, "base": _base(request), "doc": {}},
            status_code=status
        )

    # --- the documents ---------------------------------------------------------------------

    def pool_page(request: Request) -> tuple[str, dict[str, Any], dict[str, Any]]:
        user = user_of(request)
        mine = [j.job_id for j in source.jobs() if j.user == user] if user is not None else []
        return "pool.html", pages.pool_doc(source.pool_rows(), now=source.now(), user=user, user_jobs=mine), {}

    def outlook_page(request: Request) -> tuple[str, dict[str, Any], dict[str, Any]]:
        user_of(request)
        pool = _pool_param(request, config)
        got = source.outlook(pool)
        if got is None:
            doc: dict[str, Any] = {"pool": pool, "hours": [], "available": False,
                                   "calibration": "no usable load history in Prometheus yet: nothing to forecast from"}
            return "outlook.html", doc, {"chart": None, "rows": []}
        from bridge.cli.forecast import outlook_doc

        doc = outlook_doc(got) | {"available": True, "now_text": pages.iso(got.now)}
        rows = pages.outlook_chart_rows(got.hours)
        chart = svg.outlook_chart([r["label"] for r in rows], [r["lendable"] for r in rows], [r["demand"] for r in rows],
                                  nodes=got.nodes)
        return "outlook.html", doc, {"chart": chart, "rows": rows}

    def jobs_page(request: Request) -> tuple[str, dict[str, Any], dict[str, Any]]:
        user = user_of(request)
        return "jobs.html", pages.jobs_doc(source.jobs(), source.preemptions(), now=source.now(), user=user), {}

    def job_page(request: Request) -> tuple[str, dict[str, Any], dict[str, Any]]:
        user = user_of(request)
        job_id = pages.check_job_id(request.path_params["job_id"])
        job = next((j for j in source.jobs() if j.job_id == job_id), None)
        if user is not None and job is not None and job.user != user:
            job = None  # another user's job: as if it did not exist
        preempted = source.preemptions() if user is None or job is not None else ()
        outlook = None
        if job is not None and job.state == "pending":
            try:  # the job's facts do not wait for Prometheus: without it, no forecast is shown
                got = source.outlook(config.pools[0].name)
                outlook = got.hours if got is not None else None
            except AdapterError as exc:
                log.warning("web_outlook_unavailable", job=job_id, error=str(exc))
        doc = pages.job_doc(job_id, job, preempted, now=source.now(), grace_s=config.slurm.grace_s, outlook=outlook)
        return "job.html", doc, {}

    def history_page(request: Request) -> tuple[str, dict[str, Any], dict[str, Any]]:
        user_of(request)
        pool = _pool_param(request, config)
        days = _days_param(request, config.web.history_days)
        hist = source.history(pool, days)
        doc = pages.history_doc(pool, hist, days=days, now=source.now())
        nodes = sum(1 for r in source.pool_rows() if r["pool"] == pool)
        chart = None
        if doc["steps"]:
            st = doc["steps"]
            chart = svg.history_chart([r["t"] for r in st], [r["lent"] for r in st], [r["lends"] for r in st],
                                      [r["reclaims"] for r in st], nodes=nodes)
        return "history.html", doc, {"chart": chart}

    async def job_lookup(request: Request) -> Response:
        """The job form (GET ?id=): a redirect to the job's page, or a 400 page."""
        try:
            job_id = pages.check_job_id((_param(request, "id") or "").strip())
        except BadInput as exc:
            return error(request, exc.status, exc.message, as_json=False)
        return RedirectResponse(f"{_base(request)}/job/{job_id}", status_code=303)

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{_base(request)}/pool", status_code=307)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
        as_json = _is_api(request)
        path = request.url.path.translate(_CONTROL)
        hint = f" (did you mean {path.rstrip('/')[:80]}?)" if status == 404 and len(path) > 1 and path.endswith("/") else ""
        msg = f"no page at {path[:80]}{hint}" if status == 404 else str(detail)
        response = error(request, status, msg, as_json=as_json)
        if isinstance(exc, HTTPException) and exc.headers:  # a 405's Allow
            response.headers.update(exc.headers)
        return response

    async def internal_error(request: Request, exc: Exception) -> Response:
        """Any other exception: logged with its traceback; the client gets a 500 page (JSON under
        /api/) with no detail, and the same headers as every other answer: Starlette answers
        this one outside the middleware (a bare text/plain 500 without CSP or nosniff before)."""
        log.error("web_internal_error", path=request.url.path, error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        try:
            response = error(request, 500, "internal error (the web view's log has the details)",
                             as_json=_is_api(request))
        except Exception:  # noqa: BLE001 - the error page itself failed: plain text
            response = PlainTextResponse("500: internal error", status_code=500)
        _secure(response)
        return response

    routes: list[BaseRoute] = [Route("/", home)]
    for path, build in (("/pool", pool_page), ("/outlook", outlook_page), ("/jobs", jobs_page),
                        ("/job/{job_id}", job_page), ("/history", history_page)):
        routes.append(Route(path, endpoint(build, as_json=False)))
        routes.append(Route("/api" + path, endpoint(build, as_json=True)))
    routes.append(Route("/job", job_lookup))
    routes.append(Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"))
    app = Starlette(
        routes=routes,
        exception_handlers={404: not_found, 405: not_found, Exception: internal_error},
        middleware=[Middleware(BaseHTTPMiddleware, dispatch=_headers)],
    )
    # no redirect of /pool/ to /pool: Starlette builds it from the request's Host header, which a
    # client chooses (a redirect to any host); a 404 that names the page instead
    app.router.redirect_slashes = False
    return app


async def _headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Every answer: no framing by other sites, no scripts at all, nothing fetched elsewhere;
    the time it took, for the 300 ms target (Server-Timing)."""
    t0 = time.perf_counter()
    response = await call_next(request)
    _secure(response)
    response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - t0) * 1000:.1f}"
    return response


SECURITY_HEADERS = {
    # no script may run (the pages have none), no <base> may move relative links elsewhere,
    # styles only from the view's own stylesheet (no inline style in the templates or charts)
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'self'; base-uri 'none'",
    "X-Frame-Options": "SAMEORIGIN",  # frame-ancestors for browsers without CSP level 2
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _secure(response: Response) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
