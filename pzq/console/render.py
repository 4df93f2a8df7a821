"""Pages out of templates (Jinja2 with autoescape: every value from pzq or a client is escaped, and a
page carries no inline script), their JSON twins, and who looks at them (``Viewer``)."""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from pzq.console import formats

ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("pzq.console", "templates"),
    autoescape=True,  # (every template: the names of queues and the bodies of messages are a client's)
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters["number"] = formats.number
ENV.filters["size"] = formats.size
ENV.filters["when"] = formats.when
ENV.filters["show"] = formats.show  # (value | show(unit): rounded, in its unit)
ENV.filters["exact"] = formats.exact  # (value | exact(unit): in full, for a title)
ENV.filters["q"] = lambda name: urllib.parse.urlencode({"name": name})
ENV.filters["qs"] = lambda params: urllib.parse.urlencode({k: v for k, v in params.items() if v not in ("", None)})


@dataclasses.dataclass(frozen=True)
class Viewer:
    """Who looks: with ``csrf`` a logged-in operator (the pages offer changes, each form carrying the
    token), else a reader; ``notice`` is what the operator's last change did (shown once)."""

    csrf: str = ""
    can_log_in: bool = False
    notice: str = ""


READER = Viewer()


def page(request: Request, template: str, data: dict, viewer: Viewer = READER, status: int = 200) -> Response:
    """``data`` rendered with ``template`` (HEAD: the same headers, no body: Starlette drops it)."""
    json_path = "/api" + (request.url.path if request.url.path != "/" else "/overview")
    if request.url.query:
        json_path += "?" + request.url.query
    body = ENV.get_template(template).render(data=data, viewer=viewer, json_path=json_path)
    return HTMLResponse(body, status_code=status)


def twin(data: dict, status: int = 200) -> Response:
    """A page's JSON twin: the very data its template renders."""
    return Response(
        json.dumps(data, separators=(",", ":"), default=str), status_code=status, media_type="application/json"
    )


def message(request: Request, title: str, text: str, status: int, viewer: Viewer = READER) -> Response:
    """A page that says one thing (not found, busy, refused) with a way back; JSON for /api paths."""
    data: dict[str, Any] = {"page": "message", "title": title, "text": text, "status": status}
    if request.url.path.startswith("/api/"):
        return twin({"error": text, "status": status}, status)
    return page(request, "message.html", data, viewer, status)
