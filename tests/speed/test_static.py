"""The static-shape steps (gemma4/fast/static.py) give the textbook loops' tokens, eagerly and compiled, and Dynamo
captures the decode, verify and draft steps whole.

- Eager: plain greedy and keyed sampling, speculative greedy, argmax-drafted keyed sampling and sample drafting,
  K = 1 and 4, on the three tiny shapes (tests/pairs.py: the echo drafter, partly right), a prompt past both
  windows; and a conversation whose turns reuse a static cache.
- Capture: `torch._dynamo.explain` traces without compiling (seconds): no graph break in the decode step (T = 1),
  a verify of K + 1 = 5 rows and the draft step, on e2b (PLE, KV sharing, centroid head) and dense (K=V), from a
  fast model whose products call oneDNN (packed, or unpacked for many rows), which a compiled step makes plain
  `torch.matmul`: inductor packs its own; and on moe, whose compiled steps gather their experts on the device
  (gemma4/fast/experts.py) instead of the eager loop that asks the host for them.
- Compiled: one shape, few tokens. Inductor builds three graphs (T = 1, T = 2, the draft step): about two minutes on
  a 2-core CPU with a cold cache (/tmp/torchinductor_$USER), seconds once cached.
- `--compile` in generate.py takes one prompt (its measured runs: scripts/benchmark.md).
"""

import copy
import json

import pytest
import torch

import generate  # scripts/generate.py (pyproject.toml puts scripts/ on pytest's path)
from gemma4 import Gemma4Tokenizer, RingCache, SamplerConfig, greedy_generate, load_target, sample_generate
from gemma4.config import FULL
from gemma4.fast import make_fast, products
from gemma4.fast.kernels import ONEDNN
from gemma4.fast.static import StaticDrafter, StaticKVCache, StaticTarget, prepare_to_compile
from gemma4.weights import file_reader
from mtp import Conversation, DraftLength, load_drafter, speculative_generate
from tests.checkpoints import SHAPES, STOP_IDS
from tests.pairs import prompt
from tests.tokenizer_fixture import write_tokenizer
from gemma4.engine import generate_one
from mtp.engine import speculative_one
from gemma4.engine.forward import forward_rows
from mtp.engine.drafts import ring_kv

N = 20  # new tokens: the long prompt (21) and these cross the target's window (8) and the drafter's (6)
SAMPLER = SamplerConfig(temperature=0.9, top_k=40, seed=5)


def static(target, drafter, n: int = N, compiled_rows: tuple[int, ...] = (),  # noqa: ANN001, ANN201
           compile: bool = False, context: int | None = None):
    """The static wrappers of a copy of the pair, and a cache. A copy: compiling rewrites the model
    (`prepare_to_compile`: plain products, gathered experts), and the pair is the session's `models`, which every
    other test reads as the loaders made it."""
    target, drafter = copy.deepcopy((target, drafter))
    cache = StaticKVCache(target.config, len(prompt("long")) + n)
    if compiled_rows:
        prepare_to_compile(target, target.embed_tokens.weight, max(compiled_rows))
    if compile:
        prepare_to_compile(drafter, drafter.model.embed_tokens.weight)
    return StaticTarget(target, compiled_rows, context=context), StaticDrafter(drafter, compile), cache


@pytest.mark.parametrize("shape", SHAPES)
def test_plain_equals_textbook(models, shape: str) -> None:  # noqa: ANN001
    target, drafter = models[shape, "echo"]
    st, _, cache = static(target, drafter)
    ids = prompt("long")
    assert generate_one(st, ids, N, SamplerConfig(0.0), cache=cache) == greedy_generate(target, ids, N)
    cache.length = torch.tensor([0])  # the next run holds nothing of it: a prefill from position 0
    assert generate_one(st, ids, N, SAMPLER, cache=cache) == sample_generate(target, ids, N, SAMPLER)


@pytest.mark.parametrize("drafting", ["greedy", "argmax", "sample"])
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("shape", SHAPES)
def test_speculative_equals_textbook(models, shape: str, k: int, drafting: str) -> None:  # noqa: ANN001
    target, drafter = models[shape, "echo"]
    st, sd, cache = static(target, drafter)
    ids = prompt("long")
    sampler, how = (None, "argmax") if drafting == "greedy" else (SAMPLER, drafting)
    ours = speculative_one(st, sd, ids, N, DraftLength(k), sampler=sampler, drafting=how, cache=cache)
    textbook = speculative_generate(target, drafter, ids, N, DraftLength(k), sampler=sampler, drafting=how)
    assert ours.tokens == textbook.tokens
    assert [r.drafted for r in ours.stats.rounds] == [r.drafted for r in textbook.stats.rounds]
    if drafting != "sample":  # greedy and argmax drafting: plain decoding's tokens
        assert ours.tokens == (greedy_generate(target, ids, N) if sampler is None else
                               sample_generate(target, ids, N, sampler))


