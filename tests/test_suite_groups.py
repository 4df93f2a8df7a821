"""The suite's units of work under pytest-xdist (tests/conftest.py): a module sharing a dear fixture, and
the tests binding pzq's default ports, go out to one worker each, whatever pytest and xdist do with marks."""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

from conftest import DEFAULT_PORTS, SHARED_MODULES, xdist_group_of


def test_every_test_of_a_shared_module_goes_out_in_its_modules_unit():
    assert "test_spark" in SHARED_MODULES
    ids = ["tests/test_spark.py::test_a", "tests/test_spark.py::test_b[x-1]", "tests/test_spark.py::test_c@test_spark"]
    assert {xdist_group_of(nodeid) for nodeid in ids} == {"test_spark"}


def test_the_tests_binding_the_default_ports_go_out_together_and_any_other_test_alone():
    module, _, name = sorted(DEFAULT_PORTS)[0].partition(".py::")
    assert xdist_group_of(f"tests/{module}.py::{name}") == "default-ports"
    assert xdist_group_of(f"tests/{module}.py::{name}[param]") == "default-ports"
    assert xdist_group_of("tests/test_units.py::test_x") == "tests/test_units.py::test_x"


def test_the_scheduler_the_groups_rest_on_still_splits_work_by_scope():
    # (conftest's scheduler overrides this method: an xdist that renamed it would group nothing, silently)
    assert callable(getattr(LoadScopeScheduling, "_split_scope", None))
