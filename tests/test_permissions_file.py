"""The permissions file on its own: what its patterns match, which section decides, what a wrong file
says, and what a reload keeps."""

from __future__ import annotations

import logging

import pytest

from pzq.errors import ConfigError
from pzq.permissions import CONSUME, MANAGE, PRODUCE, Permissions, Rules, default_path


def rules(tmp_path, text: str) -> Rules:
    path = tmp_path / "permissions.toml"
    path.write_text(text)
    return Rules.read(str(path))


def test_a_star_matches_any_run_of_characters_dots_included_and_nothing_else_is_special(tmp_path):
    keys = rules(tmp_path, '[keys.a]\nconsume = ["orders.*", "exact[1]?", "*-dlq"]\n').for_key("a")
    assert keys.may(CONSUME, "orders.eu") and keys.may(CONSUME, "orders.eu.paid") and keys.may(CONSUME, "orders.")
    assert not keys.may(CONSUME, "orders") and not keys.may(CONSUME, "xorders.eu")
    assert keys.may(CONSUME, "exact[1]?") and not keys.may(CONSUME, "exact1x")
    assert keys.may(CONSUME, "payroll-dlq") and not keys.may(CONSUME, "payroll-dlq2")
    assert not keys.may(PRODUCE, "orders.eu") and not keys.may(MANAGE, "orders.eu"), "rights do not imply each other"


def test_a_queue_name_that_is_not_utf8_is_matched_without_raising(tmp_path):
    keys = rules(tmp_path, '[keys.a]\nproduce = ["orders.*"]\n').for_key("a")
    assert keys.may(PRODUCE, b"orders.\xff\xfe")
    assert not keys.may(PRODUCE, b"\xffpayroll")


def test_keys_not_listed_and_clients_without_a_key_get_the_default_and_no_default_is_nothing(tmp_path):
    with_default = rules(tmp_path, '[default]\nconsume = ["public.*"]\n[keys.a]\nproduce = ["a"]\n')
    assert with_default.for_key("someone").may(CONSUME, "public.news")
    assert with_default.for_key(None).may(CONSUME, "public.news")
    assert not with_default.for_key("a").may(CONSUME, "public.news"), "a listed key gets its section only"
    without = rules(tmp_path, '[keys.a]\nproduce = ["a"]\n')
    assert not any(without.for_key("someone").may(right, "a") for right in (PRODUCE, CONSUME, MANAGE))


def test_the_most_specific_network_holding_a_peer_decides_and_others_get_the_default(tmp_path):
    found = rules(
        tmp_path,
        '[default]\nproduce = ["d"]\n[networks."10.0.0.0/8"]\nproduce = ["wide"]\n'
        '[networks."10.1.0.0/16"]\nproduce = ["narrow"]\n[networks."::1"]\nproduce = ["six"]\n',
    )
    assert found.for_address("10.1.2.3:5000")[0] == "network 10.1.0.0/16"
    assert found.for_address("10.2.2.3")[1].may(PRODUCE, "wide")
    assert found.for_address("[::1]:5000")[1].may(PRODUCE, "six")
    assert found.for_address("::ffff:10.1.0.9")[0] == "network 10.1.0.0/16", "a v4 peer on a v6 listener"
    for nowhere in ("192.168.0.1:1", "", None, "garbage"):
        assert found.for_address(nowhere)[0] == "default"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[keys.a\n", "not TOML"),
        ('[tenants.a]\nproduce = ["x"]\n', "unknown section 'tenants'"),
        ('[keys.a]\nread = ["x"]\n', "'read' is not a right"),
        ('[keys.a]\nproduce = "x"\n', "must be a list of queue-name patterns"),
        ("[keys.a]\nproduce = [1]\n", "must be a list of queue-name patterns"),
        ('[keys.a]\nproduce = [""]\n', "must be a list of queue-name patterns"),
        ('[networks."10.0.0.300/8"]\nproduce = ["x"]\n', "is not an IP address or network"),
        (f'[keys.a]\nproduce = ["{"x" * 256}"]\n', "over 255 bytes"),
        ('keys = "a"\n', "[keys] must hold tables"),
        ("default = 1\n", "[default] must be a table"),
    ],
)
def test_a_wrong_file_is_refused_with_what_is_wrong(tmp_path, text, says):
    with pytest.raises(ConfigError, match=None) as raised:
        rules(tmp_path, text)
    assert says in str(raised.value) and str(tmp_path) in str(raised.value)


