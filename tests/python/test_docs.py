"""docs/python.md is a walk-through whose every >>> line runs: the page cannot drift from the
module (outputs are float64 results to 3 decimals, shapes and booleans, the same on every
SIMD target)."""

import doctest
import pathlib

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def test_python_md_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the page names files relative to where it runs
    result = doctest.testfile(str(PAGE), module_relative=False, report=True,
                              optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 40, f"only {result.attempted} examples found in {PAGE}"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"
