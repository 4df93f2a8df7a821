"""Config layering: flag > PZQ_* environment > TOML file > default, and the documented conf/pzq.toml."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from pzq import config
from pzq.config import Config
from pzq.errors import ConfigError

CONF = Path(__file__).resolve().parent.parent / "conf" / "pzq.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pzq.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_defaults_are_valid_and_are_what_load_gives_without_input():
    assert Config().validate() == Config()
    assert config.load() == Config()
    assert config.load(flags={}, env={}) == Config()


def test_a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default(tmp_path):
    path = write(tmp_path, 'ack_timeout = 3000\nqueue = "from-file"\nmax_inflight = 7\n')
    env = {"PZQ_ACK_TIMEOUT": "2000", "PZQ_QUEUE": "from-env"}
    cfg = config.load(flags={"ack_timeout": 1000, "queue": None}, env=env, file=path)
    assert (cfg.ack_timeout, cfg.queue, cfg.max_inflight, cfg.reaper_frequency) == (1000, "from-env", 7, 2_500_000)


def test_every_setting_is_read_from_pzq_and_its_key_in_upper_case():
    env = {
        "PZQ_DATABASE": "/var/lib/pzq",
        "PZQ_RECEIVE_DSN": "tcp://0.0.0.0:1",
        "PZQ_MAX_DELIVERIES": "5",
        "PZQ_LOG_LEVEL": "debug",
        "PZQ_USER": "nobody",
        "PZQ_HARD_SYNC": "off",
        "PZQ_ack_timeout": "2000",
        "ACK_TIMEOUT": "3000",
        "PZQ_MAX_INFLIGHT": "",
    }
    cfg = config.load(env=env)
    assert (cfg.database, cfg.receive_dsn, cfg.max_deliveries, cfg.log_level, cfg.user, cfg.hard_sync) == (
        "/var/lib/pzq",
        "tcp://0.0.0.0:1",
        5,
        "debug",
        "nobody",
        False,
    )
    assert (cfg.ack_timeout, cfg.max_inflight) == (5_000_000, 1000)


@pytest.mark.parametrize(
    "text, size",
    [
        ("512M", 512 << 20),
        ("4G", 4 << 30),
        ("2048", 2048),
        ("64k", 64 << 10),
        ("1T", 1 << 40),
        ("8MiB", 8 << 20),
        (" 16 MB ", 16 << 20),
    ],
)
def test_sizes_take_k_m_g_t_suffixes(text, size):
    assert config.parse_size(text) == size


def test_size_settings_accept_suffixes_from_every_source(tmp_path):
    path = write(tmp_path, 'max_store_size = "512M"\n')
    assert config.load(file=path).max_store_size == 512 << 20
    assert config.load(env={"PZQ_MAX_STORE_SIZE": "4G"}).max_store_size == 4 << 30
    assert config.load(flags={"max_message_size": "2K"}).max_message_size == 2048


@pytest.mark.parametrize("text", ["1.5G", "-1", "G", "4X", ""])
def test_a_malformed_size_is_refused(text):
    with pytest.raises(ValueError):
        config.parse_size(text)


@pytest.mark.parametrize(
    "text, value",
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("0", False),
        ("False", False),
        ("no", False),
        ("off", False),
    ],
)
def test_booleans_accept_the_usual_words(text, value):
    assert config.load(env={"PZQ_HARD_SYNC": text}).hard_sync is value


def test_a_toml_boolean_is_taken_as_is(tmp_path):
    assert config.load(file=write(tmp_path, "hard_sync = false\n")).hard_sync is False


def test_dashed_keys_are_accepted_in_the_file(tmp_path):
    path = write(tmp_path, 'ack-timeout = 2000\nlog-level = "error"\n')
    cfg = config.load(file=path)
    assert (cfg.ack_timeout, cfg.log_level) == (2000, "error")


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"env": {"PZQ_HARD_SYNC": "maybe"}}, "PZQ_HARD_SYNC"),
        ({"env": {"PZQ_ACK_TIMEOUT": "5s"}}, "PZQ_ACK_TIMEOUT"),
        ({"env": {"PZQ_MAX_STORE_SIZE": "lots"}}, "max_store_size"),
        ({"flags": {"ack_timeout": -1}}, "--ack-timeout"),
        ({"flags": {"max_deliveries": -1}}, "--max-deliveries"),
        ({"env": {"PZQ_MAX_INFLIGHT": "-5"}}, "--max-inflight"),
        ({"flags": {"max_store_size": 1000}}, "--max-store-size"),
        ({"flags": {"receive_dsn": "localhost:11131"}}, "--receive-dsn"),
        ({"flags": {"monitor_dsn": "http://x"}}, "--monitor-dsn"),
        ({"flags": {"log_level": "loud"}}, "--log-level"),
        ({"flags": {"queue": ""}}, "--queue"),
        ({"flags": {"bogus": 1}}, "--bogus"),
    ],
)
def test_a_bad_setting_raises_config_error_naming_it(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        config.load(**kwargs)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("bogus = 1\n", "bogus"),
        ("send_dsn = 11132\n", "send_dsn"),
        ("ack_timeout = -5\n", "--ack-timeout"),
        ("max_inflight = true\n", "max_inflight"),
        ("queue = [unclosed\n", "not valid TOML"),
    ],
)
def test_a_bad_file_raises_config_error_naming_the_key_or_the_file(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle):
        config.load(file=write(tmp_path, text))


def test_a_missing_config_file_raises_config_error_naming_the_file(tmp_path):
    missing = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match="absent.toml"):
        config.load(file=missing)


def test_a_table_in_the_file_is_refused_rather_than_silently_ignored(tmp_path):
    path = write(tmp_path, 'database = "/srv/pzq"\n[serve]\nqueue = "jobs"\n')
    with pytest.raises(ConfigError, match="unknown key 'serve'"):
        config.load(file=path)


def test_the_shipped_conf_file_lists_every_setting_with_its_default():
    keys = set(tomllib.loads(CONF.read_text(encoding="utf-8")))
    assert keys == {f.name for f in dataclasses.fields(Config)} - {"limits"}
    assert config.load(file=CONF) == Config()
