"""Queue semantics shared by every protocol: produce, hand out, acknowledge, requeue, expire.

The Broker sits between the protocol gateways and the store. It owns what is in flight and where each
queue's next ready message is, and it never touches a socket: a gateway asks it for messages to send
and tells it what came back, in runs where it can (``produce_many``, ``take``, ``ack_many``,
``undeliver_many``, ``take_back_many``). Times are passed in (``now`` monotonic seconds, ``now_us``
wall-clock microseconds), so every timing rule is testable without sleeping. ``readiness`` grows
whenever messages may have become ready, for any gateway that waits for that.

Modules: ``state`` (what every part keeps and the rules they share), ``core`` (producing, handing out,
whole queues, figures), ``settle`` (answers from consumers, timeouts), ``ranges`` (consumer groups'
range holds), ``questions`` (what gateways ask instead of reaching into the store), ``implicit`` (queues
made by clients' requests: shares, users, expiry).
"""

from pzq.broker.core import Broker, Taken, TakenRun
from pzq.broker.state import Counters, Exclusive, Ref, continues

__all__ = ["Broker", "Counters", "Exclusive", "Ref", "Taken", "TakenRun", "continues"]
