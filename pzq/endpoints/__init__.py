"""The socket side of each protocol: one adapter per endpoint, driven by the server loop.

An adapter reads its sockets during a turn and hands what it read to its gateway (or the broker);
what it must send waits until the server has committed the turn, then goes out in ``flush``. Only the
server loop and these adapters touch sockets; the protocols (pzq/protocols) and gateways
(pzq/gateways) stay pure.
"""
