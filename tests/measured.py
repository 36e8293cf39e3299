"""What the run measured, printed by the terminal-summary hook of tests/conftest.py after the last test:
the parity errors of tests/tolerance.py and the speculative grid's acceptance rates. Tests only append
here; none reads another test's entries, so no test depends on the order the tests run in."""

from dataclasses import dataclass


@dataclass
class Parity:
    test: str  # what was compared, e.g. "target cached steps"
    case: str  # on which input, e.g. "moe"
    ours: float  # max |ours fp32 - float64 reference|
    theirs: float  # max |transformers fp32 - float64 reference|
    floor: float  # the fp32 floor of tests/tolerance.py; the bound is max(RATIO * theirs, floor)
    bound: float  # what `ours` was allowed
    float64: float  # max |ours float64 - transformers float64| / max |reference|


PARITY: list[Parity] = []
ACCEPTANCE: dict[tuple[str, str], list[float]] = {}  # (shape, drafter) -> acceptance rates over the grid


def export() -> dict:
    """This process's entries as plain data (an xdist worker sends them to the controlling process)."""
    return {"parity": [vars(p) for p in PARITY], "acceptance": [[s, d, v] for (s, d), v in ACCEPTANCE.items()]}


def merge(data: dict | None) -> None:
    """Add another process's `export`."""
    if data:
        PARITY.extend(Parity(**p) for p in data["parity"])
        for shape, drafter, rates in data["acceptance"]:
            ACCEPTANCE.setdefault((shape, drafter), []).extend(rates)


def summary() -> list[str]:
    """The worst case of each parity test (the one nearest its bound), then each test pair's mean
    acceptance rate."""
    lines = []
    if PARITY:
        worst: dict[str, Parity] = {}  # test -> its case nearest the bound, with the test's largest float64 gap
        for p in PARITY:
            w = worst.get(p.test)
            if w is None or p.ours / p.bound > w.ours / w.bound:
                worst[p.test] = Parity(**{**vars(p), "float64": max(p.float64, w.float64 if w else 0.0)})
            else:
                w.float64 = max(w.float64, p.float64)
        lines += ["fp32 parity, the case nearest its bound per test: max |fp32 - float64 reference| of ours and of",
                  "transformers, the floor and the bound on ours (tests/tolerance.py), the share of the bound used;",
                  "f64: max |ours float64 - transformers float64| / max |reference| over all the test's cases",
                  f"  {'test':<24}{'case':<22}{'ours':>9}{'tf':>9}{'ours/tf':>8}{'floor':>9}{'bound':>9}{'used':>6}"
                  f"{'f64':>9}"]
        for w in sorted(worst.values(), key=lambda w: w.test):
            lines.append(f"  {w.test:<24}{w.case:<22}{w.ours:>9.2e}{w.theirs:>9.2e}{w.ours / w.theirs:>8.2f}"
                         f"{w.floor:>9.2e}{w.bound:>9.2e}{w.ours / w.bound:>6.0%}{w.float64:>9.1e}")
    if ACCEPTANCE:
        rates = {f"{s}/{d}": f"{sum(v) / len(v):.2f}" for (s, d), v in sorted(ACCEPTANCE.items())}
        lines.append(f"mean acceptance over the speculative grid: {rates}")
    return lines
