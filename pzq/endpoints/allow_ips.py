"""--allow-ips: the networks a raw-TCP endpoint accepts connections from (IPv4-mapped IPv6 read as IPv4)."""

from __future__ import annotations

import ipaddress


def allowed_networks(text: str) -> list | None:
    """``--allow-ips`` as networks; None when empty (no list: every address may connect)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    return [ipaddress.ip_network(p, strict=False) for p in parts] or None


def allowed(peer: str, networks: list) -> bool:
    """Whether IP address ``peer`` is in one of ``networks`` (never when it is not an address)."""
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)
