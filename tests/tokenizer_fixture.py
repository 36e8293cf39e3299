"""A tiny `tokenizer.json` shaped like Gemma 4's, for tests that go through text.

- The special tokens sit at their real ids (gemma4/README.md §18): `<pad>` 0, `<eos>` 1, `<bos>` 2,
  `<unk>` 3, the tool tokens 46-52, `<|think|>` 98, `<|channel>` 100, `<channel|>` 101, `<|turn>` 105,
  `<turn|>` 106. The other ids below 107 are `<unused…>` specials, as reserved slots are in the release.
- Like Gemma's, it is a BPE with byte fallback: spaces become `▁`, characters outside the small
  vocabulary are spelled as `<0xNN>` byte tokens, and the decoder fuses them back into UTF-8. So any
  id a random model emits decodes to something, and incomplete characters decode to U+FFFD.
- The vocabulary has exactly `vocab_size` entries (512, the test checkpoints' V).
"""

import string
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

SPECIALS = {
    0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>",
    46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>",
    51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>", 100: "<|channel>", 101: "<channel|>",
    105: "<|turn>", 106: "<turn|>",
}
FIRST_ORDINARY = 107


# With `media=True`, the image checkpoints' media ids (tests/checkpoints.py MEDIA_IDS, the vocabulary's last 7) are
# Gemma 4's media tokens, as in the release, rather than ordinary pieces that text could produce.
MEDIA = ["<|image>", "<|image|>", "<image|>", "<|video|>", "<|audio>", "<audio|>", "<|audio|>"]


def build_tokenizer(vocab_size: int = 512, media: bool = False) -> Tokenizer:
    specials = [SPECIALS.get(i, f"<unused{i}>") for i in range(FIRST_ORDINARY)]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    chars = ["▁", "\n"] + list(string.ascii_letters + string.digits + ".,!?'\"-:;()")
    pieces = specials + byte_tokens + chars
    # Fill the rest with merged pieces (so some tokens are longer than one character).
    merges: list[tuple[str, str]] = []
    candidates = [("▁", c) for c in string.ascii_lowercase] + [(a, b) for a in "etaoinshr" for b in "etaoinshr"]
    for left, right in candidates:
        if len(pieces) == vocab_size - (len(MEDIA) if media else 0):
            break
        merges.append((left, right))
        pieces.append(left + right)
    pieces += MEDIA if media else []
    if len(pieces) != vocab_size:
        raise ValueError(f"cannot fill a vocabulary of {vocab_size} with this scheme")
    vocab = {piece: i for i, piece in enumerate(pieces)}

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    # Already in the vocabulary: this keeps their ids and marks them special (matched in text whole,
    # dropped by decode(skip_special_tokens=True)).
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials + (MEDIA if media else [])])
    return tok


def write_tokenizer(model_dir: str | Path, vocab_size: int = 512, media: bool = False) -> Path:
    """Write `tokenizer.json` into `model_dir` and return its path."""
    path = Path(model_dir) / "tokenizer.json"
    build_tokenizer(vocab_size, media).save(str(path))
    return path
