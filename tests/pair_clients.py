"""The clients of the gateway pairs (tests/pairs.py), one per protocol: verbs written in its client
codec from pzq/protocols, and what the gateway sent decoded into events (pair_loop's ``Delivered``,
``Answered``, ``Closed``). A protocol joins by one more class here and its factory in pairs.py."""

from __future__ import annotations

import json
from collections.abc import Hashable

from pzq.gateways import native as native_gateway
from pzq.gateways.contract import ONLY, Send
from pzq.gateways.emqp import BACK, FRONT
from pzq.protocols import api, emqp, mqks_client, phpmq
from pzq.protocols import native as native_codec

from pair_loop import (
    ACK_TIMEOUT_S,
    HEARTBEAT_S,
    LEASE_TIMEOUT_S,
    LIVENESS,
    MAX_INPUT,
    Answered,
    Client,
    Delivered,
    Loop,
)


class PhpmqClient(Client):
    """PHPMQ: SEND, CONSUME with a count, ACK by message id; no answers, garbage closes."""

    confirms, closes = False, True

    def __init__(self, loop: Loop, name: str):
        super().__init__(loop, name)
        loop.connect(self.peer)

    def _send(self, msg_type: int, packets: list[tuple[int, bytes]]) -> None:
        self.loop.feed(self.peer, phpmq.encode(msg_type, packets))

    def produce(self, queue: str, body: bytes) -> str:
        self._send(phpmq.SEND, [(phpmq.QUEUE, queue.encode()), (phpmq.CONTENT, body)])
        return ""

    def consume(self, queue: str, n: int) -> None:
        self._send(phpmq.CONSUME, [(phpmq.QUEUE, queue.encode()), (phpmq.COUNT, b"%d" % n)])

    def ack(self, delivery: Delivered) -> str:
        queue, message_id = delivery.handle
        self._send(phpmq.ACK, [(phpmq.QUEUE, queue.encode()), (phpmq.MESSAGE_ID, message_id)])
        return ""

    def garbage(self) -> None:
        self.loop.feed(self.peer, b"GARBAGE!")

    def disconnect(self) -> None:
        self.loop.hang_up(self.peer)

    def receive(self, send: Send) -> None:
        data = send.frames[1]
        while data:  # 003 messages: "H01003" count(2), then packets "P" type(2) length(29) content
            assert data[:6] == b"H01003", data[:40]
            count, at, packets = int(data[6:8]), phpmq.HEADER_SIZE, {}
            for _ in range(count):
                kind, length = int(data[at + 1 : at + 3]), int(data[at + 3 : at + phpmq.PACKET_HEADER_SIZE])
                at += phpmq.PACKET_HEADER_SIZE
                packets[kind] = data[at : at + length]
                at += length
            data = data[at:]
            queue = packets[phpmq.QUEUE].decode()
            self.events.append(Delivered(queue, packets[phpmq.CONTENT], (queue, packets[phpmq.MESSAGE_ID])))


class MqksClient(Client):
    """MQKS: publish --confirm (its queue bound to an event of its own name), manual-ack consumers,
    ack by consumer and msg_id; an endless line closes."""

    closes = True

    def __init__(self, loop: Loop, name: str):
        super().__init__(loop, name)
        loop.connect(self.peer)

    def _line(self, action: str, data: str, confirm: bool = False) -> str:
        request_id = self.tag()
        self.loop.feed(self.peer, mqks_client.request_line(request_id, action, data, confirm))
        return request_id

    def produce(self, queue: str, body: bytes) -> str:
        self._line("rebind", f"{queue} --add {queue}")  # so that the event reaches the queue
        return self._line("publish", f"{queue} {body.decode()}", confirm=True)

    def consume(self, queue: str, n: int) -> None:
        self._line("consume", f"{queue} --add {queue} --manual-ack --prefetch={n}")

    def ack(self, delivery: Delivered) -> str:
        consumer, msg_id = delivery.handle
        return self._line("ack", f"{consumer} {msg_id}", confirm=True)

    def garbage(self) -> None:
        self.loop.feed(self.peer, b"x" * (MAX_INPUT + 1))

    def disconnect(self) -> None:
        self.loop.hang_up(self.peer)

    def receive(self, send: Send) -> None:
        for line in send.frames[1].decode().splitlines():
            delivery = mqks_client.parse_delivery(line)
            if delivery is not None:  # (a consumer's id is the id of its consume request: deliveries first)
                queue = delivery.event  # (each queue is bound to the event of its name)
                self.events.append(Delivered(queue, delivery.data.encode(), (delivery.consumer, delivery.msg_id)))
                continue
            request_id = line.split(" ", 1)[0]
            answer = mqks_client.parse_answer(line, request_id)
            if answer is not None:
                self.events.append(Answered(request_id, answer.ok))


