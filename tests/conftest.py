"""Test-wide settings and fixtures, one per concept. The test models are tiny: one thread runs them as fast as
two, and the suite runs in two processes (pytest-xdist's `-n 2`, README.md), one per core.

- `models`: the loaded pairs of the equivalence suites (tests/pairs.py), built once per process.
- `make_pair`: checkpoint files of a target and its assistant, written once per distinct set of arguments.
  Every test reads the same directories, so a test that edits a file edits a copy (shutil.copytree).
- `pair`: the files of the pair the commands run, shaped like a release (make_pair's `release=True`).
- `default_sigint`: Ctrl-C raises KeyboardInterrupt for the test, whatever the run inherited.
Plain helpers, not fixtures: `prompt` and `plain` (the memoised reference run) in tests/pairs.py.
After the run, the terminal summary prints what the tests measured (tests/measured.py), gathered from every
process.
"""

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.checkpoints import write_assistant, write_target
from tests.measured import export, merge, summary
from tests.pairs import build_pairs, shrink_branches
from tests.tokenizer_fixture import write_tokenizer

torch.set_num_threads(1)

MakePair = Callable[..., tuple[Path, Path]]


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 (see tests/pairs.py)
    """(shape, drafter kind) -> (target, drafter): built once, shared by the equivalence suites."""
    return build_pairs(tmp_path_factory.mktemp("pairs"))


@pytest.fixture(scope="session")
def make_pair(tmp_path_factory: pytest.TempPathFactory) -> MakePair:
    """make_pair(shape, ordered_embeddings=..., ...) -> (target dir, assistant dir), written on the first call
    with these arguments (tests/checkpoints.py `write_target`, `write_assistant`). branches != 1 scales the
    target's branches (tests/pairs.py `shrink_branches`); release=True adds what a release ships beside the
    weights: tokenizer.json and chat_template.jinja."""
    written: dict[tuple, tuple[Path, Path]] = {}

    def make(shape: str = "e2b", *, ordered_embeddings: bool, echo: bool = False, multimodal: bool = True,
             target_seed: int = 0, assistant_seed: int = 0, branches: float = 1.0,
             release: bool = False) -> tuple[Path, Path]:
        key = (shape, ordered_embeddings, echo, multimodal, target_seed, assistant_seed, branches, release)
        if key not in written:
            root = tmp_path_factory.mktemp(f"pair-{shape}")
            target = write_target(root / "target", shape, multimodal=multimodal, seed=target_seed)
            if branches != 1.0:
                shrink_branches(target, branches)  # the embeddings stay: the assistant below reads them
            if release:
                write_tokenizer(target)
                # The CLI renders Gemma 4's turns itself (gemma4/tokenizer.py): the file only has to be there.
                (target / "chat_template.jinja").write_text("{# Gemma 4's turns: rendered by gemma4/tokenizer.py #}\n")
            assistant = write_assistant(root / "assistant", target, ordered_embeddings=ordered_embeddings, echo=echo,
                                        seed=assistant_seed)
            written[key] = target, assistant
        return written[key]

    return make


@pytest.fixture(scope="session")
def pair(make_pair: MakePair) -> tuple[Path, Path]:
    """The E2B-like pair with a centroid head and the echo drafter (partly right), beside a release's files."""
    return make_pair("e2b", ordered_embeddings=True, echo=True, release=True)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a module's tests (`pytestmark = pytest.mark.usefixtures("one_thread")`): their tiny
    matmuls gain nothing from a second thread, and lose time to it on a shared two-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in this process, and in the scripts it starts, for one test.

    A process started with SIGINT ignored (a background job of a non-interactive shell: `pytest &` in a
    script) keeps it ignored: Python installs its KeyboardInterrupt handler only over the default action, and
    an ignored signal stays ignored across fork and exec. A real Ctrl-C then does nothing, in pytest and in
    the scripts its tests start. A handler installed here is reset to the default action by exec, so a script
    started during the test installs Python's handler again."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if before is not None:  # None: a handler installed outside Python, which Python cannot put back
        signal.signal(signal.SIGINT, before)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In an xdist worker: hand what its tests measured to the controlling process."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["measured"] = export()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001 (xdist's worker node)
    """In the controlling process: take in a finished worker's measurements."""
    merge(node.workeroutput.get("measured"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = summary()
    if lines:
        terminalreporter.section("measured")
        for line in lines:
            terminalreporter.write_line(line)
