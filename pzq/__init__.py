"""pzq: a durable message queue service on ZeroMQ and LMDB."""

__version__ = "0.1.0"
