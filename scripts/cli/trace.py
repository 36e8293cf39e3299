"""--trace: every round of a speculative run as its numbered steps happen (mtp/README.md §7), on stderr.

The loop reports each committed round (`Round`, mtp/stats.py) to one observer, the one that serves streaming; this
is such an observer, and prints what the round did: the K drafts (step 2), the target's choice at each verify row
it read (4), how many drafts it kept, the token the target adds (5), and the positions the rollback leaves stale
(6). Tokens are shown as their ids and their text."""

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from mtp.stats import Round

if TYPE_CHECKING:
    from gemma4.tokenizer import Gemma4Tokenizer


def each(observers: list[Callable[[Round], None]]) -> Callable[[Round], None]:
    """One observer that shows a round to every one of `observers`, in order (the engine's `on_round`)."""
    def see(round: Round) -> None:
        for observer in observers:
            observer(round)
    return see


def observed(rounds: Iterable[Round], observers: list[Callable[[Round], None]]) -> Iterator[Round]:
    """The rounds of the textbook loop, each shown to every observer as it comes."""
    see = each(observers)
    for round in rounds:
        see(round)
        yield round


def piece(tokenizer: "Gemma4Tokenizer | None") -> Callable[[int], str]:
    """A token id -> its text (without a tokenizer, its id)."""
    if tokenizer is None:
        return str
    return lambda token: tokenizer.decode([token])


class Trace:
    def __init__(self, piece: Callable[[int], str], say: Callable[[str], None]) -> None:
        self.piece = piece  # one token id -> its text
        self.say = say
        self.rounds = 0

    def show(self, tokens: list[int]) -> str:
        return " ".join(f"{t}:{self.piece(t)!r}" for t in tokens) or "-"

    def __call__(self, round: Round) -> None:
        n, k, a = round.position, len(round.drafted), round.matched
        if round.prefill:
            self.say(f"trace  0. prefill   positions 0..{n}; the target chooses {self.show(round.block)} at {n + 1}")
            return
        self.rounds += 1
        self.say(f"trace  round {self.rounds}: newest position {n}")
        drafted = self.show(round.drafted) if k else "nothing (K = 0: a plain decode step)"
        self.say(f"trace  2. draft     K={k}: {drafted}")
        self.say(f"trace  3. verify    positions {n}..{n + k} in one target forward")
        self.say(f"trace  4. accept    target {self.show(round.targets)}: {a} of {k} drafts kept")
        where = f"{n + 1}..{n + len(round.block)}" if len(round.block) > 1 else f"{n + 1}"
        cut = " (cut after a stop id)" if len(round.block) < a + 1 else ""
        self.say(f"trace  5. commit    {self.show(round.block)} at {where}{cut}; the target adds "
                 f"{self.show(round.targets[-1:])}")
        stale = round.stale
        left = (f"positions {stale.start}..{stale.stop - 1}" if len(stale) > 1 else f"position {stale.start}"
                if stale else "nothing")
        self.say(f"trace  6. roll back cache length {n + a + 1}; {left} stale")
