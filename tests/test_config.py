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
    assert (cfg.ack_timeout, cfg.queue, cfg.max_inflight, cfg.reaper_frequency) == (0.001, "from-env", 7, 2.5)


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
    assert (cfg.ack_timeout, cfg.max_inflight) == (5.0, 1000)


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
    assert (cfg.ack_timeout, cfg.log_level) == (0.002, "error")


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"env": {"PZQ_HARD_SYNC": "maybe"}}, "PZQ_HARD_SYNC"),
        ({"env": {"PZQ_ACK_TIMEOUT": "5 parsecs"}}, "PZQ_ACK_TIMEOUT"),
        ({"flags": {"lease_timeout": "500ms"}}, "--lease-timeout: 500ms is not 1s to 720h"),
        ({"env": {"PZQ_MAX_STORE_SIZE": "lots"}}, "PZQ_MAX_STORE_SIZE"),
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


def comment_blocks(text: str) -> dict[str, str]:
    """Each key of a TOML file -> the comment lines just above it, joined into one line."""
    blocks, comment = {}, []
    for line in text.splitlines():
        if line.startswith("#"):
            comment.append(line.lstrip("# "))
        elif "=" in line:
            blocks[line.split("=")[0].strip()] = " ".join(comment)
            comment = []
        else:
            comment = []
    return blocks


def test_the_conf_file_says_of_every_key_what_its_option_help_says_and_writes_its_default_with_the_unit():
    text = CONF.read_text(encoding="utf-8")
    blocks, values = comment_blocks(text), tomllib.loads(text)
    for name, field in config.FIELDS.items():
        assert field.metadata["help"], f"{name} has no help"
        assert " ".join(config.describe(name).split()) in blocks[name], f"conf/pzq.toml: {name}'s comment"
        if name in config.DURATION_FIELDS or field.metadata["unit"] == config.SIZE:
            assert values[name] == config.show(name, field.default), f"conf/pzq.toml: {name} not with its unit"


def test_a_plain_duration_is_seconds_but_for_the_original_pzqs_two_and_refused_where_its_meaning_changed():
    assert config.DURATION_FIELDS == {
        "emqp_heartbeat_interval": "s",
        "lease_timeout": "s",
        "api_dedup_window": "s",
        "implicit_queue_ttl": "s",
        "gc_whole_interval": "s",
        "ack_timeout": "µs",
        "reaper_frequency": "µs",
        "commit_interval": "s",
    }
    assert config.PLAIN_REFUSED == {"commit_interval": "µs"}
    legacy = {
        "PZQ_EMQP_HEARTBEAT_INTERVAL": "3",
        "PZQ_LEASE_TIMEOUT": "3600",
        "PZQ_API_DEDUP_WINDOW": "86400.0",
        "PZQ_ACK_TIMEOUT": "5000000",
        "PZQ_REAPER_FREQUENCY": "2500000",
        "PZQ_COMMIT_INTERVAL": "10ms",
    }
    assert config.load(env=legacy) == Config()
    for name in config.DURATION_FIELDS:
        assert "plain number is" in config.describe(name)


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30s", 30.0),
        ("250ms", 0.25),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("2us", 2e-6),
        ("2µs", 2e-6),
        ("2μs", 2e-6),
        ("1.5s", 1.5),
        (" 10 ms ", 0.01),
        (".5s", 0.5),
        ("7", 7.0),
    ],
)
def test_durations_take_units(text, seconds):
    assert config.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5 parsecs", "s", "1e3s", "", "inf", "nan", "--5s", "5 s s", "1,5s"])
def test_a_malformed_duration_is_refused(text):
    with pytest.raises(ValueError):
        config.parse_duration(text)


def test_a_toml_number_or_boolean_for_a_duration_is_read_in_the_legacy_unit_or_refused(tmp_path):
    cfg = config.load(file=write(tmp_path, "ack_timeout = 3000\ncommit_interval = 0\nlease_timeout = 60.5\n"))
    assert (cfg.ack_timeout, cfg.commit_interval, cfg.lease_timeout) == (0.003, 0.0, 60.5)
    with pytest.raises(ConfigError, match="ack_timeout"):
        config.load(file=write(tmp_path, "ack_timeout = true\n"))
    with pytest.raises(ConfigError, match="lease_timeout"):
        config.load(file=write(tmp_path, "lease_timeout = inf\n"))


def test_durations_take_units_from_flags_variables_and_the_file_and_are_held_in_seconds(tmp_path):
    path = write(tmp_path, 'ack_timeout = "30s"\nlease_timeout = "5m"\n')
    env = {"PZQ_COMMIT_INTERVAL": "250ms", "PZQ_API_DEDUP_WINDOW": "1h"}
    cfg = config.load(flags={"reaper_frequency": "1.5s", "emqp_heartbeat_interval": "500ms"}, env=env, file=path)
    assert (cfg.ack_timeout, cfg.lease_timeout, cfg.commit_interval, cfg.api_dedup_window) == (30, 300, 0.25, 3600)
    assert (cfg.reaper_frequency, cfg.emqp_heartbeat_interval) == (1.5, 0.5)


@pytest.mark.parametrize(
    "seconds, text",
    [(3600.0, "1h"), (86400.0, "24h"), (5400.0, "1.5h"), (90.0, "1.5m"), (5.0, "5s"), (2.5, "2.5s")]
    + [(0.01, "10ms"), (0.001, "1ms"), (2e-6, "2µs"), (0.0, "0s"), (-5e-6, "-5µs")],
)
def test_a_duration_is_shown_in_the_largest_unit_that_writes_it_short_and_reads_back_the_same(seconds, text):
    assert config.format_duration(seconds) == text
    assert config.parse_duration(text) == seconds


