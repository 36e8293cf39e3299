"""The chat template of spec gemma4.md §5, exactly one BOS, and the stop ids."""

import json
from pathlib import Path

from gemma4.tokenizer import BOS_ID, Gemma4Tokenizer, chat_prompt, stop_ids
from tests.tokenizer_fixture import write_tokenizer


def test_chat_template_text() -> None:
    assert chat_prompt("  Hi there \n") == "<bos><|turn>user\nHi there<turn|>\n<|turn>model\n"
    assert chat_prompt("Hi", empty_thought=True).endswith("<|turn>model\n<|channel>thought\n<channel|>")
    assert chat_prompt("Hi", system="Be brief.").startswith("<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\n")


def test_exactly_one_bos(tmp_path: Path) -> None:
    tok = Gemma4Tokenizer(write_tokenizer(tmp_path))
    chat = tok.encode_chat("hello")
    assert chat[0] == BOS_ID and chat.count(BOS_ID) == 1
    assert chat[1] == 105 and chat[-1] == tok.encode("\n")[-1]  # <|turn> is one id; ends "model\n"
    assert chat.count(105) == 2 and chat.count(106) == 1
    raw = tok.encode_raw("hello")
    assert raw[0] == BOS_ID and raw.count(BOS_ID) == 1 and raw[1:] == tok.encode("hello")
    assert tok.decode(chat, skip_special_tokens=True).strip().startswith("user")


def test_stop_ids(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": {"eos_token_id": [1, 106]}}))
    assert stop_ids(tmp_path) == [1, 106]  # config.json's, when there is no generation_config.json
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 106, 50]}))
    assert stop_ids(tmp_path) == [1, 106, 50]  # the IT releases' generation_config.json wins
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}))
    assert stop_ids(tmp_path) == [1]
