"""Queue semantics shared by every protocol: produce, hand out, acknowledge, requeue, expire.

The Broker sits between the protocol gateways and the store. It owns what is in flight and where each
queue's next ready message is, and it never touches a socket: a gateway asks it for messages to send
and tells it what came back, in runs where it can (``produce_many``, ``take``, ``ack_many``,
``take_back_many``). Times are passed in (a take gets the turn's ``Now``,
pzq/clock.py; a stamp alone is ``now_us``, wall-clock µs), so every timing rule is testable without
sleeping. ``readiness`` grows whenever messages may have become ready, for any gateway that waits for that.

Modules: ``state`` (the life of a delivery as numbered rules and a transition table, and the state
every part shares), ``core`` (the Broker: its parts held, their verbs offered), and the parts, each
handed the state: ``produce``, ``handing`` (take), ``settle`` (answers from consumers, timeouts),
``ranges`` (consumer groups' range holds), ``implicit`` (queues made by clients' requests),
``questions`` (the views gateways ask instead of reaching into the store: ``queues``, ``deliveries``,
a payer's ``account``), ``queues`` (whole queues, figures); ``accounts`` (the byte account of
deliveries).
"""

from pzq.broker.core import Broker
from pzq.broker.handing import Taken, TakenRun
from pzq.broker.state import Counters, Exclusive, Ref, continues

__all__ = ["Broker", "Counters", "Exclusive", "Ref", "Taken", "TakenRun", "continues"]
