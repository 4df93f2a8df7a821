"""The broker is composed, not stacked: no class of pzq/broker/ inherits from another of ours, and each
verb core.py's table lists is the named part's own method, bound on the Broker (no call between)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pzq.broker
import pzq.broker.core
from pzq.broker import Broker


def _classes():
    for info in pkgutil.iter_modules(pzq.broker.__path__):
        module = importlib.import_module(f"pzq.broker.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                yield cls


def test_no_class_of_the_broker_inherits_from_a_class_of_pzq():
    stacked = {
        cls.__qualname__: [base.__qualname__ for base in cls.__mro__[1:] if base.__module__.startswith("pzq.")]
        for cls in _classes()
    }
    assert {name: bases for name, bases in stacked.items() if bases} == {}


def _verb_table() -> dict[str, list[str]]:
    """core.py's table: module (without .py) -> the verbs it lists."""
    table: dict[str, list[str]] = {}
    module = ""
    for line in (pzq.broker.core.__doc__ or "").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) != 3 or cells[0] in ("part", "---"):
            continue
        module = cells[1].removesuffix(".py") or module
        table.setdefault(module, []).extend(re.findall(r"``(\w+)``", cells[2]))
    return table


def test_each_verb_of_the_table_in_core_is_its_parts_own_method_bound_on_the_broker(store):
    broker = Broker(store, ack_timeout_s=10.0)
    table = _verb_table()
    assert {"state", "produce", "handing", "settle", "ranges", "implicit", "questions", "queues"} <= set(table)
    for module, verbs in table.items():
        for verb in verbs:
            found = getattr(broker, verb)
            if module == "accounts":  # (the account itself, and the Broker's own three verbs for it)
                continue
            owner = getattr(found, "__self__", None)
            assert owner is not None and type(owner).__module__ == f"pzq.broker.{module}", (verb, module)
            assert owner is not broker, verb


def test_every_verb_bound_on_the_broker_is_in_the_table_in_core(store):
    broker = Broker(store, ack_timeout_s=10.0)
    listed = {verb for verbs in _verb_table().values() for verb in verbs}
    bound = {name for name, value in vars(broker).items() if not name.startswith("_") and inspect.ismethod(value)}
    assert bound - listed == set()
    assert len(bound) >= 50  # (what only gateways asked is on the views of questions.py now)
