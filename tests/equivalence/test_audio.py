"""Audio prompts through every loop, on tiny audio checkpoints of both audio families (tests/checkpoints.py
`audio=True`: E2B's conformer tower, the 12B's frame embedder). A 2 s clip makes 50 soft tokens in both, longer
than the sliding window of 8 and than a prefill chunk of 7, which ends inside it (a clip is causal: gemma4/audio/
prompt.py):

- the speculative loop == plain decoding == a cache-free decoder that reruns the whole sequence with its clips
  every step, greedy and keyed sampling (argmax drafting: plain sampling's tokens, same seed), whole and chunked;
- a batch whose rows hold different clips (one row two, one none) == each row run alone, plain and speculative;
- a conversation with clips in two turns on one cache == fresh runs of each turn's prompt, reusing the earlier
  turns' clips, and a clip the new prompt replaces by another of the same length is not reused.
Each part also checks that the clips reach the model: other vectors in a clip's place change the tokens.
"""

from pathlib import Path

import pytest
import torch

from gemma4 import Gemma4Tokenizer, SamplerConfig, load_target
from gemma4.audio.loading import Audio, load_audio
from gemma4.audio.prompt import PromptAudio
from gemma4.engine import decode
from gemma4.engine.media import Media
from gemma4.model import Gemma4Model
from gemma4.engine.rows import choose
from mtp import Conversation, DraftLength, load_drafter
from mtp.engine.batch import speculative_generate_batch
from mtp.drafter import Drafter
from tests.checkpoints import STOP_IDS, write_assistant, write_target
from tests.tokenizer_fixture import write_tokenizer
from mtp.engine import speculative_one
from gemma4.engine.forward import forward_rows

NEW = 12
CHUNK = 7
SAMPLED = SamplerConfig(temperature=1.0, top_k=40, top_p=0.95, seed=11)


def samples(n: int, seed: int) -> torch.Tensor:
    """(n,) float32 samples at 16 kHz: a seeded tone under noise."""
    g = torch.Generator().manual_seed(seed)
    hz = 200 + 600 * float(torch.rand(1, generator=g))
    return (0.3 * torch.sin(2 * torch.pi * hz * torch.arange(n) / 16_000) + 0.1 * torch.randn(n, generator=g)).float()


@pytest.fixture(scope="module", params=["e2b", "12b"])
def audio_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> tuple[Gemma4Model, Drafter, Audio, list[torch.Tensor]]:
    """The target, an echo drafter, its audio side and four clips' vectors: 50, 13, 8 and 13 soft tokens."""
    root = tmp_path_factory.mktemp(request.param)
    path = write_target(root / "t", request.param, audio=True)
    drafter = load_drafter(write_assistant(root / "a", path, ordered_embeddings=request.param == "e2b", echo=True,
                                           seed=2))
    audio = load_audio(path)
    clips = [audio.read(samples(n, seed)) for n, seed in ((32_000, 1), (8000, 2), (5000, 3), (8000, 4))]
    assert [len(v) for v in clips] == [50, 13, 8, 13]
    return load_target(path), drafter, audio, clips


@torch.inference_mode()
def cache_free(target: Gemma4Model, ids: list[int], media: Media, n: int,
               sampler: SamplerConfig | None = None) -> list[int]:
    """No cache and no chunks: every token from one forward over the whole sequence, its clips replaced in."""
    seq = list(ids)
    for _ in range(n):
        out = forward_rows(target, torch.tensor([seq]), soft=media.soft([0], len(seq), torch.device("cpu")))
        seq += choose(target, out.logits[:, -1], [sampler], [len(seq)])
    return seq[len(ids):]


@pytest.mark.parametrize("sampler", [None, SAMPLED], ids=["greedy", "sampled"])
def test_speculative_equals_plain_equals_cache_free(audio_pair, sampler: SamplerConfig | None) -> None:  # noqa: ANN001
    target, drafter, audio, clips = audio_pair
    b = audio.tokens.boa
    ids, media = audio.prompt([2, 10, b, 12, 13, b, 14], clips[:2])
    long = media.rows[0][0]
    assert any(long.start < end < long.end for end in range(CHUNK, len(ids), CHUNK))  # chunks end inside the clip
    reference = cache_free(target, ids, media, NEW, sampler)
    for chunk in (None, CHUNK):
        assert decode(target, [ids], NEW, [sampler], prefill_chunk=chunk, audio=media)[0].tokens == reference
    for chunk, k in ((None, 3), (CHUNK, 1), (CHUNK, 4), (16, 2)):
        spec = speculative_one(target, drafter, ids, NEW, DraftLength(k), (), sampler, audio=media,
                                    prefill_chunk=chunk)
        assert spec.tokens == reference, f"prefill chunk {chunk}, K={k}"
    # The clips reach the model: the long clip's vectors in reversed order give other tokens.
    other = PromptAudio([ids], [[clips[0].flip(0), clips[1]]], audio.tokens)
    assert decode(target, [ids], NEW, [sampler], prefill_chunk=CHUNK, audio=other)[0].tokens != reference


