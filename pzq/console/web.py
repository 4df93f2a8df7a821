"""A stub left for the broker's old in-loop console hook (pzq/cli/serve.py, tests/conftest.py import
``Console``): the console is now a process of its own, ``pzq console`` (pzq/console/server.py), which
``pzq serve --http-dsn`` starts as its child. This goes when the in-loop hook does."""

from __future__ import annotations

from typing import Any, NoReturn

from pzq.errors import ConfigError


class Console:
    """No longer served from the broker's loop."""

    @classmethod
    def from_config(cls, config: Any) -> NoReturn:
        raise ConfigError(
            f"--http-dsn {config.http_dsn}: the web console runs as its own process now: "
            f"pzq console --http-dsn {config.http_dsn} --monitor-dsn {config.monitor_dsn}"
        )