@pytest.mark.parametrize("speculative", [True, False])
def test_conversation_on_a_static_cache(models, tmp_path, speculative: bool) -> None:  # noqa: ANN001
    """Turns reuse the cache's prefix (prefill from the length it is handed): the same replies as on the textbook's
    cache."""
    tokenizer = Gemma4Tokenizer(write_tokenizer(tmp_path))
    target, drafter = models["e2b", "echo"]
    st, sd, _ = static(target, drafter)
    ours = Conversation(st, tokenizer, sd if speculative else None, stop_ids=STOP_IDS)
    ours.cache = StaticKVCache(target.config, target.config.max_position_embeddings)
    textbook = Conversation(target, tokenizer, drafter if speculative else None, stop_ids=STOP_IDS)
    for text in ["Hello there, who are you?", "Tell me a story about a cat.", "Why?"]:
        mine, theirs = ours.say(text, 8, SAMPLER, DraftLength(3)), textbook.say(text, 8, SAMPLER, DraftLength(3))
        assert (mine.tokens, mine.reused) == (theirs.tokens, theirs.reused)


def test_chat_counts_each_turns_eager_rounds(models, tmp_path, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    """chat.py --json under --compile: a turn's `eager_rounds` are the rounds of that turn whose step ran
    uncompiled (routed as compiled, left uncompiled, as in test_every_k_the_schedule_may_choose_is_compiled)."""
    import chat  # scripts/chat.py
    from cli.options import Assistant, Target
    target, drafter = models["e2b", "echo"]
    st, sd, _ = static(target, drafter, compiled_rows=(1, 2))  # rounds of 2 or 3 drafts run uncompiled
    st.step = st.forward
    tokenizer = Gemma4Tokenizer(write_tokenizer(tmp_path))
    conversation = Conversation(st, tokenizer, sd, stop_ids=STOP_IDS)
    conversation.cache = StaticKVCache(target.config, target.config.max_position_embeddings)
    loaded = Target("t", tmp_path, target, tokenizer, True, False, STOP_IDS, SamplerConfig(0.0), "")
    session = chat.Session(conversation, loaded, Assistant("a", sd, DraftLength(3), "argmax"), 12, [], True,
                           lambda line: None, lambda path: None)
    counts = []
    for text in ("Hello there.", "Why?"):
        before = st.eager_steps
        session.turn(text)
        counts.append(st.eager_steps - before)
    turns = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [t["stats"]["eager_rounds"] for t in turns] == counts and all(counts)
    assert counts == [sum(len(r["drafted"]) + 1 not in (1, 2) for r in t["stats"]["rounds"]) for t in turns]


def test_a_static_target_stops_at_its_context(models) -> None:  # noqa: ANN001
    """StaticTarget(context=C): the loops stop at C positions (the cache's capacity), as at a model's context, and
    a Conversation refuses a turn past it; the tokens are the unbounded run's, cut."""
    target, drafter = models["e2b", "echo"]
    ids, context = prompt("long"), len(prompt("long")) + 6
    st, sd, _ = static(target, drafter, context=context)
    assert st.config.max_position_embeddings == context and target.config.max_position_embeddings > context
    cache = StaticKVCache(target.config, context)
    assert generate_one(st, ids, N, SamplerConfig(0.0), cache=cache) == greedy_generate(target, ids, N)[:6]
    cache.length = torch.tensor([0])  # the next run holds nothing of it
    spec = speculative_one(st, sd, ids, N, DraftLength(4), cache=cache)
    assert spec.tokens == greedy_generate(target, ids, N)[:6] and spec.finish_reason == "length"


def test_capacities_are_aligned(models) -> None:  # noqa: ANN001
    """Full layers' slots and the ring round up to a multiple of 64 (key lengths the fused attention kernels take);
    the run still stops at the context asked for, and its tokens are the unaligned cache's."""
    target, drafter = models["e2b", "echo"]
    cache = StaticKVCache(target.config, 1001, slack=5)
    full = target.config.layer_types.index(FULL)
    assert cache.capacity == 1024 and cache.keys[full].shape[2] == 1024 and cache.ring == 64
    ids = prompt("long")
    context = len(ids) + N  # not a multiple of 64
    st = StaticTarget(target, context=context)
    aligned = StaticKVCache(target.config, context)
    assert aligned.capacity % 64 == 0 and aligned.capacity > context
    expected = greedy_generate(target, ids, N)
    assert generate_one(st, ids, N + 5, SamplerConfig(0.0), cache=aligned) == expected  # cut at the context
    aligned.length = torch.tensor([0])  # the next run holds nothing of it
    assert speculative_one(st, StaticDrafter(drafter), ids, N, DraftLength(4), cache=aligned).tokens == expected


def test_the_cache_writes_at_device_positions_and_reads_whole_buffers(models) -> None:  # noqa: ANN001
    target, _ = models["e2b", "echo"]
    cache = StaticKVCache(target.config, 16, align=1)
    k, v = torch.randn(1, 1, 3, 16), torch.randn(1, 1, 3, 16)  # (B, K, T, D)
    keys, values = cache.write(0, cache.slots(torch.tensor([4, 5, 6])), k, v)  # layer 0: a full layer
    assert keys.shape == (1, 1, 16, 16) and keys.data_ptr() == cache.keys[0].data_ptr()
    assert torch.equal(keys[:, :, 4:7], k) and torch.equal(values[:, :, 4:7], v) and not keys[:, :, :4].any()
    assert cache.read(0, 5)[0].shape == (1, 1, 16, 16)  # whole: the reader's mask hides 5..15
    cache.length = torch.tensor([4])
    cache.check(4, 12)
    with pytest.raises(ValueError, match="hole"):
        cache.check(5, 1)
    with pytest.raises(ValueError, match="holds 16 positions"):
        cache.check(4, 13)


def test_what_a_static_target_refuses(models) -> None:  # noqa: ANN001
    target, drafter = models["e2b", "echo"]
    st, _, _ = static(target, drafter)
    with pytest.raises(ValueError, match="StaticKVCache"):
        forward_rows(st, torch.tensor([[2, 5]]), RingCache(target.config, 8))
    with pytest.raises(ValueError, match="one row"):
        forward_rows(st, torch.tensor([[2], [5]]), StaticKVCache(target.config, 8))


def step_arguments(st: StaticTarget, cache: StaticKVCache, t: int) -> tuple:
    ids = torch.zeros(1, t, dtype=torch.long)
    rows = st.model.per_layer_rows(ids, st.embed_tokens.weight) if st.config.ple_dim else None
    return (*st.upload(ids, 0), rows, cache, t)


@pytest.mark.parametrize("kernel", ["onednn", "packed"])
@pytest.mark.parametrize("shape", SHAPES)
def test_steps_have_no_graph_break(make_pair, shape: str, kernel: str) -> None:  # noqa: ANN001
    target_dir, assistant_dir = make_pair(shape, ordered_embeddings=shape == "e2b", multimodal=False)
    target, drafter = load_target(target_dir, fast=False), load_drafter(assistant_dir, fast=False)
    kernels = (kernel, kernel)  # oneDNN on the plain weight, or on its packed copy, for every row count
    make_fast(target, file_reader(target_dir, "model."), ("head", "embed_tokens.weight"), kernels=kernels)
    head = None if drafter.config.use_ordered_embeddings else ("head", "model.embed_tokens.weight")
    make_fast(drafter, file_reader(assistant_dir, ""), head, kernels=kernels)
    assert all(p.packed or any(p.onednn) for p in products(target)) or not ONEDNN  # oneDNN where there is one
    with pytest.raises(ValueError, match="prepare_to_compile"):  # a constructor never rewrites the model it wraps
        StaticTarget(target, compiled_rows=(1, 5))
    with pytest.raises(ValueError, match="prepare_to_compile"):
        StaticDrafter(drafter, compile=True)
    prepare_to_compile(target, target.embed_tokens.weight, 5)
    prepare_to_compile(drafter, drafter.model.embed_tokens.weight)
    st, sd = StaticTarget(target, compiled_rows=(1, 5)), StaticDrafter(drafter, compile=True)  # nothing compiled yet
    # Inductor cannot lower oneDNN's product given to it (it packs its own): every product is torch.matmul now.
    assert not any(p.packed or any(p.onednn) for p in products(target) + products(drafter))
    cache = StaticKVCache(target.config, 32)
    with torch.inference_mode():
        for t in (1, 5):  # a decode step, a verify of K = 4 drafts
            explained = torch._dynamo.explain(st.forward)(*step_arguments(st, cache, t))
            assert explained.graph_break_count == 0, explained.break_reasons
            assert explained.graph_count == 1
        token, hidden = torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, target.config.hidden_size)
        explained = torch._dynamo.explain(sd.forward)(st, token, hidden, torch.tensor([3]), ring_kv(cache, st, 3))
        assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


