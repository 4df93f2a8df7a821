"""The server: one thread, one poller, one loop; the endpoint adapters (pzq/endpoints) own the sockets.

Each turn of the loop:
  1. polls every socket, with a timeout that ends at the next deadline (never a busy loop), then reads
     the clocks once: the turn's ``Now`` (pzq/clock.py), handed to every step below;
  2. lets each endpoint read what arrived (bounded per socket, so one busy peer cannot starve the
     others) and feed it to its protocol codec, gateway and the broker;
  3. requeues expired deliveries and leases, and lets each endpoint pick what to send;
  Steps 2 and 3 (and the once-a-second tick) draw on one budget per turn (``TurnBudget``: a clock
  deadline, the bytes the turn may let in and the records it may touch, which bound steps 4 and 5);
  they stop between requests once it is spent, and what was not reached goes first in the next turn,
  which polls without waiting (round-robin);
  4. commits the turn's writes in one transaction (group commit): one sync of its data pages, its meta
     page written without waiting (the next commit's sync carries it: pzq/server/commits.py);
  5. lets each endpoint send the producer acks, deliveries and replies of every commit now on disk:
     the busy native sockets' output waits for the next turn's commit, unless no work is ready, the
     turn wrote nothing, or another endpoint has output, when the meta page is synced on its own.
Step 5 after step 4 is the durability promise: no ack leaves for data that is not on disk. After each
turn the garbage collector's survivors are frozen (pzq/server/collector.py), so that its full
collections stay short.
"""

from __future__ import annotations

from collections.abc import Callable

from pzq.config import Config
from pzq.server.loop import Server
from pzq.server.process import NewStore, return_freed_memory


def serve(config: Config, reload: Callable[[], Config] | None = None) -> None:
    """Run a server in this process until SIGTERM or SIGINT; the CLI's `pzq serve`. ``reload`` re-reads
    the settings on SIGHUP."""
    return_freed_memory()  # (the process's own malloc: before the first big buffer)
    server = Server(config)
    server.reloader = reload
    try:
        NewStore(config.database).start(server)  # (a start that fails leaves no new store behind)
        server.install_signal_handlers()
        server.run()
    finally:
        server.close()


__all__ = ["Server", "serve"]
