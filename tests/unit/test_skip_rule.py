"""CI's rule on skips (tests/support/skips.py, hooked in by tests/conftest.py)."""

from types import SimpleNamespace

import pytest
from support import skips

ALLOWED = {
    "tests/integration/slow.py::*": "opt-in, takes an hour",
    "tests/unit/a.py::test_gpu": "needs a GPU",
}


def report(nodeid, skipped=True, reason="Skipped: no chromium", **extra):
    return SimpleNamespace(nodeid=nodeid, skipped=skipped, longrepr=("file.py", 3, reason), **extra)


def test_only_skips_not_on_the_list_are_undeclared():
    found = [
        skips.Skip("tests/integration/slow.py::test_all_of_elpv", "set DGX_RUN_SLOW=1"),
        skips.Skip("tests/unit/a.py::test_gpu", "no GPU"),
        skips.Skip("tests/unit/a.py::test_gpu_two", "no GPU"),
        skips.Skip("tests/integration/test_full_pipeline.py", "could not import 'elpv_dataset'"),
    ]
    assert [skip.nodeid for skip in skips.undeclared(found, ALLOWED)] == [
        "tests/unit/a.py::test_gpu_two",
        "tests/integration/test_full_pipeline.py",
    ]
    assert skips.allowed_reason("tests/integration/slow.py::test_x[param]", ALLOWED) == "opt-in, takes an hour"


def test_reports_become_skips_but_xfails_and_passes_do_not():
    assert skips.skip_from_report(report("t.py::a")) == skips.Skip("t.py::a", "no chromium")
    assert skips.skip_from_report(report("t.py::b", wasxfail="known bug")) is None
    assert skips.skip_from_report(report("t.py::c", skipped=False)) is None


@pytest.mark.parametrize(
    ("value", "on"), [(None, False), ("", False), ("0", False), ("false", False), ("true", True), ("1", True)]
)
def test_the_rule_holds_when_ci_is_set(value, on):
    assert skips.enforced({} if value is None else {"CI": value}) is on


def test_every_allowed_skip_needs_a_reason():
    skips.validate(ALLOWED)
    with pytest.raises(ValueError, match="tests/unit/b.py::test_x"):
        skips.validate({"tests/unit/b.py::test_x": " "})
