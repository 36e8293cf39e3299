"""Tokenizer, the Gemma 4 chat template (written by token ids) and stop ids (gemma4/README.md §18).

- `tokenizer.json` is read with the `tokenizers` library; no other tokenizer code runs.
- One rendering for a single prompt and for a conversation: `render` writes every turn by the
  template's rules, and `encode_chat` is the conversation of one user turn.
  `<bos>`, then (only with a system text or thinking on) `<|turn>system\\n[<|think|>\\n]{system}<turn|>\\n`,
  then every turn as `<|turn>{user|model}\\n{text}<turn|>\\n`, then the generation prompt `<|turn>model\\n`.
  A user turn's images come first, one boi id each, right after `user\\n` (the template writes an image item as
  `<|image|>`, which the processor expands to boi, soft tokens, eoi; gemma4/README.md §19), then its audio clips,
  one boa id each (an audio item is `<|audio|>`: boa, soft tokens, eoa; §20). A video, between them, is one
  video id (`<|video|>`), which gemma4/vision/video.py expands into its timed frames.
  User and system texts are trimmed; an earlier model turn loses every `<|channel>…<channel|>` span
  (its thought: `strip_thought`) and is then trimmed.
- Typed text stays text: user and system texts are tokenized with special-token parsing off, so a
  typed `<turn|>` is spelled in ordinary tokens and cannot close a turn; the control tokens are put in
  by id. transformers' `apply_chat_template` renders one string and then parses it, which lets typed
  control strings through: a deliberate difference. Model turns keep their control tokens (they are
  the model's own), so they are parsed, as the template does.
- The template writes `<bos>` itself, so nothing else adds one.
- Text must be valid UTF-8: bytes that did not decode reach Python code as lone surrogates (argv and stdin
  keep them with surrogateescape), which no token spells, so `check_text` refuses them with a PromptError (a
  ValueError that the scripts print as one line) before `tokenizers` would raise a TypeError.
- The instruction-tuned targets stop on any of `generation_config.json`'s `eos_token_id`
  ([1, 106, 50]: `<eos>`, `<turn|>`, `<|tool_response>`).
- 12B, 26B-A4B and 31B append an empty, closed thought block to the generation prompt when thinking is
  off; E2B and E4B do not. `needs_empty_thought` reads it from the checkpoint's chat template where there
  is one, else from the family table below. Earlier model turns never carry it.
"""

import re
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from gemma4.config import ConfigError, TextConfig
from gemma4.config_file import read_json

BOS_ID, THINK_ID, CHANNEL_START_ID, CHANNEL_END_ID, TURN_START_ID, TURN_END_ID = 2, 98, 100, 101, 105, 106
BOI_ID = 255_999  # <|image>: opens an image (the releases' boi_token_id)
BOA_ID = 256_000  # <|audio>: opens an audio clip (the releases' boa_token_id)
VIDEO_ID = 258_884  # <|video|>: marks a video's place (the releases' video_token_id; gemma4/vision/video.py)
CHANNEL_START, CHANNEL_END = "<|channel>", "<channel|>"
ROLES = ("user", "model")


@dataclass(frozen=True)
class Message:
    role: str  # "user" or "model" (the template's word for the assistant)
    text: str  # as typed, or as the model wrote it (thought included: rendering drops it)
    images: int = 0  # a user turn's images, each written as one boi id before the text (§19 expands them)
    clips: int = 0  # its audio clips, each one boa id after the images and videos (§20 expands them)
    videos: int = 0  # its videos, each one video id after the images (§19 expands each into timed frames)


def check_text(text: str) -> None:
    """Refuse text that is not valid UTF-8: lone surrogates, the form in which Python keeps bytes that did not
    decode (U+DC80..U+DCFF for the bytes 0x80..0xFF, from argv or stdin), or ones written as escapes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        from gemma4.generate import PromptError  # here, not at the top: importing the tokenizer loads no torch
        code = ord(text[e.start])
        what = (f"the byte 0x{code - 0xDC00:02X}, which is not UTF-8 (Python holds it as the lone surrogate "
                f"U+{code:04X})" if 0xDC80 <= code <= 0xDCFF else f"the lone surrogate U+{code:04X}")
        raise PromptError(f"the text is not valid UTF-8: character {e.start + 1} is {what}: give the text in UTF-8 "
                          f"(convert it first, e.g. iconv -f LATIN1 -t UTF-8)") from None


def strip_thought(text: str) -> str:
    """Drop every `<|channel>…<channel|>` span (an unclosed one runs to the end), then trim: the
    template's rule for earlier model turns."""
    kept = [part.split(CHANNEL_START)[0] for part in text.split(CHANNEL_END)]
    return "".join(kept).strip()


# The generation prompt's empty thought block as a template spells it: its newline written as an escape
# inside a Jinja string literal, or as a real one.
EMPTY_THOUGHT = re.compile(r"<\|channel>thought(\\n|\n)<channel\|>")


