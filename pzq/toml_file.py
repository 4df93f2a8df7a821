"""Reading a TOML file of pzq's (the config file, the permissions file, the shard list): every way one can
be wrong is a ConfigError of one line naming the file, never a traceback."""

from __future__ import annotations

import tomllib
from typing import Any

from pzq.errors import ConfigError


def read_toml(path: str, what: str, *, invalid: str = "not TOML") -> dict[str, Any]:
    """The TOML file at ``path`` as a dict; ``what`` names it in errors ("shard list", "config file"),
    ``invalid`` says a file TOML cannot read (the config file's words are older than the others')."""
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {path}: {invalid}: {exc}") from None
    except UnicodeDecodeError as exc:  # (tomllib decodes the bytes first, and lets this one through)
        raise ConfigError(f"{what} {path}: not UTF-8 text: byte {exc.start} is not UTF-8") from None
    except RecursionError:  # (tomllib's parser recurses into each nested array or table)
        raise ConfigError(f"{what} {path}: {invalid}: arrays or tables nested too deeply") from None
