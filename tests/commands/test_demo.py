"""The bundled demo pair (`scripts/demo/`) and the scripts that trained it.

- The demo target is a real Gemma 4 architecture (sliding and full layers, KV sharing, PLE) and its
  assistant a real MTP drafter with a centroid head; both load through the ordinary loaders.
- Speculative output equals plain greedy output (float32), and the drafter is actually good: a
  wiring error (wrong hidden, wrong KV, wrong position) drops the acceptance rate to about 0.
- `train_target.py` and `train_drafter.py` run end to end on a tiny model in a few seconds.
"""

from pathlib import Path

import pytest
import torch

from gemma4 import greedy_generate, load_target
from gemma4.config import FULL, SLIDING
from gemma4.tokenizer import Gemma4Tokenizer, stop_ids
from mtp import DraftLength, check_pair, load_drafter, speculative_generate

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "scripts" / "demo"

PROMPTS = [
    "def ",
    "import os\nimport sys\n\n\ndef main():\n",
    '    def __repr__(self):\n        return "',
    "class Error(Exception):\n    \"\"\"",
]
FIXED_PROMPT = '    def __repr__(self):\n        return "'  # acceptance 0.94 at K=4 when the pair was made


def test_default_prompt_does_not_loop(demo):
    """generate.py's default prompt for a model without a chat template: the demo's greedy 128 tokens
    repeat no line more than twice (other prompts fall into `self.get_name = self.get_name` loops), and most drafts land."""
    from generate import CODE_PROMPT

    target, drafter, tok = demo
    spec = speculative_generate(target, drafter, tok.encode_raw(CODE_PROMPT), 128, DraftLength(4),
                                stop_ids(DEMO / "target"))
    lines = [line.strip() for line in tok.decode(spec.tokens, skip_special_tokens=True).splitlines() if line.strip()]
    assert len(spec.tokens) == 128 and len(lines) >= 8
    assert max(lines.count(line) for line in lines) <= 2, lines  # a docstring's quotes may close once
    assert spec.stats.acceptance_rate > 0.5


@pytest.fixture(scope="module")
def demo():
    """The bundled demo pair, loaded, and its tokenizer."""
    target = load_target(DEMO / "target")
    drafter = load_drafter(DEMO / "assistant")
    return target, drafter, Gemma4Tokenizer(DEMO / "target" / "tokenizer.json")


def test_demo_pair_is_a_gemma4_pair(demo):
    target, drafter, _ = demo
    c = target.config
    check_pair(c, drafter.config, "demo target", "demo assistant")
    assert set(c.layer_types) == {SLIDING, FULL} and c.layer_types[-1] == FULL
    assert c.num_kv_shared_layers > 0 and c.ple_dim > 0 and c.final_logit_softcapping == 30.0
    assert drafter.config.use_ordered_embeddings and drafter.config.text.num_layers == 4
    files = sum(p.stat().st_size for p in DEMO.rglob("*") if p.is_file())
    assert files < 25e6


def test_demo_tokenizer_has_the_gemma4_special_tokens(demo):
    _, _, tok = demo
    assert tok.encode("<bos><|turn>user\n")[:2] == [2, 105]
    assert tok.encode("<turn|><eos><pad>") == [106, 1, 0]
    text = "def f(x):\n    return x + 1\n"
    assert tok.decode(tok.encode(text)) == text
    assert stop_ids(DEMO / "target") == [1, 106, 50]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_demo_speculative_equals_plain_greedy(demo, prompt):
    target, drafter, tok = demo
    ids = tok.encode_raw(prompt)
    plain = greedy_generate(target, ids, 40)
    spec = speculative_generate(target, drafter, ids, 40, DraftLength(4)).tokens
    assert spec == plain


def test_demo_drafter_is_accepted(demo):
    target, drafter, tok = demo
    stats = speculative_generate(target, drafter, tok.encode_raw(FIXED_PROMPT), 64, DraftLength(4)).stats
    assert stats.acceptance_rate > 0.5, stats.acceptance_rate
    assert stats.tokens_per_forward > 2.0


def test_training_scripts_run_on_a_tiny_model(tmp_path):
    import train_drafter
    import train_target

    tiny = dict(steps=2, batch=2, seq_len=32, lr=1e-3, vocab_size=512, layers=10, hidden=16, intermediate=32,
                heads=2, head_dim=8, window=8, ple_dim=4, context=128, seed=0, max_files=4, minutes=None,
                dtype=torch.float32, threads=1)
    train_target.main(out=tmp_path / "target", **tiny)
    train_drafter.main(target_dir=tmp_path / "target", out=tmp_path / "assistant", corpus=None, steps=2, batch=2,
                       prompt_len=16, generate=4, gen_batches=2, draft_steps=3, lr=1e-3, hidden=16, intermediate=32,
                       heads=2, num_centroids=8, top_k=2, num_assistant_tokens=3, seed=0, max_files=4,
                       dtype=torch.float32, target_dtype=torch.float32, device="cpu", threads=1, eval_prompts=0)
    target = load_target(tmp_path / "target")
    drafter = load_drafter(tmp_path / "assistant")
    check_pair(target.config, drafter.config, "tiny target", "tiny assistant")
    prompt = [2, 300, 301, 302, 303]
    out = speculative_generate(target, drafter, prompt, 12, DraftLength(3)).tokens
    assert out == greedy_generate(target, prompt, 12)
