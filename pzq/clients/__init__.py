"""Blocking clients of a pzq server, one module per protocol: ``native`` (PZQ producer, consumer and
monitor), ``api`` (the API the Spark connector uses) and ``mqks``; ``sockets`` holds what they share.
They are what the CLI, the benchmark, the Spark connector and the tests talk to a server with."""

from pzq.clients.api import ApiClient, ApiError
from pzq.clients.mqks import MqksClient
from pzq.clients.native import Consumer, Producer
from pzq.clients.sockets import Curve

__all__ = ["ApiClient", "ApiError", "Consumer", "Curve", "MqksClient", "Producer"]
