"""The speculative engine: the textbook loop's rounds (mtp/speculative.py) for many rows at once, on the
ring cache, with media, chunked prefill, held cache prefixes and the device's reads batched, composed
from the drafter's and the target's own layers. Every row is held token-equal to the textbook loop's run
alone (tests/equivalence/test_engine.py).

- rows.py: `speculative_rows`, `speculative_one`; batch.py: `speculative_generate_batch`;
- drafts.py: the drafter's steps for many rows (`propose_rows`); accept.py: step 4 by a sampling rule."""

from mtp.engine.rows import speculative_one, speculative_rows

__all__ = ["speculative_one", "speculative_rows"]
