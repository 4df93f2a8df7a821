"""Logging of bad input, limited so that a flood of garbage cannot flood the log."""
from __future__ import annotations

import collections
import logging

log = logging.getLogger("pzq.input")
_counts: collections.Counter = collections.Counter()


def warn_bad(peer: str, code: str, detail: str) -> None:
    """Log bad input from ``peer``: the first 10 of each kind, then every 1000th, with a running count."""
    _counts[peer, code] += 1
    n = _counts[peer, code]
    if n <= 10 or n % 1000 == 0:
        log.warning("bad %s input (%s, #%d): %s", peer, code, n, detail)
