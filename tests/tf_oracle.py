"""`transformers` (TF 5.22.2) as the parity oracle: thin helpers that tests call on tiny checkpoints.

Everything runs batch 1 on CPU, in float32 with eager attention, or as a float64 reference
(`dtype=torch.float64`, see `_float64_throughout`). Token ids go in and out as plain lists.
Speed: on a small, busy machine torch's default thread pool made TF's decode steps ~50x slower (a 16-token
assisted run: 32 s vs 0.4 s); tests should call torch.set_num_threads(1) (e.g. in conftest.py).

What TF's MTP generator (`SinglePositionMultiTokenCandidateGenerator.get_candidates`) feeds the drafter
in the FIRST drafting round, for a prompt of P tokens (positions 0..P-1). Checked with a forward
pre-hook on the assistant inside TF's generate on the test shapes; `tf_drafter_step` below feeds the
same and reproduces TF's first-round drafts exactly:
  - TF's first loop iteration drafts nothing: the target prefills the prompt and commits
    g0 = argmax(logits[P-1]) at position P. The next iteration is the first drafting round.
  - token:    g0, i.e. input_ids[-1]; embedded with the TARGET's scaled table: E[g0] * sqrt(H)
              (`target.get_input_embeddings()`, a Gemma4TextScaledWordEmbedding).
  - hidden:   the prefill's `hidden_states[-1][:, -1]` = the target's POST-final-norm hidden at
              position P-1 (TF ties hidden_states[-1] to last_hidden_state).
  - input:    inputs_embeds = concat(E[g0] * sqrt(H), hidden) -> [1, 1, 2H], embedding first.
  - position: position_ids = [[P]] (= len(input_ids) - 1), the same for every step of the round.
  - KV:       prefill `shared_kv_states` = {"sliding_attention": (K, V), "full_attention": (K, V)}, each
              [1, Hkv, P, d]: the K (post k_norm, post RoPE at its own position) and V (post v_norm) of the
              target's source layers (last non-shared layer of each type), sliced to [:P+1] = all P
              positions 0..P-1. The sliding tensor is NOT cut to the target's window: assisted decoding
              records the past, so the prefill returns every prompt position.
  - mask:     attention_mask = None (generate drops an all-ones mask); the drafter builds its own masks:
              the full layer sees all P keys, sliding layers the newest W_d+1 keys (P-1-W_d..P-1).
  - steps 2..K: token = argmax of the previous drafter logits (the masked vector when
              use_ordered_embeddings), hidden = the previous step's output `last_hidden_state`, which is
              post_projection(drafter final-normed hidden) -> [1, 1, H]; position and KV unchanged.
Later rounds use the last verify forward's KV sliced to [:len(input_ids)] (mtp/README.md §9 quirk), so only the
first round's drafts are comparable with a clean implementation.
"""

import inspect
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MethodType

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import (
    AutoConfig,
    GenerationConfig,
    Gemma4AssistantForCausalLM,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4UnifiedAssistantForCausalLM,
    Gemma4UnifiedForCausalLM,
    Gemma4UnifiedForConditionalGeneration,
    PreTrainedModel,
)
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.models.gemma4 import modeling_gemma4
from transformers.models.gemma4.modeling_gemma4 import (
    Gemma4AudioAttention, Gemma4RMSNorm, Gemma4TextRotaryEmbedding, Gemma4TextRouter, Gemma4VisionPooler,
)
from transformers.models.gemma4_unified.modeling_gemma4_unified import (
    Gemma4UnifiedRMSNorm, Gemma4UnifiedTextRotaryEmbedding,
)

# The class transformers loads a target or an assistant file with, by its model_type.
TARGET_CLASSES = {"gemma4": Gemma4ForConditionalGeneration, "gemma4_text": Gemma4ForCausalLM,
                  "gemma4_unified": Gemma4UnifiedForConditionalGeneration, "gemma4_unified_text": Gemma4UnifiedForCausalLM}
ASSISTANT_CLASSES = {"gemma4_assistant": Gemma4AssistantForCausalLM,
                     "gemma4_unified_assistant": Gemma4UnifiedAssistantForCausalLM}