class EmqpClient(Client):
    """eMQP: REQUESTs as a client (answered by ACK), jobs as a worker (INFORM, one READY per job),
    settled by REPLY. A worker's only disconnect is silence (a ROUTER never tells of a peer gone), and
    garbage is dropped: a ZeroMQ peer has no connection of its own to close. A job its worker's pipe
    cannot take is kept for it, and a worker jobs are kept for is handed no new one."""

    unsent = "kept"

    def __init__(self, loop: Loop, name: str):
        super().__init__(loop, name)
        self.user = f"key-{name}"  # its CURVE key: part of what a worker holds by
        self.queues: list[str] = []

    def _command(self, socket: str, name: str, *args: str) -> str:
        msgid = self.tag()
        self.loop.feed_frames(socket, [self.peer, *emqp.command(name, msgid, *args)], self.user)
        return msgid

    def _worker(self, queue: str) -> None:
        if queue not in self.queues:
            self.queues.append(queue)
            self._command(BACK, "INFORM", json.dumps([[10, q] for q in self.queues]), "worker")

    def produce(self, queue: str, body: bytes) -> str:
        return self._command(FRONT, "REQUEST", queue, "", body.decode())

    def consume(self, queue: str, n: int) -> None:
        self._worker(queue)
        for _ in range(n):
            self._command(BACK, "READY")

    def ack(self, delivery: Delivered) -> str:
        self._worker(delivery.queue)
        return self._command(BACK, "REPLY", '"done"', delivery.handle[0])

    def garbage(self) -> None:
        self.loop.feed_frames(BACK, [self.peer, b"", b"not eMQP"], self.user)

    def disconnect(self) -> None:
        self.loop.clock.advance(HEARTBEAT_S * LIVENESS + 1)

    def receive(self, send: Send) -> None:
        cmd = emqp.parse(send.frames)
        if cmd.name == "ACK":
            self.events.append(Answered(cmd.args[0], True))
        elif cmd.name == "REPLY" and "error" in json.loads(cmd.args[0]):
            self.events.append(Answered(cmd.args[1], False))
        elif cmd.name == "REQUEST":
            queue, _, payload = cmd.args
            self.events.append(Delivered(queue, payload.encode(), (cmd.msgid,)))


