"""What a speculative run did: each round as the loop reports it, the statistics of the rounds, and the run's
result. The statistics count; they keep no clock: whoever wants a round's wall time reads one as each round is
reported."""

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Round:
    """One target forward and what it committed: the prefill, or a verify of the drafts d_1..d_K."""
    position: int  # n: the newest committed position before it (the prefill: the prompt's last)
    drafted: list[int]  # d_1..d_K as proposed; empty at the prefill and at K = 0 (a plain step)
    targets: list[int]  # g_0..g_a: the target's token at verify rows 0..a; d_i == g_(i-1) for i <= a
    block: list[int]  # committed at n+1..: d_1..d_a and g_a, the target's own, cut after a stop id
    prefill: bool = False

    @property
    def accepted(self) -> int:
        """a: the length of the matching prefix (before any stop-id cut)."""
        return len(self.targets) - 1

    @property
    def from_drafter(self) -> list[bool]:
        """For each committed token: did the drafter propose it (and the target keep it)?"""
        return [j < min(self.accepted, len(self.block)) for j in range(len(self.block))]

    @property
    def stale(self) -> range:
        """The positions the verify wrote K/V at that hold no committed token: the rollback leaves them stale."""
        return range(self.position + self.accepted + 1, self.position + len(self.drafted) + 1)


@dataclass
class SpecStats:
    target_forwards: int = 0  # prefill and verifications
    drafted: int = 0  # drafts proposed
    accepted: int = 0  # drafts committed (only tokens actually emitted)
    emitted: int = 0  # new tokens committed
    rounds: list[Round] = field(default_factory=list)
    drafted_at: list[int] = field(default_factory=list)  # [i]: rounds that drafted an i+1-th token
    accepted_at: list[int] = field(default_factory=list)  # [i]: rounds whose i+1-th draft was committed

    def record(self, round: Round) -> None:
        """One target forward: the prefill, or a verify whose a drafts matched."""
        drafts, block = round.drafted, round.block
        committed_drafts = sum(round.from_drafter)  # drafts after a stop id are not emitted
        self.target_forwards += 1
        self.emitted += len(block)
        if round.prefill:
            return
        self.rounds.append(round)
        self.drafted += len(drafts)
        self.accepted += committed_drafts
        missing = [0] * (len(drafts) - len(self.drafted_at))  # a round longer than every one before
        self.drafted_at, self.accepted_at = self.drafted_at + missing, self.accepted_at + missing
        for i in range(len(drafts)):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < committed_drafts

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.emitted / self.target_forwards if self.target_forwards else 0.0

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
    """A finished run's result from its rounds: the tokens they committed, their statistics, and why it ended
    ("stop" after a stop id, else "length": the budget or the context)."""
    stats, tokens = SpecStats(), []
    for round in rounds:
        stats.record(round)
        tokens += round.block
    return SpecResult(tokens, stats, "stop" if tokens[-1] in stop_ids else "length")