def _ids(ids: list[int]) -> Tensor:
    return torch.tensor([ids], dtype=torch.long)  # (1, T)


def tf_target(path: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The target as TF loads it: the multimodal class for a multimodal model_type, else the bare text class."""
    config = AutoConfig.from_pretrained(path)
    cls = TARGET_CLASSES[config.model_type]
    # eager in float32: plain matmuls with an fp32 softmax, and the per-expert loop for MoE (TF would
    # otherwise pick sdpa and grouped_mm): the most literal reading of the formulas.
    attention: str | dict[str, str] = _attention(dtype)
    if attention != "eager" and getattr(config, "audio_config", None) is not None:
        # TF's audio tower (Gemma4AudioModel) refuses sdpa: eager there (computed in float64 by
        # `audio_attention_in_dtype`), sdpa everywhere else. Only audio checkpoints in float64 take this.
        attention = {"": attention, "text_config": attention, "vision_config": attention, "audio_config": "eager"}
    model = cls.from_pretrained(
        path, dtype=dtype, attn_implementation=attention, experts_implementation="eager"
    ).eval()
    return _float64_throughout(model) if dtype == torch.float64 else model


def tf_assistant(path: str | Path, dtype: torch.dtype = torch.float32) -> Gemma4AssistantForCausalLM:
    cls = ASSISTANT_CLASSES[AutoConfig.from_pretrained(path).model_type]  # the unified one subclasses the other
    model = cls.from_pretrained(path, dtype=dtype, attn_implementation=_attention(dtype))
    return _float64_throughout(model.eval()) if dtype == torch.float64 else model.eval()


# ---------------------------------------------------------------------------------------------
# The float64 reference
# ---------------------------------------------------------------------------------------------


def _attention(dtype: torch.dtype) -> str:
    # eager's softmax runs in fp32 whatever the dtype; sdpa keeps the query's dtype, float64 here.
    return "sdpa" if dtype == torch.float64 else "eager"


def _rms_norm_in_dtype(norm: Gemma4RMSNorm, x: Tensor) -> Tensor:
    """Gemma4RMSNorm.forward without its cast of x to fp32."""
    out = x * torch.pow(x.pow(2).mean(-1, keepdim=True) + norm.eps, -0.5)
    return out * norm.weight if norm.with_scale else out


def _router_in_dtype(router: Gemma4TextRouter, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Gemma4TextRouter.forward with its softmax in x's dtype, not fp32."""
    scores = router.proj(router.norm(x) * router.scale * router.scalar_root_size)  # (N, X)
    probs = torch.softmax(scores, dim=-1)
    weights, experts = torch.topk(probs, k=router.config.top_k_experts, dim=-1)  # (N, k) each
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return probs, weights * router.per_expert_scale[experts], experts


def _power_frequencies(rope: Gemma4TextRotaryEmbedding) -> None:
    """TF and we both compute RoPE's angles, cos and sin in fp32 whatever the model's dtype, but TF's
    frequencies are 1/θ^(2i/D) and ours θ^(-2i/D): 4 of the 24 test pairs differ in the last fp32 bit,
    which alone moves float64 logits by up to 1e-5. A float64 run takes θ^(-2i/D), so that comparing
    the two float64 runs sees the rest of the math exactly; the assertion limits the change to that
    one rounding. The float32 oracle keeps TF's own table."""
    for kind, params in rope.config.rope_parameters.items():
        tf_freqs = getattr(rope, f"{kind}_inv_freq")  # (D/2,) fp32, 0 past the rotated pairs ("proportional")
        d = 2 * tf_freqs.shape[0]
        power = params["rope_theta"] ** -(torch.arange(0, d, 2, dtype=torch.float32) / d)  # (D/2,)
        freqs = torch.where(tf_freqs != 0, power, 0.0)
        torch.testing.assert_close(freqs, tf_freqs, rtol=torch.finfo(torch.float32).eps, atol=0)
        setattr(rope, f"{kind}_inv_freq", freqs)


def _pool_in_dtype(pooler: Gemma4VisionPooler, hidden_states: torch.Tensor, pixel_position_ids: torch.Tensor,
                   padding_positions: torch.Tensor, output_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gemma4VisionPooler.forward with its mean and sqrt(W) scale in the input's dtype, not fp32 (its pooling
    branch: these tests always pool)."""
    h = hidden_states.masked_fill(padding_positions.unsqueeze(-1), 0.0)  # (B, N, W)
    k = int((h.shape[1] // output_length) ** 0.5)
    positions = pixel_position_ids.clamp(min=0)
    max_x = positions[..., 0].max(dim=-1, keepdim=True)[0] + 1
    blocks = torch.div(positions, k, rounding_mode="floor")
    blocks = blocks[..., 0] + (max_x // k) * blocks[..., 1]  # (B, N)
    weights = F.one_hot(blocks.long(), output_length).to(h.dtype) / k**2  # (B, N, M)
    return weights.transpose(1, 2) @ h * pooler.root_hidden_size, ~(weights == 0).all(dim=1)


def audio_attention_in_dtype(attention: Gemma4AudioAttention) -> None:
    """Gemma4AudioAttention.forward, TF's own source with its fp32 casts removed (q, k, v `.float()` and the
    softmax's dtype): without this a float64 audio tower fails (softplus(per_dim_scale) is float64, q fp32)."""
    source = textwrap.dedent(inspect.getsource(Gemma4AudioAttention.forward))
    assert source.count(".float()") == 3 and source.count("dtype=torch.float32") == 1, "transformers changed"
    namespace: dict = {}
    exec(source.replace(".float()", "").replace("dtype=torch.float32", "dtype=value_states.dtype"),  # noqa: S102
         vars(modeling_gemma4), namespace)
    attention.forward = MethodType(namespace["forward"], attention)


def _float64_throughout(model: PreTrainedModel) -> PreTrainedModel:
    """A float64 model computed in float64. TF runs three steps in fp32 whatever the model's dtype:
    every RMSNorm (`x.float()`), eager attention's softmax and the MoE router's softmax, which left
    the float64 test logits up to 7e-5 off. This replaces those forwards on the model's own modules
    (no class is patched) with the same formulas in the input's dtype (attention: sdpa, see
    `_attention`), and takes our RoPE frequencies (`_power_frequencies`). An audio tower's attention, eager
    with q, k, v cast to fp32, attends in the input's dtype (`audio_attention_in_dtype`)."""
    for module in model.modules():
        if isinstance(module, (Gemma4RMSNorm, Gemma4UnifiedRMSNorm)):
            module.forward = MethodType(_rms_norm_in_dtype, module)
        elif isinstance(module, Gemma4TextRouter):
            module.forward = MethodType(_router_in_dtype, module)
        elif isinstance(module, Gemma4VisionPooler):
            module.forward = MethodType(_pool_in_dtype, module)
        elif isinstance(module, (Gemma4TextRotaryEmbedding, Gemma4UnifiedTextRotaryEmbedding)):
            _power_frequencies(module)
        elif isinstance(module, Gemma4AudioAttention):
            audio_attention_in_dtype(module)
    return model


@torch.no_grad()
def tf_logits(model: PreTrainedModel, ids: list[int]) -> Tensor:
    """Softcapped logits of a cache-free forward over `ids`: [T, V] in the model's dtype."""
    return model(input_ids=_ids(ids), use_cache=False).logits[0]


@torch.no_grad()
def tf_cached_step_logits(model: PreTrainedModel, ids: list[int], n_prompt: int) -> Tensor:
    """Prefill ids[:n_prompt] in one forward, then feed ids[n_prompt:] one token per forward with TF's cache.

    Returns [len(ids) - n_prompt + 1, V]: row 0 is the prefill's last row (position n_prompt-1), row i the
    step that consumed ids[n_prompt-1+i]; comparable with tf_logits(model, ids)[n_prompt-1:].
    """
    out = model(input_ids=_ids(ids[:n_prompt]), use_cache=True)
    rows, cache = [out.logits[0, -1]], out.past_key_values
    for token in ids[n_prompt:]:
        out = model(input_ids=_ids([token]), past_key_values=cache, use_cache=True)
        rows.append(out.logits[0, -1])
        cache = out.past_key_values
    return torch.stack(rows)


def _greedy_config(max_new_tokens: int, stop_ids: list[int] | None) -> GenerationConfig:
    # TF fills every None field of the config passed to generate from model.generation_config, so
    # eos_token_id=None alone would NOT disable stopping: callers also swap this in as the model's config.
    return GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=stop_ids, pad_token_id=0, bos_token_id=2
    )


