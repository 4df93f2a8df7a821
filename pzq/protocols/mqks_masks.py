"""MQKS ``rebind --remove-mask``: which events a mask removes (``matches``), and removing them from a
binding's events within a budget of work counted before it is spent (``remove_masked``); pure
functions, read through pzq.protocols.mqks."""

from __future__ import annotations

import bisect

from pzq.errors import ProtocolError


def matches(mask: str, event: str) -> bool:
    """True if ``mask`` removes ``event``: ``*`` stands for any run of characters other than a dot, and
    masks only apply to events that contain a dot. Segment by segment, each in linear-ish time: a
    hostile mask cannot make this slow (a regular expression could backtrack for hours)."""
    if "." not in event:
        return False
    masks, parts = mask.split("."), event.split(".")
    return len(masks) == len(parts) and all(_glob(m, p) for m, p in zip(masks, parts, strict=True))


SORT_PER_UNIT = 4  # events sorted per unit of --remove-mask work
GLOB_CHARS_PER_UNIT = 16  # characters of candidate events globbed per unit (about as long as a split)


def remove_masked(events: list[str], masks: list[str], budget: int = 200_000) -> list[str]:
    """``events`` without those any of ``masks`` removes (``matches``), at a cost counted before it is
    spent and at most ``budget`` (else ProtocolError too-complex: a request must not make the loop work
    for long). Only events with as many segments as some mask are looked at. A mask whose first segment
    is literal finds its candidates by bisecting them sorted (the sort counts one per four events); one whose
    first literal segment comes later, through an index of the positions masks pick (each event split
    counts its segments, each entry one); one of bare ``*`` segments takes them all. Candidates are then
    split and checked at the mask's other literal and ``*``-mixed segments (``_glob`` is linear; globbing
    counts the candidates' characters too). A unit is about 0.4 us on one core."""
    plans: dict[int, list[tuple[tuple[int, str] | None, list[tuple[int, str]], list[tuple[int, str]]]]] = {}
    for mask in masks:
        segments = mask.split(".")
        if len(segments) < 2:  # masks only apply to events with dots
            continue
        literal = [(pos, seg) for pos, seg in enumerate(segments) if "*" not in seg]
        mixed = [(pos, seg) for pos, seg in enumerate(segments) if "*" in seg and seg != "*"]
        plans.setdefault(len(segments), []).append((literal[0] if literal else None, literal[1:], mixed))
    if not plans:
        return events
    work = 0

    def spend(units: int) -> None:
        nonlocal work
        work += units
        if work > budget:
            raise ProtocolError(
                "too-complex",
                "--remove-mask would look at too many event segments in one request; "
                "use masks with literal segments or fewer events",
            )

    of_length: dict[int, list[str]] = {n: [] for n in plans}
    for event in events:
        same = of_length.get(event.count(".") + 1)
        if same is not None:
            same.append(event)
    removed: set[str] = set()
    for n, mask_plans in plans.items():
        same = of_length[n]
        keys = {key[0] for key, _, _ in mask_plans if key is not None}
        ordered: list[str] = []
        if 0 in keys:
            spend(len(same) // SORT_PER_UNIT)  # (sorted in C; a binding's events come sorted already)
            ordered = sorted(same)
        index: dict[tuple[int, str], list[str]] = {}
        positions = keys - {0}
        if positions:
            spend(len(same) * (n + len(positions)))  # before any is split
            for event in same:
                parts = event.split(".")
                for pos in positions:
                    index.setdefault((pos, parts[pos]), []).append(event)
        for key, others, mixed in mask_plans:
            if key is None:
                candidates = same
            elif key[0] == 0:  # events starting with "segment." sort from "segment." to before "segment/"
                low = bisect.bisect_left(ordered, key[1] + ".")
                candidates = ordered[low : bisect.bisect_left(ordered, key[1] + "/", low)]
            else:
                candidates = index.get(key, [])
            if not others and not mixed:
                removed.update(candidates)
                continue
            spend(len(candidates) * (n + len(others) + len(mixed)))
            if mixed:  # a glob reads its segment's characters: long events cost more
                spend(sum(map(len, candidates)) // GLOB_CHARS_PER_UNIT)
            for event in candidates:
                parts = event.split(".")
                if all(parts[pos] == seg for pos, seg in others) and all(_glob(seg, parts[pos]) for pos, seg in mixed):
                    removed.add(event)
    return [e for e in events if e not in removed] if removed else events


def _glob(pattern: str, text: str) -> bool:
    """``*`` matches any run of characters. Each piece between stars is found leftmost by str.find
    after the first piece is matched as a prefix and the last as a suffix: linear, no backtracking
    (leftmost is enough, since a star can take whatever lies between two pieces)."""
    head, *middle = pattern.split("*")
    if not middle:
        return pattern == text
    tail = middle.pop()
    end = len(text) - len(tail)
    if end < len(head) or not text.startswith(head) or not text.endswith(tail):
        return False
    pos = len(head)
    for piece in middle:
        found = text.find(piece, pos, end)
        if found < 0:
            return False
        pos = found + len(piece)
    return True
