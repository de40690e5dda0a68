"""pytest set-up for attn's Python tests: the largest error seen per (dtype, tensor),
printed at the end of the run (the figures docs/python.md quotes)."""

import pytest

MAX_ERRORS = {}


@pytest.fixture
def record_error():
    def record(what: str, err: float, bound_ratio: float) -> None:
        e, r = MAX_ERRORS.get(what, (0.0, 0.0))
        MAX_ERRORS[what] = (max(e, err), max(r, bound_ratio))
    return record


def pytest_terminal_summary(terminalreporter):
    if not MAX_ERRORS:
        return
    terminalreporter.section("attn vs PyTorch's maths: largest |error| (and error / bound)")
    for what in sorted(MAX_ERRORS):
        e, r = MAX_ERRORS[what]
        terminalreporter.write_line(f"{what:24s} {e:.3e}  ({r:.2f} of the bound)")