def test_batch_rows_with_different_clips_equal_solo_runs(audio_pair) -> None:  # noqa: ANN001
    target, drafter, audio, clips = audio_pair
    b = audio.tokens.boa
    rows = [([2, 10, b, 12], [clips[1]]), ([2, b, 30, 31, b, 33], [clips[0], clips[2]]), ([2, 40, 41], []),
            ([2, b, 50], [clips[3]])]
    placed = [audio.prompt(ids, row_clips) if row_clips else (ids, None) for ids, row_clips in rows]
    prompts = [ids for ids, _ in placed]
    together = PromptAudio(prompts, [row_clips for _, row_clips in rows], audio.tokens)
    samplers = [None, SAMPLED, SAMPLED, None]
    solo = [decode(target, [ids], NEW, [s], audio=media)[0].tokens for (ids, media), s in zip(placed, samplers)]
    assert [g.tokens for g in decode(target, prompts, NEW, samplers, prefill_chunk=CHUNK, audio=together)] == solo
    spec = speculative_generate_batch(target, drafter, prompts, NEW, DraftLength(3), (), samplers, audio=together,
                                      prefill_chunk=CHUNK)
    assert [r.tokens for r in spec] == solo
    # Rows 0 and 3 hold clips of one length: swapped between them, those rows' tokens change, the others' do not.
    swapped = PromptAudio(prompts, [[clips[3]], [clips[0], clips[2]], [], [clips[1]]], audio.tokens)
    got = [g.tokens for g in decode(target, prompts, NEW, samplers, prefill_chunk=CHUNK, audio=swapped)]
    assert got[0] != solo[0] and got[3] != solo[3] and got[1:3] == solo[1:3]


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "speculative"])
def test_chat_with_clips_in_two_turns_equals_fresh_runs(audio_pair, tmp_path: Path,  # noqa: ANN001
                                                        speculative: bool) -> None:
    target, drafter, audio, clips = audio_pair
    conv = Conversation(target, Gemma4Tokenizer(write_tokenizer(tmp_path, media=True)),
                        drafter if speculative else None, stop_ids=STOP_IDS, prefill_chunk=CHUNK,
                        audio_tokens=audio.tokens)
    turns = [("Listen to this.", [clips[0]]), ("And these two?", [clips[1], clips[2]]), ("Compare them.", [])]
    previous = 0  # where the previous turn's last clip ends
    for i, (text, turn_clips) in enumerate(turns):
        ids, every = conv.prompt(text, audio=turn_clips)
        # Every clip so far, in order, on its own soft ids between boa and eoa.
        spans = every.rows[0]
        given = conv.clips + turn_clips
        assert len(spans) == len(given) == ids.count(audio.tokens.boa)
        assert all(torch.equal(s.vectors, v) for s, v in zip(spans, given))
        assert all(ids[s.start - 1] == audio.tokens.boa and ids[s.end] == audio.tokens.eoa
                   and set(ids[s.start:s.end]) == {audio.tokens.soft} for s in spans)
        reply = conv.say(text, NEW, SamplerConfig(temperature=0.0), DraftLength(3), audio=turn_clips)
        assert reply.prompt_ids == ids and reply.reused + reply.prefilled == len(ids)
        assert reply.tokens == decode(target, [ids], NEW, stop_ids=STOP_IDS, audio=every)[0].tokens, f"turn {i + 1}"
        if i > 0:  # the earlier turns' clips are still where they were: reused, not run again
            assert reply.reused >= previous > 0
        previous = every.rows[0][-1].end


def test_a_changed_clip_is_not_reused(audio_pair, tmp_path: Path) -> None:  # noqa: ANN001
    """Two one-turn conversations whose prompts differ only in the clip (same length, other vectors): the second
    reuses no soft token of it, and equals a fresh run, which differs from the first clip's."""
    target, _, audio, clips = audio_pair
    conv = Conversation(target, Gemma4Tokenizer(write_tokenizer(tmp_path, media=True)), stop_ids=STOP_IDS,
                        prefill_chunk=CHUNK, audio_tokens=audio.tokens)
    first = conv.say("Listen.", NEW, audio=[clips[1]])
    conv.reset()
    ids, every = conv.prompt("Listen.", audio=[clips[3]])
    reply = conv.say("Listen.", NEW, audio=[clips[3]])
    assert reply.reused == every.rows[0][0].start  # up to boa, not one soft token further
    assert reply.tokens == decode(target, [ids], NEW, stop_ids=STOP_IDS, audio=every)[0].tokens != first.tokens