def test_no_file_allows_everything_and_says_so(tmp_path):
    permissions = Permissions(str(tmp_path / "permissions.toml"))
    assert not permissions.enabled
    assert permissions.key_may("anykey", MANAGE, "payroll", "test", "PURGE")
    assert permissions.peer_may("10.0.0.1", PRODUCE, "payroll", "test", "send")
    assert "no file" in permissions.describe() and "every client may" in permissions.describe()


def test_a_file_named_on_purpose_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it"):
        Permissions(str(tmp_path / "missing.toml"), required=True)


def test_the_file_is_looked_for_beside_the_clients_directory():
    assert default_path("/etc/pzq/clients") == "/etc/pzq/permissions.toml"
    assert default_path("/etc/pzq/clients/") == "/etc/pzq/permissions.toml"
    assert default_path("") == ""


def test_refusals_are_counted_per_client_and_right_and_named_by_key_name(tmp_path):
    path = tmp_path / "permissions.toml"
    path.write_text('[keys.orders]\nconsume = ["orders.*"]\n[networks."10.0.0.0/8"]\nproduce = ["x"]\n')
    permissions = Permissions(str(path), names={"KEYZ85": "orders"}.get)
    assert permissions.key_may("KEYZ85", CONSUME, "orders.eu", "api", "FETCH")
    assert not permissions.key_may("KEYZ85", CONSUME, "payroll", "api", "FETCH")
    assert not permissions.key_may("KEYZ85", MANAGE, "payroll", "monitor", "PURGE")
    assert not permissions.key_may(None, PRODUCE, "x", "api", "PRODUCE")
    assert not permissions.peer_may("10.0.0.1:99", CONSUME, "x", "mqks", "consume")
    assert permissions.stats() == {
        "file": str(path),
        "refused_total": 4,
        "refused": {
            "anonymous": {"produce": 1},
            "network 10.0.0.0/8": {"consume": 1},
            "orders": {"consume": 1, "manage": 1},
        },
    }


def test_a_reload_of_a_wrong_or_removed_file_keeps_the_rules_in_force(tmp_path, caplog):
    path = tmp_path / "permissions.toml"
    path.write_text('[keys.a]\nproduce = ["a"]\n')
    permissions = Permissions(str(path), names=lambda key: key)
    path.write_text('[keys.a]\nproduce = ["*"\n')  # a typo must not widen anyone's rights
    with caplog.at_level(logging.ERROR):
        assert not permissions.reload()
    assert "the rules read before stay in force" in caplog.text
    assert not permissions.allows_key("a", PRODUCE, "b")
    path.unlink()
    assert not permissions.reload()
    assert not permissions.allows_key("a", PRODUCE, "b"), "removing the file does not turn permissions off"
    path.write_text('[keys.a]\nproduce = ["*"]\n')
    assert permissions.reload() and permissions.allows_key("a", PRODUCE, "b")


def test_a_file_that_appears_is_taken_at_the_next_reload(tmp_path):
    path = tmp_path / "permissions.toml"
    permissions = Permissions(str(path), names=lambda key: key)
    assert not permissions.reload() and not permissions.enabled
    path.write_text('[keys.a]\nproduce = ["a"]\n')
    assert permissions.reload() and not permissions.allows_key("a", PRODUCE, "b")


def test_the_example_file_shipped_in_conf_is_a_valid_permissions_file():
    from pathlib import Path

    example = Rules.read(str(Path(__file__).resolve().parent.parent / "conf" / "permissions.example.toml"))
    assert example.for_key("orders-app").may(CONSUME, "orders.eu")
    assert not example.for_key("orders-app").may(CONSUME, "payroll")
    assert example.for_key("console").may(MANAGE, "payroll") and not example.for_key("console").may(PRODUCE, "x")
    assert example.for_address("127.0.0.1:4000")[1].may(PRODUCE, "legacy.php")
