"""CURVE key files, for both ends: make a pair (``pzq keygen``), read a pair or a public key, and make a
client socket use them. The server side (allow-list, authenticator) is ``curve.py``; the clients use
this module alone, so that they import nothing of the server.

Keys are pyzmq certificate files (``zmq.auth``): ``NAME.key`` holds a public key, ``NAME.key_secret``
the pair.
"""

from __future__ import annotations

import os

import zmq
import zmq.auth

from pzq.errors import ConfigError


def keygen(directory: str, name: str) -> tuple[str, str]:
    """Write ``NAME.key`` (public) and ``NAME.key_secret`` (owner-only) in ``directory``. ConfigError
    for a NAME that is not a plain file name ('', '../x' wrote outside it) or a directory not writable."""
    if not name or not name.isprintable() or "/" in name or name.startswith("."):
        raise ConfigError(f"keygen: {name!r} is not a key name (a file name: no '/', not starting with '.')")
    try:
        os.makedirs(directory, exist_ok=True)
        public, secret = zmq.auth.create_certificates(directory, name)
        os.chmod(secret, 0o600)
    except OSError as exc:
        raise ConfigError(f"keygen: cannot write keys in {directory}: {exc.strerror}") from None
    return public, secret


def load_pair(path: str, option: str) -> tuple[bytes, bytes]:
    """(public, secret) of the ``.key_secret`` file at ``path``; ConfigError naming ``option`` if not."""
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{option} {path}: cannot read a key file: {exc}") from None
    if not secret:
        raise ConfigError(f"{option} {path}: holds no secret key (give the .key_secret file)")
    return public, secret


def load_public(path: str, option: str) -> bytes:
    """The public key of the key file at ``path``; ConfigError naming ``option`` if it cannot be read."""
    try:
        return zmq.auth.load_certificate(path)[0]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{option} {path}: cannot read a key file: {exc}") from None


def secure_client(sock: zmq.Socket, client_secret_file: str, server_public_file: str) -> zmq.Socket:
    """Make ``sock`` (not yet connected) a CURVE client with this key pair, trusting this server key."""
    public, secret = load_pair(client_secret_file, "--curve-client-key")
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.curve_serverkey = load_public(server_public_file, "--curve-server-key")
    return sock
