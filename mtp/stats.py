"""What a speculative run did: per-round drafts and acceptance, and the run's result. The statistics count; they
keep no clock: whoever wants a round's wall time reads one in `on_commit`, which sees every round's block."""

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Round:
    drafted: list[int]  # d_1..d_K as proposed; empty in a round that drafted nothing (K = 0: a plain step)
    accepted: int  # a: the length of the matching prefix (before any stop-id cut)


@dataclass
class SpecStats:
    target_forwards: int = 0  # prefill and verifications
    drafted: int = 0  # drafts proposed
    accepted: int = 0  # drafts committed (only tokens actually emitted)
    emitted: int = 0  # new tokens committed
    rounds: list[Round] = field(default_factory=list)
    drafted_at: list[int] = field(default_factory=list)  # [i]: rounds that drafted an i+1-th token
    accepted_at: list[int] = field(default_factory=list)  # [i]: rounds whose i+1-th draft was committed

    def record(self, drafts: list[int], a: int, block: list[int]) -> None:
        """One round (a verify): drafts d_1..d_K, a of them matched, `block` committed (cut after a stop id)."""
        committed_drafts = min(a, len(block))  # drafts after a stop id are not emitted
        self.target_forwards += 1
        self.emitted += len(block)
        self.rounds.append(Round(drafts, a))
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
