"""What every route of the console shares (``Console``): the reader of pzq's figures, the logins, the
names it answers to, and who a request comes from (its session, if one of its cookies names one)."""

from __future__ import annotations

import dataclasses

from starlette.requests import Request

from pzq.console import render
from pzq.console.auth import Logins, Session
from pzq.console.reader import Reader

COOKIE = "pzq_session"
MAX_COOKIES = 50  # looked at in one Cookie header


@dataclasses.dataclass
class Console:
    """What the routes share: the reader (pzq's figures), the logins, the names it answers to."""

    reader: Reader
    logins: Logins
    hosts: frozenset[str]

    def session(self, request: Request) -> tuple[str | None, Session | None]:
        """The live session one of the request's session cookies names. Every one is tried: another
        site on this host (cookies ignore ports) may have set a decoy of the same name."""
        for header in request.headers.getlist("cookie"):
            for part in header.split(";")[:MAX_COOKIES]:
                name, _, value = part.strip().partition("=")
                if name == COOKIE and (session := self.logins.session(value)) is not None:
                    return value, session
        return None, None

    def viewer(self, request: Request) -> render.Viewer:
        session = self.session(request)[1]
        if session is None:
            return render.Viewer(can_log_in=self.logins.enabled)
        notice = ""
        if not request.url.path.startswith("/api/"):  # (console.js's fetches must not eat the notice)
            notice, session.notice = session.notice, ""
        return render.Viewer(csrf=session.csrf, notice=notice)