@contextmanager
def _generation_config(model: PreTrainedModel, config: GenerationConfig) -> Iterator[None]:
    """Temporarily replace model.generation_config (the source of TF's defaults) with `config`."""
    saved, model.generation_config = model.generation_config, config
    try:
        yield
    finally:
        model.generation_config = saved


@torch.no_grad()
def tf_greedy(
    model: PreTrainedModel, prompt_ids: list[int], max_new_tokens: int, stop_ids: list[int] | None = None
) -> list[int]:
    """New token ids from TF's cached greedy `generate`; with stop_ids None it never stops early."""
    config = _greedy_config(max_new_tokens, stop_ids)
    prompt = _ids(prompt_ids)
    with _generation_config(model, config):
        # attention_mask given explicitly: TF would otherwise mask every prompt token equal to pad (0).
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
    return out[0, len(prompt_ids):].tolist()


# ---------------------------------------------------------------------------------------------
# Assisted (MTP) generation
# ---------------------------------------------------------------------------------------------


@dataclass
class DraftRound:
    position: int  # t: position of the newest committed token when the round drafted (= drafter position)
    drafted: list[int]
    accepted: int  # leading drafts that ended up committed


@dataclass
class AssistedRun:
    tokens: list[int]  # new tokens
    rounds: list[DraftRound]  # one per drafting round; rounds[0].drafted is the first round's drafts