class ApiClient(Client):
    """The API: PRODUCE; a consumer group of its own read by LEASE, then FETCH of what was leased;
    ACK_UPTO. Its disconnect is silence: a group nobody calls for the lease timeout lets go. Garbage
    (a request without its delimiter) gets no answer; nothing is closed."""

    unsent, holds_back = "kept", False

    def __init__(self, loop: Loop, name: str):
        super().__init__(loop, name)
        self.user, self.group = f"key-{name}", f"group-{name}"
        self._pending: dict[str, tuple[str, str]] = {}  # request id -> (command, queue)
        self.after: dict[str, int] = {}  # per queue: the group's leases end here

    def _request(self, command: str, queue: str, args: dict) -> str:
        request_id = self.tag()
        self._pending[request_id] = (command, queue)
        self.loop.feed_frames(ONLY, [self.peer, *api.request(request_id.encode(), command, args)], self.user)
        return request_id

    def produce(self, queue: str, body: bytes) -> str:
        return self._request("PRODUCE", queue, {"messages": [[queue, body]]})

    def consume(self, queue: str, n: int) -> None:
        after = self.after.get(queue, 0)
        self._request("LEASE", queue, {"queue": queue, "group": self.group, "after": after, "max": n})

    def ack(self, delivery: Delivered) -> str:
        group, lseq = delivery.handle
        return self._request("ACK_UPTO", delivery.queue, {"queue": delivery.queue, "group": group, "upto": lseq + 1})

    def garbage(self) -> None:
        self.loop.feed_frames(ONLY, [self.peer, b"no delimiter, no request id"], self.user)

    def disconnect(self) -> None:
        self.loop.clock.advance(LEASE_TIMEOUT_S + 1)

    def receive(self, send: Send) -> None:
        reply = api.parse_reply(send.frames[1:])
        assert reply is not None, f"not an API reply: {send.frames[1:]!r}"
        request_id, ok, body = reply
        tag = request_id.decode()
        command, queue = self._pending.pop(tag)
        if command == "LEASE" and ok:
            lo = self.after.get(queue, 0)
            self.after[queue] = body["end"]
            if body["end"] > lo:  # what was leased is read in the next turn
                self._request("FETCH", queue, {"queue": queue, "group": self.group, "lo": lo, "hi": body["end"]})
        elif command == "FETCH" and ok:
            for lseq, _key, _enqueued, _deliveries, payload in body["messages"]:
                self.events.append(Delivered(queue, payload, (self.group, lseq)))
        else:
            self.events.append(Answered(tag, ok))


class NativeClient(Client):
    """Native: a producer's DEALER (each message answered "1" or "0" with the error) and a consumer's
    ROUTER on the send socket. The server's DEALER picks the consumer and hides which one got what: every
    delivery has the one holder, so one consumer may settle another's (``settles_own`` is False), and a
    slow or full consumer pipe is the send socket's (``pipe``). A consumer's disconnect is silence: what it
    held returns at its ack timeout. Garbage from a producer is answered "0"; nothing is closed."""

    settles_own = False

    def __init__(self, loop: Loop, name: str):
        super().__init__(loop, name)
        self.pipe = native_gateway.SEND
        self.consuming = False

    def wants(self, send: Send) -> bool:
        if send.socket == native_gateway.SEND:
            return self.consuming
        return send.peer == self.peer

    @staticmethod
    def route(send: Send) -> Hashable:
        return native_gateway.SEND if send.socket == native_gateway.SEND else send.peer

    @classmethod
    def idle(cls, clients: list[Client]) -> frozenset[Hashable]:
        consuming = any(isinstance(c, NativeClient) and c.consuming for c in clients)
        return frozenset() if consuming else frozenset({native_gateway.SEND})  # (no consumer connected)

    def produce(self, queue: str, body: bytes) -> str:
        message_id = self.tag()
        self.loop.feed_frames(native_gateway.RECEIVE, [self.peer, *native_codec.produce(message_id.encode(), [body])])
        return message_id

    def consume(self, queue: str, n: int) -> None:
        self.consuming = True  # (its ROUTER connects to the send socket: the server's credit decides)

    def ack(self, delivery: Delivered) -> str:
        self.loop.feed_frames(native_gateway.SEND, native_codec.consumer_ack(delivery.handle[0]))
        return ""

    def garbage(self) -> None:
        self.loop.feed_frames(native_gateway.RECEIVE, [self.peer, b"an id and nothing more"])

    def disconnect(self) -> None:
        self.consuming = False
        self.loop.clock.advance(ACK_TIMEOUT_S + 1)

    def receive(self, send: Send) -> None:
        if send.socket == native_gateway.SEND:
            got = native_codec.parse_delivery(send.frames)
            assert got is not None, f"not a delivery: {send.frames!r}"
            self.events.append(Delivered("q", b"".join(got.body), (got.key,)))
            return
        ack = native_codec.parse_produce_ack(send.frames[1:])
        assert ack is not None, f"not a produce ack: {send.frames!r}"
        self.events.append(Answered(ack.message_id.decode(), ack.ok))
