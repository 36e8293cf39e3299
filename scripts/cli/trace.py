"""--trace: every round of the textbook's speculative run as its numbered steps happen (mtp/README.md
§7), on stderr.

The textbook loop (mtp/speculative.py) reports each committed round (`Round`, mtp/stats.py) to its observers;
this is one, and prints what the round did: the budget left and the K chosen (step 1), the K drafts (2) and what
the drafter read to make them (the target's K/V of two layers, positions 0..n-1, the query position n), the verify
(3), the target's choice at each row it read (4), the tokens committed (5), the rollback and the verify row whose
hidden the next round starts from (6), and why the run goes on or stops (7). Tokens are shown as their ids and
their text."""

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from gemma4.config import FULL, SLIDING, TextConfig
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


def span(first: int, last: int) -> str:
    """Positions first..last as words: "nothing", "position 3" or "positions 3..7"."""
    if last < first:
        return "nothing"
    return f"position {first}" if first == last else f"positions {first}..{last}"


class Trace:
    """The observer --trace adds. `budget`: the new tokens the run may commit; `target`: the target's config
    (which layers the drafter reads); `window`: the drafter's sliding window W_d."""

    def __init__(self, piece: Callable[[int], str], say: Callable[[str], None], budget: int,
                 stop_ids: Sequence[int], target: TextConfig, window: int) -> None:
        self.piece = piece  # one token id -> its text
        self.say = say
        self.budget, self.stop_ids = budget, stop_ids
        self.sources = {kind: target.kv_source(kind) for kind in (SLIDING, FULL)}
        self.window = window
        self.rounds = 0
        self.committed = 0  # new tokens committed so far
        self.hidden_from = "the prefill's last row"  # where the next round's hidden h[n-1] comes from

    def show(self, tokens: list[int]) -> str:
        return " ".join(f"{t}:{self.piece(t)!r}" for t in tokens) or "-"

    def __call__(self, round: Round) -> None:
        n, k, a = round.position, len(round.drafted), round.matched
        if round.prefill:
            self.say(f"trace  0. prefill   positions 0..{n}; the target chooses {self.show(round.block)} at {n + 1}")
            self.committed = len(round.block)
            self.stop_or_go(round)
            return
        self.rounds += 1
        self.say(f"trace  round {self.rounds}: newest position {n}")
        room = self.budget - self.committed - 1
        self.say(f"trace  1. budget    {self.committed} of {self.budget} new tokens committed, room for {room} "
                 f"drafts: K={k}")
        drafted = self.show(round.drafted) if k else "nothing (K = 0: a plain decode step)"
        self.say(f"trace  2. draft     K={k}: {drafted}")
        if k:
            # The drafter's sliding layers see W_d + 1 positions back from its query (mtp/README.md §5).
            sliding = span(max(0, n - 1 - self.window), n - 1)
            self.say(f"trace     drafter   token at {n}, hidden h[{n - 1}] from {self.hidden_from}; reads the "
                     f"target's K/V of layer {self.sources[SLIDING]} (sliding, {sliding}) and layer "
                     f"{self.sources[FULL]} (full, {span(0, n - 1)}); query position {n} at all {k} steps")
        self.say(f"trace  3. verify    positions {n}..{n + k} in one target forward")
        self.say(f"trace  4. accept    target {self.show(round.targets)}: {a} of {k} drafts kept")
        where = f"{n + 1}..{n + len(round.block)}" if len(round.block) > 1 else f"{n + 1}"
        cut = " (cut after a stop id)" if len(round.block) < a + 1 else ""
        self.say(f"trace  5. commit    {self.show(round.block)} at {where}{cut}; the target adds "
                 f"{self.show(round.targets[-1:])}")
        stale = round.stale
        self.hidden_from = f"verify row {a} of round {self.rounds}"
        self.say(f"trace  6. roll back cache length {n + a + 1}; {span(stale.start, stale.stop - 1)} stale; "
                 f"the next hidden h[{n + a}] is verify row {a}")
        self.committed += len(round.block)
        self.stop_or_go(round)

    def stop_or_go(self, round: Round) -> None:
        """Step 7: the run stops after a committed stop id or once the budget is spent."""
        if round.block[-1] in self.stop_ids:
            why = f"stop      stop id {self.show(round.block[-1:])} committed"
        elif self.committed >= self.budget:
            why = f"stop      the budget is spent: {self.committed} of {self.budget} new tokens"
        else:
            why = f"go on     {self.committed} of {self.budget} new tokens, no stop id"
        self.say(f"trace  7. {why}")