@pytest.mark.parametrize("shape", ["e2b", "12b"])  # compiling is slow: PLE and KV sharing, and the plain 12B
def test_compiled_equals_eager(models, shape: str) -> None:  # noqa: ANN001
    """Plain greedy through the compiled decode step; speculative greedy (K = 1) through the compiled verify of 2
    rows and the compiled draft step. A round the budget cuts to K = 0 decodes with the compiled T = 1 step."""
    target, drafter = models[shape, "echo"]
    ids, n = prompt("long"), 8
    st, sd, cache = static(target, drafter, n, compiled_rows=(1, 2), compile=True)
    st.warm_up(cache)
    sd.warm_up(st, cache)
    eager_target, eager_drafter, _ = static(target, drafter, n)

    def fresh(cache: StaticKVCache) -> StaticKVCache:
        cache.length = torch.tensor([0])  # each run holds nothing of the last: a prefill from position 0
        return cache

    assert generate_one(st, ids, n, SamplerConfig(0.0), cache=fresh(cache)) == \
        generate_one(eager_target, ids, n, SamplerConfig(0.0), cache=fresh(cache))
    spec = speculative_one(st, sd, ids, n, DraftLength(1), cache=fresh(cache))
    assert spec.tokens == speculative_one(eager_target, eager_drafter, ids, n, DraftLength(1),
                                               cache=fresh(cache)).tokens
    assert spec.tokens == greedy_generate(target, ids, n)


