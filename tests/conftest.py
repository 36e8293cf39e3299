"""Test-wide settings. The test models are tiny: one thread runs them as fast as two, and on a
2-core machine a second thread per process only fights the other processes for the cores.
After the run, the terminal summary prints what the tests measured (tests/measured.py)."""

import pytest
import torch

from tests.measured import summary
from tests.pairs import build_pairs

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 (see tests/pairs.py)
    """(shape, drafter kind) -> (target, drafter): built once, shared by the equivalence suites."""
    return build_pairs(tmp_path_factory.mktemp("pairs"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = summary()
    if lines:
        terminalreporter.section("measured")
        for line in lines:
            terminalreporter.write_line(line)
