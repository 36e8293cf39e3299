"""What a speculative run did: each round as the loop reports it, the statistics of its rounds, and
the run's result. The statistics count; they keep no clock: whoever wants a round's wall time reads
one as each round is reported."""

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Round:
    """One target forward and what it committed: the prefill, or a verify of the drafts d_1..d_K."""
    position: int  # the newest committed position before it (the prefill: the prompt's last)
    drafted: list[int]  # d_1..d_K as proposed; empty at the prefill and at K = 0 (a plain step)
    # g_0..g_a: the target's token at verify rows 0..a; d_i == g_(i-1) for i <= a
    targets: list[int]
    block: list[int]  # committed after `position`: d_1..d_a and g_a, cut after a stop id
    prefill: bool = False

    @property
    def matched(self) -> int:
        """a: how many drafts matched the target's tokens, before any stop-id cut (the committed
        ones, after it, are `sum(from_drafter)`)."""
        return len(self.targets) - 1

    @property
    def from_drafter(self) -> list[bool]:
        """For each committed token: was it a draft the target kept?"""
        return [j < self.matched for j in range(len(self.block))]

    @property
    def stale(self) -> range:
        """The positions whose K/V the verify wrote for drafts it did not keep: the rollback leaves
        them."""
        return range(self.position + self.matched + 1, self.position + len(self.drafted) + 1)


@dataclass
class SpecStats:
    target_forwards: int = 0  # prefill and verifications
    drafted: int = 0  # drafts proposed
    accepted: int = 0  # drafts committed, after any stop-id cut (only tokens actually emitted)
    emitted: int = 0  # new tokens committed
    rounds: list[Round] = field(default_factory=list)  # every verify, K = 0 included

    def record(self, round: Round) -> None:
        """One target forward: the prefill, or a verify."""
        self.target_forwards += 1
        self.emitted += len(round.block)
        if not round.prefill:
            self.rounds.append(round)
            self.drafted += len(round.drafted)
            # Drafts after a stop id are not emitted.
            self.accepted += sum(round.from_drafter)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.emitted / self.target_forwards if self.target_forwards else 0.0

    @property
    def drafted_at(self) -> list[int]:
        """[i]: the rounds that drafted an (i+1)-th token."""
        longest = max((len(r.drafted) for r in self.rounds), default=0)
        return [sum(len(r.drafted) > i for r in self.rounds) for i in range(longest)]

    @property
    def accepted_at(self) -> list[int]:
        """[i]: the rounds whose (i+1)-th draft was committed."""
        kept = [sum(r.from_drafter) for r in self.rounds]
        return [sum(k > i for k in kept) for i in range(len(self.drafted_at))]

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def k_histogram(self) -> dict[int, int]:
        """K -> the rounds that drafted K tokens, K = 0 included."""
        return dict(sorted(Counter(len(r.drafted) for r in self.rounds).items()))


@dataclass
class SpecResult:
    tokens: list[int]
    stats: SpecStats
    finish_reason: str  # "stop" or "length"


def result_of(rounds: Iterable[Round], stop_ids: Sequence[int]) -> SpecResult:
    """A finished run's result from its rounds: the tokens they committed, their statistics, and why
    it ended ("stop" after a stop id, else "length": the budget or the context)."""
    stats, tokens = SpecStats(), []
    for round in rounds:
        stats.record(round)
        tokens += round.block
    return SpecResult(tokens, stats, "stop" if tokens[-1] in stop_ids else "length")