@pytest.mark.parametrize(
    "size, text", [(4 << 30, "4G"), (256 << 20, "256M"), (1 << 40, "1T"), (1000, "1000"), (0, "0")]
)
def test_a_size_is_shown_with_the_largest_suffix_that_divides_it(size, text):
    assert config.format_size(size) == text
    assert config.parse_size(text) == size


@pytest.mark.parametrize(
    ("send", "consume"),
    [
        ("tcp://127.0.0.1:11132", "tcp://127.0.0.1:11134"),
        ("tcp://0.0.0.0:5001", "tcp://0.0.0.0:5003"),
        ("ipc:///run/pzq/send", "ipc:///run/pzq/consume"),
        ("ipc:///run/pzq/consume", "ipc:///run/pzq/consume-batched"),
        ("inproc://send", "inproc://send-consume"),
    ],
)
def test_the_batched_consumers_endpoint_defaults_to_beside_the_send_socket(send, consume):
    assert config.Config(send_dsn=send).validate().consume_dsn == consume


def test_a_batched_endpoint_that_auto_cannot_place_or_that_another_endpoint_has_is_refused_by_name():
    with pytest.raises(ConfigError, match="'auto' finds no endpoint beside --send-dsn"):
        config.Config(send_dsn="tcp://127.0.0.1:65535").validate()
    with pytest.raises(ConfigError, match="is --api-dsn too"):
        config.Config(send_dsn="tcp://127.0.0.1:11131", receive_dsn="tcp://127.0.0.1:11130").validate()
    assert config.Config(consume_dsn="").validate().consume_dsn == ""


def test_a_base_port_moves_every_tcp_endpoint_no_source_named_to_its_fixed_offset(tmp_path):
    moved = config.load(env={"PZQ_BASE_PORT": "20000"})
    assert (moved.receive_dsn, moved.send_dsn, moved.api_dsn, moved.consume_dsn) == tuple(
        f"tcp://127.0.0.1:{port}" for port in (20000, 20001, 20002, 20003)
    )
    assert (moved.phpmq_dsn, moved.mqks_dsn) == ("tcp://127.0.0.1:20004", "tcp://127.0.0.1:20005")
    assert (moved.emqp_backend_dsn, moved.emqp_frontend_dsn, moved.emqp_publish_dsn) == tuple(
        f"tcp://127.0.0.1:{port}" for port in (20006, 20007, 20008)
    )
    assert moved.monitor_dsn == "ipc://./pzq-data/monitor" and moved.metrics_dsn == moved.http_dsn == ""
    # Every offset is in docs/configuration.md's table, and the defaults keep the first three's order.
    page = (CONF.parent.parent / "docs" / "configuration.md").read_text(encoding="utf-8")
    for name, offset in config.BASE_OFFSETS.items():
        assert f"| `{name}` | +{offset} |" in page, name
    # What a flag, a variable or the file names wins, even at its default value; '' still disables.
    path = write(tmp_path, 'base_port = 30000\nreceive_dsn = "tcp://127.0.0.1:11131"\nmqks_dsn = ""\n')
    mixed = config.load({"send_dsn": "ipc:///tmp/x/send"}, {"PZQ_API_DSN": "tcp://127.0.0.1:7"}, path)
    assert (mixed.receive_dsn, mixed.send_dsn, mixed.consume_dsn) == (
        "tcp://127.0.0.1:11131",
        "ipc:///tmp/x/send",
        "ipc:///tmp/x/consume",  # ('auto': beside the send socket wherever it is)
    )
    assert (mixed.api_dsn, mixed.mqks_dsn, mixed.phpmq_dsn) == ("tcp://127.0.0.1:7", "", "tcp://127.0.0.1:30004")
    assert config.load() == Config()  # (0: off)


def test_metrics_and_the_console_move_with_the_base_port_only_when_set_to_auto_and_a_bad_base_is_refused():
    auto = config.load({"base_port": 20000, "metrics_dsn": "auto", "http_dsn": "auto"})
    assert (auto.metrics_dsn, auto.http_dsn) == ("http://127.0.0.1:20009", "http://127.0.0.1:20010")
    with pytest.raises(ConfigError, match=r"--metrics-dsn: 'auto' is --base-port \+ 9: set --base-port too"):
        config.load({"metrics_dsn": "auto"})
    for base in ("65530", "-1"):
        with pytest.raises(ConfigError, match=r"--base-port: .* is not 0 \(off\) to 65525"):
            config.load(env={"PZQ_BASE_PORT": base})


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (  # (a base port gives receive +0: it had failed at the bind, "Address already in use", as if another program)
            {"base_port": 20000, "phpmq_dsn": "tcp://127.0.0.1:20000"},
            "--phpmq-dsn tcp://127.0.0.1:20000: port 20000 is --receive-dsn's too (--base-port 20000 put one there)",
        ),
        ({"mqks_dsn": "tcp://0.0.0.0:11131"}, "--mqks-dsn tcp://0.0.0.0:11131: port 11131 is --receive-dsn's too"),
        ({"metrics_dsn": "http://127.0.0.1:11132"}, "--metrics-dsn http://127.0.0.1:11132: port 11132 is --send-dsn's"),
    ],
)
def test_two_endpoints_on_one_port_are_refused_naming_both_before_anything_binds(flags, needle):
    with pytest.raises(ConfigError) as caught:
        config.load(flags=flags, env={})
    assert needle in str(caught.value)


def test_endpoints_on_one_port_of_two_hosts_or_on_ports_the_system_chooses_are_accepted():
    config.load(flags={"phpmq_dsn": "tcp://127.0.0.2:11131", "api_dsn": "tcp://127.0.0.1:0"}, env={})
    config.load(flags={"base_port": 65525}, env={})  # (the last base port: every offset fits under 65536)
