"""`/dashboard`: one page for the people who run the engine, drawn in the browser from what
`/metrics` says (`dashboard.js` polls it and draws the figures `figures.js` computes: the
server's, and each model's where several are served; every URL it uses is relative, so the page
works under a reverse proxy's path prefix).

The page is keyed like every route. A browser cannot send `Authorization` when it navigates, so
one without the key gets `login.html` (401): it asks for the key, keeps it in the tab's
`sessionStorage` and fetches the page with the key as a Bearer header. The key is never in an
address, so never in an access log, a history or a `Referer`. Scripts and the style sheet are
written into the pages they belong to: one answer each, allowed by hash in the
Content-Security-Policy.
"""

import base64
import functools
import hashlib
import re
from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from api.service import Service

LINKED = re.compile(r'<script src="([\w.]+)"></script>|<link rel="stylesheet" href="([\w.]+)">')
INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)


async def page(service: Service, request: Request) -> Response:
    """The dashboard (its figures come from `metrics`, fetched by its script)."""
    dashboard, _, policy = _pages()
    return _html(dashboard, 200, policy)


def key_form(request: Request) -> Response | None:
    """A browser's 401 without the key: the page asking for it; None for other clients."""
    if "text/html" not in request.headers.get("accept", ""):
        return None
    _, login, policy = _pages()
    return _html(login, 401, policy, {"WWW-Authenticate": "Bearer"})


def _html(body: str, status: int, policy: str, headers: dict[str, str] | None = None) -> Response:
    headers = {
        "Content-Security-Policy": policy,
        "Cache-Control": "no-store",
        "Referrer-Policy": "no-referrer",
        "X-Content-Type-Options": "nosniff",
        **(headers or {}),
    }
    return HTMLResponse(body, status, headers)


@functools.cache
def _pages() -> tuple[str, str, str]:
    """The dashboard and the key form, self-contained, and the policy allowing both (the form
    writes the dashboard into its own document, which keeps the form's policy)."""
    pages = _inline("index.html"), _inline("login.html")
    hashes: dict[str, dict[str, None]] = {"script": {}, "style": {}}  # ordered sets
    for kind, text in (m.groups() for p in pages for m in INLINE.finditer(p)):
        digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
        hashes[kind][f"'sha256-{digest}'"] = None
    policy = (
        f"default-src 'none'; script-src {' '.join(hashes['script'])}; "
        f"style-src {' '.join(hashes['style'])}; connect-src 'self'; img-src data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return *pages, policy


def _inline(name: str) -> str:
    """The page `name` with the scripts and style sheet it links written into it."""
    files = resources.files(__name__)

    def put(match: re.Match) -> str:
        script, style = match.groups()
        text = (files / (script or style)).read_text(encoding="utf-8")
        assert "</" not in text, f"{script or style} would end its element early"
        return f"<script>{text}</script>" if script else f"<style>{text}</style>"

    return LINKED.sub(put, (files / name).read_text(encoding="utf-8"))