def test_compile_takes_one_prompt(capsys: pytest.CaptureFixture) -> None:
    assert generate.cli(["--compile", "--prompt", "a", "--prompt", "b"]) == 2
    assert "--compile runs one prompt" in capsys.readouterr().err


@pytest.mark.parametrize("schedule", ["auto", "heuristic", "constant"])
def test_every_k_the_schedule_may_choose_is_compiled(models, schedule: str) -> None:  # noqa: ANN001
    """--compile compiles a step for every row count its schedule may choose (`verify_rows`), so under `auto` no
    round runs an uncompiled step (`eager_steps`, the `eager_rounds` of --json). The steps here are routed as
    compiled but left uncompiled: whether a row count reaches the compiled step is what is checked (compiling
    itself is test_compiled_equals_eager's). The rows of the starting K alone, as before, leave rounds eager."""
    from cli.options import draft_room, verify_rows  # scripts/cli/options.py
    target, drafter = models["dense", "echo"]
    ids, n = prompt("long"), 40
    fixed = {"costs": lambda k: 1.0 + 0.05 * (k - 1), "draft_cost": 0.05} if schedule == "auto" else {}
    rows = verify_rows(DraftLength(4, schedule, **fixed), draft_room(n, None))
    assert rows == {"auto": tuple(range(1, 10)), "heuristic": tuple(range(1, 10)), "constant": (1, 2, 3, 4, 5)}[schedule]
    expected = greedy_generate(target, ids, n)
    for compiled_rows in (rows, (1, 5)):
        st, sd, cache = static(target, drafter, n, compiled_rows=compiled_rows)
        st.step = st.forward  # the routing, not the compiler
        spec = speculative_one(st, sd, ids, n, DraftLength(4, schedule, **fixed), cache=cache)
        assert spec.tokens == expected
        chosen = {len(r.drafted) + 1 for r in spec.stats.rounds}
        assert st.eager_steps == sum(len(r.drafted) + 1 not in compiled_rows for r in spec.stats.rounds)
        if compiled_rows == rows:
            assert st.eager_steps == 0 and chosen <= set(rows)
        elif schedule != "constant":
            assert st.eager_steps > 0 and len(chosen) > 2  # K moved off the starting 4
