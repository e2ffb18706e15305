"""``/dashboard``: the operators' view in a browser, served by every API process.

An admin token opens it: the login form trades the token for a cookie (HttpOnly, SameSite=Strict,
scoped to ``/dashboard``) that only these read-only routes accept; no other route reads cookies, so
the cookie can never create, delete or drain anything. The cookie is an expiry signed with a key
derived from the admin token, so every replica started with the same token accepts it. A sign-in link
(``corral dashboard``, ``POST /dashboard/link`` with an admin token) carries a short-lived expiry
signed for that purpose alone; opening it sets the cookie, so a browser with no way to type a token
(or a headless one) gets in. A tool reads ``/dashboard/data.json`` with the admin token in its
Authorization header, no cookie needed. Every asset
ships in the package (uPlot is vendored): the page works with no network beyond this server.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from functools import cache
from importlib import resources
from urllib.parse import parse_qs

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse

from corral.api.auth import Plane, _bearer
from corral.api.errors import error_response
from corral.codes import ErrorCode
from corral.control.fleetview import collect
from corral.store import Role

router = APIRouter(include_in_schema=False)

COOKIE = "corral_dashboard"
SESSION_S = 12 * 3600
LINK_S = 300  # a sign-in link opens the dashboard for this long after it was made
_SESSION, _LINK = "dashboard", "dashboard-link"
MAX_FORM_BYTES = 4096
ASSETS = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "uPlot.LICENSE": "text/plain",
}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
    "form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@cache
def _asset(name: str) -> bytes:
    return resources.files("corral.api").joinpath("static", name).read_bytes()


def session_key(admin_token: str | None) -> bytes:
    """The cookie-signing key: derived from the admin token (shared by replicas), or random when this
    process was not given one (its cookies then open only its own dashboard)."""
    if admin_token is None:
        return os.urandom(32)
    return hashlib.sha256(b"corral-dashboard-session\0" + admin_token.encode()).digest()


def _sign(key: bytes, expires: int, purpose: str = _SESSION) -> str:
    """An expiry signed for one purpose: a session's cookie, or a sign-in link (neither is the other)."""
    mac = hmac.new(key, f"{purpose}:{expires}".encode(), hashlib.sha256).hexdigest()
    return f"{expires}.{mac}"


def _valid(key: bytes, value: str | None, now: float, purpose: str = _SESSION) -> bool:
    if not value or len(value) > 128:
        return False
    expires, _, _mac = value.partition(".")
    if not expires.isdigit() or int(expires) < now:
        return False
    return hmac.compare_digest(_sign(key, int(expires), purpose), value)


async def _authorized(request: Request, plane: Plane) -> bool:
    if _valid(request.app.state.dashboard_key, request.cookies.get(COOKIE), time.time()):
        return True
    token = _bearer(request)
    if token is None:
        return False
    p = await plane.store.resolve_token(token)
    return p is not None and p.role is Role.ADMIN


def _page(name: str, status: int = 200, message: str = "") -> Response:
    body = _asset(name).replace(b"{{message}}", message.encode())
    return Response(body, status_code=status, media_type="text/html; charset=utf-8", headers=_HEADERS)


@router.get("/dashboard")
async def dashboard(request: Request, plane: Plane) -> Response:
    if await _authorized(request, plane):
        return _page("dashboard.html")
    return _page("login.html")


@router.post("/dashboard/login")
async def login(request: Request, plane: Plane) -> Response:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return _page("login.html", 413, "That is not a token.")
    try:
        form = parse_qs(body.decode("utf-8"), max_num_fields=4)
    except (UnicodeDecodeError, ValueError):
        form = {}
    token = (form.get("token") or [""])[0].strip()
    p = await plane.store.resolve_token(token) if token else None
    if p is None or p.role is not Role.ADMIN:
        return _page("login.html", 401, "An admin token is needed.")
    return _signed_in(request)


def _signed_in(request: Request) -> Response:
    """To the dashboard, with a session's cookie."""
    response = RedirectResponse("/dashboard", status_code=303, headers=_HEADERS)
    expires = int(time.time()) + SESSION_S
    response.set_cookie(
        COOKIE,
        _sign(request.app.state.dashboard_key, expires),
        max_age=SESSION_S,
        path="/dashboard",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/dashboard/link")
async def link(request: Request, plane: Plane) -> Response:
    """A sign-in link, for an admin token in the Authorization header (never for a cookie)."""
    token = _bearer(request)
    p = await plane.store.resolve_token(token) if token else None
    if p is None or p.role is not Role.ADMIN:
        return error_response(401, ErrorCode.UNAUTHORIZED, "a sign-in link needs an admin token")
    expires = int(time.time()) + LINK_S
    signed = _sign(request.app.state.dashboard_key, expires, _LINK)
    url = str(request.base_url).rstrip("/") + f"/dashboard/open?link={signed}"
    return JSONResponse({"url": url, "expires_in_s": LINK_S}, headers={"Cache-Control": "no-store"})


@router.get("/dashboard/open")
async def open_link(request: Request, link: str = "") -> Response:
    if not _valid(request.app.state.dashboard_key, link, time.time(), _LINK):
        return _page("login.html", 401, "That sign-in link is not valid (or is over five minutes old).")
    return _signed_in(request)


@router.post("/dashboard/logout")
async def logout() -> Response:
    response = RedirectResponse("/dashboard", status_code=303, headers=_HEADERS)
    response.delete_cookie(COOKIE, path="/dashboard")
    return response


@router.get("/dashboard/data.json")
async def data(request: Request, plane: Plane) -> Response:
    if not await _authorized(request, plane):
        return error_response(401, ErrorCode.UNAUTHORIZED, "an admin token or the dashboard cookie is needed")
    return JSONResponse(await collect(plane), headers={"Cache-Control": "no-store"})


@router.get("/dashboard/assets/{name}")
async def asset(name: str) -> Response:
    media = ASSETS.get(name)
    if media is None:
        return Response(status_code=404)
    return Response(
        _asset(name),
        media_type=media,
        headers={
            "Cache-Control": "max-age=3600",
            **{k: v for k, v in _HEADERS.items() if k != "Cache-Control"},
        },
    )
