"""Gateways: each turns one foreign protocol's connections into broker calls on the shared named
queues. Pure of sockets like the protocol codecs: the server feeds them bytes and sends what they return."""
