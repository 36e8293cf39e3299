"""transformers' heuristic draft-length schedules (mtp/README.md §8): K + 2 after a round whose drafts were all
accepted, else max(1, K - 1). `Heuristic` carries K from one generate call to the next; `HeuristicTransient`
restarts from `initial` every call. Neither returns 0 unless the room is 0."""

from mtp.schedule import Constant


class Heuristic(Constant):
    """transformers' heuristic: K + 2 after a drafting round whose drafts were all kept, else max(1, K - 1).
    K carries from one generate call to the next. `next` is Constant's: the current K, within the room."""

    schedule = "heuristic"

    def observe(self, k: int, matched: int) -> None:
        super().observe(k, matched)
        if k > 0:  # a K = 0 round (no room) says nothing about the drafter
            self.k = self.k + 2 if matched == k else max(1, self.k - 1)


class HeuristicTransient(Heuristic):
    """The heuristic rule, restarted from `initial` at every generate call."""

    schedule = "heuristic_transient"

    def start_call(self) -> None:
        self.k = self.initial