@torch.no_grad()
def tf_assisted_greedy(
    target: PreTrainedModel,
    assistant: Gemma4AssistantForCausalLM,
    prompt_ids: list[int],
    max_new_tokens: int,
    num_assistant_tokens: int,
    stop_ids: list[int] | None = None,
) -> AssistedRun:
    """TF assisted greedy generate with the MTP drafter, recording every round's drafts.

    TF drafts a constant num_assistant_tokens per round (capped by the length budget). Only rounds[0]
    uses the clean KV (mtp/README.md §9); later rounds show TF's quirk.
    """
    config = _greedy_config(max_new_tokens, stop_ids)
    assistant_config = GenerationConfig(num_assistant_tokens=num_assistant_tokens)
    prompt = _ids(prompt_ids)
    drafts: list[tuple[int, list[int]]] = []

    # Instance-level wrap (no class patching): TF builds the candidate generator inside generate, so wrap
    # the factory and then the generator's get_candidates to see each round's candidates.
    make_generator = target._get_candidate_generator

    def recording_factory(*args: object, **kwargs: object) -> CandidateGenerator:
        generator = make_generator(*args, **kwargs)
        get_candidates = generator.get_candidates

        def recording_get_candidates(input_ids: Tensor, **kw: object) -> tuple[Tensor, Tensor | None]:
            candidates, logits = get_candidates(input_ids, **kw)
            drafted = candidates[0, input_ids.shape[1]:].tolist()
            if drafted:
                drafts.append((input_ids.shape[1] - 1, drafted))
            return candidates, logits

        generator.get_candidates = recording_get_candidates
        return generator

    target._get_candidate_generator = recording_factory
    try:
        with _generation_config(target, config), _generation_config(assistant, assistant_config):
            out = target.generate(
                prompt, attention_mask=torch.ones_like(prompt), assistant_model=assistant, generation_config=config
            )
    finally:
        del target._get_candidate_generator  # back to the class method

    sequence = out[0].tolist()
    rounds = []
    for position, drafted in drafts:
        committed = sequence[position + 1 : position + 1 + len(drafted)]
        accepted = 0
        while accepted < len(committed) and committed[accepted] == drafted[accepted]:
            accepted += 1
        rounds.append(DraftRound(position, drafted, accepted))
    return AssistedRun(sequence[len(prompt_ids):], rounds)


