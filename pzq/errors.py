"""The one exception tree of pzq (every error the package raises on purpose derives from PzqError), and
the named exit codes of the `pzq` command."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What a `pzq` command's exit status means; every exit of the package names one of these."""

    OK = 0
    FAILURE = 1  # the work failed: no server answered, a message was refused, a record is unreadable
    CONFIG = 2  # a bad setting, option or permission (click's usage errors exit 2 as well)
    USAGE = 2
    STORE = 3  # the store is damaged, or newer than this pzq: a restart would not help
    NOT_FOUND = 4  # what the command names does not exist (a queue)
    NOT_PERMITTED = 5  # the server refused this client's key: not let in, or without the right (permissions)
    DISK_FULL = 6  # the store's filesystem (or quota) has no room for what must be written: nothing is damaged
    SYNC_LOST = 7  # a commit or sync failed while answers waited for it: start again from what is on disk
    NOT_LISTENING = 8  # a client command: nothing listens at the endpoint (no connection within 1 s)
    CURVE_REFUSED = 9  # a client command: the server wants a CURVE key, another one, or none (handshake failed)
    NO_MESSAGE = 10  # a client command: connected, but no message (or answer) came within its --timeout
    NOT_CONFIRMED = 11  # a destructive command was not confirmed: no terminal to ask on and no --yes, or "no"
    UNROUTED = 12  # an MQKS event no queue is bound to: nothing was published (MQKS would drop it)
    WRONG_SHARD = 13  # the store is another shard's (its name is kept in it): `pzq serve --shard` refused it


class PzqError(Exception):
    """Root of every error pzq raises on purpose."""


class ConfigError(PzqError):
    """A setting is missing, malformed or out of range; the message names the setting."""


class StoreError(PzqError):
    """The store cannot do what was asked (it is closed, corrupt, or the request is impossible)."""


class StoreFull(StoreError):
    """Storing this message would pass the configured store limit; nothing was written."""


class StoreDamaged(StoreError):
    """The data file cannot be read as an LMDB store: a restart would not help (exit status 3)."""


class StoreTooNew(StoreError):
    """The store was written by a newer pzq, in a format this one cannot read (exit status 3)."""


class StoreDenied(StoreError):
    """The user pzq runs as may not read or write the store, or its data file is not a file: a
    permission or a setting to fix, not damage (exit status 2)."""


class DiskFull(StoreError):
    """The store's filesystem, or the user's quota, has no room for what must be written (ENOSPC,
    EDQUOT): a sound store on a full disk, not damage. Exit status ``DISK_FULL``: free room, run again."""


class SyncLost(StoreError):
    """A commit or sync failed while an earlier commit's meta page was not known on disk, or answers
    waited for it: the kernel may have dropped that write, so nothing that depends on it may be sent.
    The server stops (exit status ``SYNC_LOST``) and its supervisor starts it again from the disk."""


class WrongShard(StoreError):
    """The store is another shard's: it keeps the name of the shard it was first started as, and a start
    as another (``--shard``) is refused, so that two shards never serve one store's queues. Exit status
    ``WRONG_SHARD``."""


class StoreLocked(StoreError):
    """Another pzq process holds the store: there is one writer, and it is not this process."""


class ProtocolError(PzqError):
    """A peer sent something its protocol does not allow.

    ``code`` is a short machine-readable name (e.g. ``no-delimiter``); ``detail`` is the human text that a
    protocol with error replies sends back to the peer. ``fatal`` says the peer's stream cannot be read
    any further (its framing is lost): the connection is closed, whatever the protocol's error replies.
    """

    def __init__(self, code: str, detail: str, fatal: bool = False):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.fatal = fatal


class ClientError(PzqError):
    """A client call failed: no answer in time, or the server refused the request."""


class NotListening(ClientError):
    """Nothing listens at the client's endpoint: no connection within its patience (1 s for a `pzq`
    command), or an ipc:// socket file that is not there. Exit status ``NOT_LISTENING``."""


class CurveRefused(ClientError):
    """The connection was made but its ZeroMQ handshake failed or never completed: the server wants a
    CURVE key (or another server key), or does not use CURVE at all. Exit status ``CURVE_REFUSED``."""


class NoMessage(ClientError):
    """Connected and handshaken, but no message (or answer, or ack) came within the wait: the server is
    there and said nothing. Exit status ``NO_MESSAGE``."""


class AnswerLost(NoMessage):
    """The connection dropped (the server killed, restarted, the network) before the server answered: the
    request may or may not have been carried out (a batched consumer's ACK: its keys may be settled, or
    come again). Raised at once, not at the wait's end. Exit status ``NO_MESSAGE``."""


class NotPermitted(ClientError):
    """The server refused this client: its CURVE key is not let onto the socket (not among the server's
    clients, or without the right the socket needs: docs/permissions.md), or it has not the right for
    the request. Exit status ``NOT_PERMITTED``."""
