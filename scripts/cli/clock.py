"""A speculative run's round times, read in `on_commit`.

Why here: the statistics count and keep no clock (mtp/stats.py), yet generate.py, chat.py and the benchmark print
each round's seconds (`rounds[].seconds`) and the time spent in rounds that drafted nothing (`seconds_at_k0`).
The loops call `on_commit` once right after the prefill's first token and once per round, after the round's
verify and accept (in a batch: once per row still going). A clock read at each call therefore splits the run into
its rounds: round i runs from the previous call to its own.
"""

import time
from collections.abc import Callable

from mtp.stats import Round, SpecStats

OnCommit = Callable[[list[int], list[bool]], None]  # (the committed block, per token: proposed by the drafter?)


class RoundClock:
    """One row's clock: an `on_commit(tokens, from_drafter)` that reads `time.perf_counter()`, then hands the block
    on to the caller's `on_commit`, if any. A batch gives each row its own."""

    def __init__(self, on_commit: OnCommit | None = None) -> None:
        self.on_commit = on_commit
        self.times: list[float] = []  # (rounds + 1,): one read per call, the first token's first

    def __call__(self, tokens: list[int], from_drafter: list[bool]) -> None:
        # Read before the caller's callback: what it does (printing the text) counts in the next round.
        self.times.append(time.perf_counter())
        if self.on_commit is not None:
            self.on_commit(tokens, from_drafter)

    def round(self, round: Round) -> None:
        """The clock as a loop's `on_round`: the round's committed block and where each token came from."""
        self(round.block, round.from_drafter)

    def seconds(self) -> list[float]:
        """(rounds,): each round's wall time, from the previous call to its own."""
        return [now - before for before, now in zip(self.times, self.times[1:])]

    def at_zero(self, stats: SpecStats) -> float:
        """The seconds of the rounds that drafted nothing (K = 0: plain decode steps) in the run of `stats`."""
        return sum(s for r, s in zip(stats.rounds, self.seconds(), strict=True) if not r.drafted)
