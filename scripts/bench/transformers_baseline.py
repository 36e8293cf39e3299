"""`transformers` 5.22.2 as the speed baseline of scripts/benchmark.py: plain and assisted greedy `generate`.

- The models load as `from_pretrained` loads them by default (sdpa attention, float32): the baseline
  a user would get, not a tuned one. Files written in the requested dtype are memory-mapped, as ours.
- Every generation config is complete and replaces the model's own: `generate` fills each unset field
  from `model.generation_config`, whose eos ids would stop early and whose `do_sample` would sample.
- The attention mask is passed explicitly: without it, every prompt token equal to pad (0) is masked.
- Acceptance is counted by wrapping the candidate generator of this one call (nothing is patched
  globally). transformers' first iteration drafts nothing (the prefill commits the first token); every
  iteration is one target forward that commits its accepted drafts plus one token of its own.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gemma4.config_file import read_json


def load_transformers(target_dir: Path, assistant_dir: Path) -> tuple[Any, Any, str] | str:
    """(target, assistant, a line describing them) as transformers loads them, or why there are none."""
    try:
        import transformers
        from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM, Gemma4ForConditionalGeneration
    except ImportError as e:
        return f"not installed ({e})"
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    multimodal = read_json(target_dir / "config.json")["model_type"] == "gemma4"
    cls = Gemma4ForConditionalGeneration if multimodal else Gemma4ForCausalLM
    target = cls.from_pretrained(target_dir, dtype=torch.float32).eval()
    assistant = Gemma4AssistantForCausalLM.from_pretrained(assistant_dir, dtype=torch.float32).eval()
    attention = target.config._attn_implementation
    return target, assistant, f"{transformers.__version__}, {attention} attention (its default)"


def tf_generate(target: Any, assistant: Any | None, prompt: list[int], n: int, k: int
                ) -> tuple[list[int], float | None]:
    """n new tokens of greedy `generate`, assisted with k drafts per round if `assistant`; acceptance rate."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=0, bos_token_id=2)
    target.generation_config = config
    ids = torch.tensor([prompt])  # (1, T)
    if assistant is None:
        out = target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        return out[0, len(prompt):].tolist(), None
    assistant.generation_config = GenerationConfig(num_assistant_tokens=k, num_assistant_tokens_schedule="constant")
    drafted: list[int] = []  # drafts per iteration
    make_generator = target._get_candidate_generator

    def counting_factory(*args: Any, **kwargs: Any) -> Any:
        generator = make_generator(*args, **kwargs)
        get_candidates = generator.get_candidates

        def counting(input_ids: torch.Tensor, **kw: Any) -> Any:
            candidates, logits = get_candidates(input_ids, **kw)
            drafted.append(candidates.shape[1] - input_ids.shape[1])
            return candidates, logits

        generator.get_candidates = counting
        return generator

    target._get_candidate_generator = counting_factory  # on this instance only, removed below
    try:
        out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=assistant,
                              generation_config=config)
    finally:
        del target._get_candidate_generator
    tokens = out[0, len(prompt):].tolist()
    accepted = len(tokens) - len(drafted)  # each iteration: its accepted drafts + 1 token of the target's
    return tokens, accepted / max(1, sum(drafted))


def tf_decode_step(target: Any, prompt: list[int]) -> Callable[[], Any]:
    """The prompt prefilled into a new cache, and the cached 1-token forward that follows it, as every
    step of `generate` runs the model (without generate's own per-step work)."""
    ids = torch.tensor([prompt])  # (1, T)
    with torch.inference_mode():
        cache = target(ids, attention_mask=torch.ones_like(ids), use_cache=True).past_key_values
    mask = torch.ones(1, len(prompt) + 1, dtype=torch.long)
    return torch.inference_mode()(lambda: target(ids[:, -1:], past_key_values=cache, attention_mask=mask,
                                                 use_cache=True))
