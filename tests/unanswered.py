"""A barrier for floods of requests whose client reads none of its replies: the server leaves some of them
unanswered (``Replies.refuses``: the client is to resend them), so a test cannot wait for one answer each.
Counting them as the server goes, a test waits until every request sent was carried out, refused, or left
unanswered, then reads exactly the answers due, instead of waiting seconds for "nothing more came"."""

from __future__ import annotations


def counting_unanswered(endpoint) -> list[bytes]:
    """The routing ids of the requests ``endpoint`` (a started server's, with ``replies``) leaves unanswered
    from now on, appended by the server's loop as it refuses them."""
    refuses, unanswered = endpoint.replies.refuses, []

    def counted(peer: bytes, what: str) -> bool:
        refused = refuses(peer, what)
        if refused:
            unanswered.append(peer)
        return refused

    endpoint.replies.refuses = counted
    return unanswered
