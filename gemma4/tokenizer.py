"""Tokenizer, Gemma 4 chat template and stop ids (spec gemma4.md §5).

- `tokenizer.json` is read with the `tokenizers` library; no other tokenizer code runs.
- The chat template writes `<bos>` itself, so the rendered text is encoded without adding another.
- The instruction-tuned targets stop on any of `generation_config.json`'s `eos_token_id`
  ([1, 106, 50]: `<eos>`, `<turn|>`, `<|tool_response>`).
- 26B-A4B and 31B append an empty, closed thought block to the model turn when thinking is off;
  E2B and E4B do not. Which applies is a property of the checkpoint, passed as `empty_thought`.
"""

from pathlib import Path

from tokenizers import Tokenizer

from gemma4.config import ConfigError, read_json

BOS_ID = 2
BOS, TURN_START, TURN_END = "<bos>", "<|turn>", "<turn|>"
EMPTY_THOUGHT = "<|channel>thought\n<channel|>"


def chat_prompt(user_text: str, system: str | None = None, empty_thought: bool = False) -> str:
    """One user turn, thinking off: `<bos><|turn>user\\n{text}<turn|>\\n<|turn>model\\n`."""
    text = BOS
    if system is not None:
        text += f"{TURN_START}system\n{system}{TURN_END}\n"
    text += f"{TURN_START}user\n{user_text.strip()}{TURN_END}\n{TURN_START}model\n"
    return text + (EMPTY_THOUGHT if empty_thought else "")


class Gemma4Tokenizer:
    def __init__(self, tokenizer_file: Path) -> None:
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as e:  # tokenizers raises a bare Exception for unreadable files
            raise ConfigError(f"{tokenizer_file} is not a readable tokenizer.json ({e})") from None

    def encode(self, text: str) -> list[int]:
        """Exact ids of `text`; special tokens written in the text are recognised, nothing is added."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_chat(self, user_text: str, empty_thought: bool = False) -> list[int]:
        return self.encode(chat_prompt(user_text, empty_thought=empty_thought))

    def encode_raw(self, text: str) -> list[int]:
        """The text as it is, after exactly one BOS."""
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