def chat_template(model_dir: Path) -> str | None:
    """The checkpoint's chat template text: `chat_template.jinja`, else `tokenizer_config.json`'s
    "chat_template" (a string, or named templates of which "default" is the chat one); None without one."""
    file = Path(model_dir) / "chat_template.jinja"
    if file.is_file():
        return file.read_text(encoding="utf-8")
    config = Path(model_dir) / "tokenizer_config.json"
    template = read_json(config).get("chat_template") if config.is_file() else None
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def needs_empty_thought(config: TextConfig, template: str | None = None) -> bool:
    """Whether the generation prompt ends in `<|channel>thought\\n<channel|>` when thinking is off.

    The checkpoint's template says so where there is one (it writes the block or it does not). Without
    one, the family table: the families without Per-Layer Embeddings (12B, 26B-A4B, 31B) write it, the
    two with them (E2B, E4B) do not."""
    if template is not None:
        return EMPTY_THOUGHT.search(template) is not None
    return not config.ple_dim


class Gemma4Tokenizer:
    def __init__(self, tokenizer_file: Path) -> None:
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as e:  # tokenizers raises a bare Exception for unreadable files
            raise ConfigError(f"{tokenizer_file} is not a readable tokenizer.json ({e})") from None
        self.chat_template = chat_template(Path(tokenizer_file).parent)  # None: the file has none beside it

    def encode(self, text: str) -> list[int]:
        """Exact ids of `text`; special tokens written in the text are recognised, nothing is added. PromptError
        (a ValueError) for text that is not valid UTF-8."""
        check_text(text)
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_text(self, text: str) -> list[int]:
        """Ids of `text` as plain text: a special token's spelling becomes ordinary tokens. PromptError (a
        ValueError) for text that is not valid UTF-8."""
        check_text(text)
        # `tokenizers` matches added tokens whatever add_special_tokens says; this switch (the one
        # transformers' split_special_tokens sets) turns that off, for this call only.
        self.tokenizer.encode_special_tokens = True
        try:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        finally:
            self.tokenizer.encode_special_tokens = False

    def render(self, messages: list[Message], system: str | None = None, think: bool = False,
               empty_thought: bool = False, boi: int = BOI_ID, boa: int = BOA_ID, video: int = VIDEO_ID) -> list[int]:
        """The conversation's ids, ending with the generation prompt for the next model turn; `boi`, `boa`, `video`:
        the ids that mark each image's, clip's and video's place (config.json's boi_token_id, boa_token_id and
        video_token_id)."""
        # Each run of text between two control tokens is tokenized whole, as the tokenizer splits a
        # rendered string at its special tokens: `user\n` and the text form one run.
        for text in [system or "", *(m.text for m in messages)]:  # each text whole: its own character positions
            check_text(text)
        newline = self.encode_text("\n")
        ids = [BOS_ID]
        if think or system is not None:
            ids.append(TURN_START_ID)
            if think:  # runs: `system\n` | <|think|> | `\n{system}`
                ids += self.encode_text("system\n") + [THINK_ID] + self.encode_text("\n" + (system or "").strip())
            else:
                ids += self.encode_text("system\n" + system.strip())
            ids += [TURN_END_ID] + newline
        for m in messages:
            if m.role not in ROLES:
                raise ValueError(f"a message's role is 'user' or 'model', got {m.role!r}")
            if m.role == "user" and (m.images or m.videos or m.clips):  # the media items first, one id each
                media = [boi] * m.images + [video] * m.videos + [boa] * m.clips
                body = self.encode_text("user\n") + media + self.encode_text(m.text.strip())
            elif m.role == "user":
                body = self.encode_text(f"user\n{m.text.strip()}")
            else:  # the model's own control tokens are real ones
                body = self.encode(f"model\n{strip_thought(m.text)}")
            ids += [TURN_START_ID] + body + [TURN_END_ID] + newline
        ids += [TURN_START_ID] + self.encode_text("model\n")
        if empty_thought and not think:
            ids += [CHANNEL_START_ID] + self.encode_text("thought\n") + [CHANNEL_END_ID]
        return ids

    def encode_chat(self, user_text: str, empty_thought: bool = False, images: int = 0, boi: int = BOI_ID,
                    clips: int = 0, boa: int = BOA_ID) -> list[int]:
        """One user turn, thinking off: the conversation of that turn alone (its images, then its clips, first)."""
        return self.render([Message("user", user_text, images, clips)], empty_thought=empty_thought, boi=boi, boa=boa)

    def encode_raw(self, text: str) -> list[int]:
        """The text as it is, after exactly one BOS (special tokens written in it are recognised:
        raw text is how a caller writes a template of its own)."""
        return [BOS_ID] + self.encode(text)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def stop_ids(model_dir: Path) -> list[int]:
    """`eos_token_id` of generation_config.json, else of config.json (an int or a list)."""
    for name in ("generation_config.json", "config.json"):
        file = Path(model_dir) / name
        if file.is_file():
            raw = read_json(file)
            eos = raw.get("eos_token_id", raw.get("text_config", {}).get("eos_token_id"))
            if eos is not None:
                return [eos] if isinstance(eos, int) else list(eos)
    return [1]  # <eos>