# ---------------------------------------------------------------------------------------------
# One drafter step, exactly as TF's generator runs it
# ---------------------------------------------------------------------------------------------


@dataclass
class TargetOutputs:
    logits: Tensor  # [T, V] softcapped
    hidden: Tensor  # [T, H] post-final-norm hidden (TF's hidden_states[-1]), what the drafter consumes
    kv: dict[str, tuple[Tensor, Tensor]]  # layer type -> (K, V) of the source layer, each [1, Hkv, T, d]


@torch.no_grad()
def tf_target_outputs(model: PreTrainedModel, ids: list[int]) -> TargetOutputs:
    """A cache-free target forward over `ids`, with the hidden state and source-layer KV the drafter reads."""
    out = model(input_ids=_ids(ids), use_cache=False, output_hidden_states=True, return_shared_kv_states=True)
    # Cache-free, so the sliding source's KV covers every position too (the drafter applies its own window).
    return TargetOutputs(out.logits[0], out.hidden_states[-1][0], dict(out.shared_kv_states))


@dataclass
class DrafterStep:
    logits: Tensor  # [V] what TF's assistant returns: centroid-masked if use_ordered_embeddings, else dense
    dense_logits: Tensor  # [V] normed @ model.embed_tokens.weight.T (= logits when not ordered)
    normed: Tensor  # [D] drafter hidden after model.norm (input of both heads and of post_projection)
    hidden: Tensor  # [H] post_projection(normed): the next step's hidden input
    token: int  # argmax(logits), first index on ties, as TF


@torch.no_grad()
def tf_drafter_step(
    assistant: Gemma4AssistantForCausalLM,
    target: PreTrainedModel,
    target_out: TargetOutputs,
    token_id: int,
    position: int,
    hidden: Tensor | None = None,
) -> DrafterStep:
    """One assistant forward as TF's generator runs it, with the clean view of mtp/README.md §4-§5.

    The drafter sees the target KV of positions 0..position-1 (target_out must cover at least those) and
    `hidden` (default: target_out.hidden[position-1], the step-1 input). Pass DrafterStep.hidden of the
    previous step for steps 2..K; token_id and position are what the generator would pass.
    """
    kv = {kind: (k[:, :, :position], v[:, :, :position]) for kind, (k, v) in target_out.kv.items()}
    h = target_out.hidden[position - 1] if hidden is None else hidden
    embedding = target.get_input_embeddings()(_ids([token_id]))  # (1, 1, H), scaled by sqrt(H) in dtype
    inputs_embeds = torch.cat([embedding, h.view(1, 1, -1).to(embedding.dtype)], dim=-1)  # (1, 1, 2H)

    captured: list[Tensor] = []
    hook = assistant.model.register_forward_hook(lambda _m, _a, out: captured.append(out.last_hidden_state))
    try:
        out = assistant(
            inputs_embeds=inputs_embeds,
            attention_mask=None,  # what the generator passes: generate drops the all-ones prompt mask
            position_ids=torch.tensor([[position]]),
            shared_kv_states=kv,
            use_cache=False,
        )
    finally:
        hook.remove()
    normed = captured[0][0, 0]
    logits = out.logits[0, 0]
    return DrafterStep(
        logits=logits,
        dense_logits=normed @ assistant.lm_head.weight.T,
        normed=normed,
        hidden=out.last_hidden_state[0, 0],
        token=int(logits.argmax()),
    )


def tf_draft(
    assistant: Gemma4AssistantForCausalLM,
    target: PreTrainedModel,
    target_out: TargetOutputs,
    token_id: int,
    position: int,
    num_tokens: int,
) -> list[DrafterStep]:
    """A whole drafting round (num_tokens steps) from (token_id, hidden at position-1, position)."""
    steps: list[DrafterStep] = []
    token, hidden = token_id, None
    for _ in range(num_tokens):
        step = tf_drafter_step(assistant, target, target_out, token, position, hidden)
        steps.append(step)
        token, hidden = step.token, step.hidden
    return steps
