"""The engine: what the textbook loops (gemma4/generate.py, mtp/speculative.py) leave out, composed from
the same layers. Many rows at their own positions, the ring cache, chunked prefill, media, held cache
prefixes and the device's reads in order. Every row is held token-equal to the textbook loop's run alone
(tests/equivalence/test_engine.py).

- ring.py: the ring cache (`RingCache`); forward.py: `forward_rows`, the forward of many rows;
- rows.py: a `Request` per prompt, one cache for all, the prefill in chunks, `choose`;
- decode.py: plain decoding (`decode`, `generate_one`); sampling.py: the sampling rule;
- media.py: soft embeddings in the prompt (images, audio, video frames)."""

from gemma4.engine.decode import Generated, decode, decode_rows, generate_one, requests
from gemma4.engine.ring import RingCache

__all__ = ["Generated", "RingCache", "decode", "decode_rows", "generate_one", "requests"]
