"""A multi-turn conversation on one KV cache: every turn renders the whole conversation and
prefills only what the cache does not already hold.

It lives in `mtp/` because a turn runs either engine loop: the speculative one (mtp/engine/rows.py) with
a drafter, plain decoding (gemma4/engine/decode.py) without; gemma4/ never imports mtp/.

- Rendering is the template's (gemma4/tokenizer.py `render`): earlier thoughts are dropped, so
  after a thinking turn the cache and the new rendering part at the thought's first token.
- Prefix reuse: the cache keeps K/V by absolute position, so keeping the first R positions is a cache length of R,
  for every family (a loop prefills from the length of the cache it is handed). R is the longest common prefix of
  the new ids and `held` (the ids whose K/V the cache holds: every committed token but the newest), and at most
  len(ids) - 1: the newest prompt token must run, its logits choose the first reply token. Sliding layers keep only
  a ring of their window plus a slack (gemma4/engine/ring.py): reuse is exact only while the ring still holds the window
  before R (`GrowingCache.holds`, mtp/extras/growing.py). A turn that diverges further back (a thinking block
  dropped from the history, long after it) is prefilled again from position 0, and `Reply.reused` says 0.
- Images and audio (gemma4/README.md §19, §20): a user turn may carry images and clips, written first in its turn
  (images, then clips). Their soft tokens are the same ids whatever the image or clip, so reuse also compares the
  media the cache holds, position by position, and never keeps part of one (`whole`). Where an image must see
  itself both ways, a prefill forward holds it whole: a longer image than the cache's slack makes a new cache.
- The drafter needs no reuse logic: it keeps no cache, and reads the target's K/V and the hidden
  of the newest position, both the turn's prefill's.
- Keyed sampling draws position n's token from noise keyed by (seed, n), so a turn on a reused
  cache gives the tokens of a fresh run over the same ids with the same settings, sampled or not.
- The cache is sized to the context and grows as it fills (mtp/extras/growing.py). `context` may hold the
  conversation to fewer positions than the model's: a turn's budget is cut to what fits.
- Ctrl-C during a reply (KeyboardInterrupt) ends the turn: the tokens already handed to
  `on_commit` become the model's turn, finish reason "interrupted", and the conversation goes on.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gemma4.engine.ring import PREFILL_CHUNK, ring_slack
from gemma4.audio.config import AudioTokens
from gemma4.audio.prompt import PromptAudio
from gemma4.audio.prompt import expand as expand_audio
from gemma4.audio.wav import AudioError
from gemma4.engine import decode
from gemma4.engine.media import Media, Span, joined
from gemma4.model import Gemma4Model
from gemma4.engine.rows import check_prompt
from gemma4.sampling import SamplerConfig
from gemma4.tokenizer import Gemma4Tokenizer, Message, needs_empty_thought
from gemma4.vision.config import ImageTokens
from gemma4.vision.prompt import ImageError, PromptImages
from gemma4.vision.prompt import expand as expand_images
from mtp.drafter import Drafter
from mtp.extras.growing import GrowingCache
from mtp.draft_length import DraftLength
from mtp.schedule import Schedule
from mtp.speculative import check_sampling
from mtp.stats import SpecStats
from mtp.engine import speculative_one

DEFAULT_STOP_IDS = (1, 106, 50)  # <eos>, <turn|>, <|tool_response>: the releases' generation_config.json
GREEDY = SamplerConfig(temperature=0.0)

# Sees each committed block: its tokens and, per token, whether the drafter proposed it.
OnCommit = Callable[[list[int], list[bool]], None]


class ContextFull(ValueError):
    """The conversation no longer fits the model's context; the conversation is unchanged."""

    def __init__(self, needed: int, context: int) -> None:
        self.needed, self.context = needed, context
        super().__init__(f"this turn needs {needed} positions (the conversation and at least one reply "
                         f"token) but the context holds {context}: /reset to start over")


@dataclass
class Reply:
    turn: int  # 1 for the first turn after a start or a reset
    prompt_ids: list[int]  # the whole rendered conversation this turn's generation started from
    reused: int  # leading prompt ids whose K/V the cache already held
    prefilled: int  # the rest, run by this turn's prefill: reused + prefilled == len(prompt_ids)
    tokens: list[int]  # new tokens, with the stop id that ended them if any
    text: str  # the tokens decoded without special tokens (a thought's text included)
    finish_reason: str  # "stop", "length" (max_new_tokens or the context) or "interrupted"
    stats: SpecStats | None  # the speculative loop's statistics; None for plain decoding
    seconds: float  # from the call to the last token
    first_token_seconds: float | None  # from the call to the first token (rendering and prefill included)


def whole(media: Media, reuse: int) -> int:
    """`reuse` moved back to the start of the span it cuts, if any: a reused prefix holds whole images, so the rest
    of an image is never run in a forward apart from its first part."""
    for row in media.rows:
        for span in row:
            if span.start < reuse < span.end:
                reuse = span.start
    return reuse


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Conversation:
    def __init__(
        self, target: Gemma4Model, tokenizer: Gemma4Tokenizer, drafter: Drafter | None = None,
        system: str | None = None, think: bool = False, stop_ids: Sequence[int] = DEFAULT_STOP_IDS,
        context: int | None = None, prefill_chunk: int | None = None, image_tokens: ImageTokens | None = None,
        audio_tokens: AudioTokens | None = None,
    ) -> None:
        """`image_tokens`, `audio_tokens`: the target's image and audio ids (`Vision.tokens`, `Audio.tokens`), for
        turns with images or clips."""
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.image_tokens, self.audio_tokens = image_tokens, audio_tokens
        model_context = target.config.max_position_embeddings
        self.context = model_context if context is None else min(context, model_context)  # positions it may hold
        self.system, self.think, self.stop_ids = system, think, tuple(stop_ids)
        self.empty_thought = needs_empty_thought(target.config, tokenizer.chat_template)
        self.draft_length = DraftLength(4)  # used when a turn passes none; a heuristic schedule carries over
        self.prefill_chunk = PREFILL_CHUNK if prefill_chunk is None else prefill_chunk  # gemma4/engine/rows.py `prefill`
        if self.prefill_chunk < 1:
            raise ValueError(f"a prefill chunk holds at least 1 position, got {self.prefill_chunk}")
        self.cache = self.new_cache(ring_slack(self.prefill_chunk))
        self.held: list[int] = []  # ids whose K/V sit at positions 0..len-1 of the cache
        self.held_media: list[Span] = []  # the images and clips among them, where they sit
        self.messages: list[Message] = []
        self.images: list[torch.Tensor] = []  # every image of the messages, in order: (n, E) each
        self.clips: list[torch.Tensor] = []  # every audio clip of the messages, in order: (n, E) each
        self.turn = 0

    def new_cache(self, slack: int) -> GrowingCache:
        w = self.target.embed_tokens.weight
        return GrowingCache(self.target.config, self.context, dtype=w.dtype, device=w.device, slack=slack)

    def reset(self) -> None:
        """Forget the messages. The cache keeps its K/V: they are a function of the ids (and images) alone, so
        the next turn still reuses what it shares with them (`<bos>`, the system turn)."""
        self.messages, self.images, self.clips, self.turn = [], [], [], 0

    def prompt(self, user_text: str, images: Sequence[torch.Tensor] = (),
               audio: Sequence[torch.Tensor] = ()) -> tuple[list[int], Media | None]:
        """What the next turn would run on: the conversation so far, this user turn (its images and clips first),
        the generation prompt; and the media on it (None when it holds none)."""
        if images and self.image_tokens is None:
            raise ImageError("this conversation has no image ids: give Conversation the target's image_tokens")
        if audio and self.audio_tokens is None:
            raise AudioError("this conversation has no audio ids: give Conversation the target's audio_tokens")
        marks = {} if self.image_tokens is None else {"boi": self.image_tokens.boi}
        marks |= {} if self.audio_tokens is None else {"boa": self.audio_tokens.boa}
        ids = self.tokenizer.render(self.messages + [Message("user", user_text, len(images), len(audio))],
                                    self.system, self.think, self.empty_thought, **marks)
        pictures, clips = self.images + list(images), self.clips + list(audio)
        # Both kinds expanded first, then placed on the final ids: a clip's soft tokens move the images after it.
        ids = expand_images(ids, [len(v) for v in pictures], self.image_tokens) if pictures else ids
        ids = expand_audio(ids, [len(v) for v in clips], self.audio_tokens) if clips else ids
        return ids, joined(PromptImages([ids], [pictures], self.image_tokens) if pictures else None,
                           PromptAudio([ids], [clips], self.audio_tokens) if clips else None)

    def prompt_ids(self, user_text: str, images: Sequence[torch.Tensor] = (),
                   audio: Sequence[torch.Tensor] = ()) -> list[int]:
        return self.prompt(user_text, images, audio)[0]

    def reusable(self, ids: list[int], media: Media | None) -> int:
        """How many leading positions of `ids` (with these images and clips) the cache holds K/V for."""
        reused = min(common_prefix(ids, self.held), len(ids) - 1)
        now = media.rows[0] if media else []
        for held, new in zip(self.held_media, now):  # soft ids match whatever the media: compare the vectors
            if held.start != new.start or not torch.equal(held.vectors, new.vectors):
                reused = min(reused, held.start, new.start)
                break
        if len(self.held_media) > len(now):  # an image or clip held where the new prompt has text
            reused = min(reused, self.held_media[len(now)].start)
        return whole(media, reused) if media else reused

    def say(
        self, user_text: str, max_new_tokens: int = 256, sampler: SamplerConfig = GREEDY,
        draft_length: Schedule | None = None, drafting: str = "argmax",
        stop_ids: Sequence[int] | None = None, ignore_eos: bool = False, on_commit: OnCommit | None = None,
        images: Sequence[torch.Tensor] = (), audio: Sequence[torch.Tensor] = (),
    ) -> Reply:
        """One user turn and the model's reply, which joins the conversation.

        `sampler` greedy (temperature 0) or sampling; with a drafter, `draft_length` (K and the
        schedule; default the conversation's own) and `drafting` ("argmax" or "sample") as in
        `speculative_generate`. `stop_ids`: default the conversation's; `ignore_eos` stops on none.
        `images`, `audio`: this turn's images and clips, (n, E) vectors each (`Vision.read`, `Audio.read`),
        written before its text.
        Raises ContextFull when the conversation cannot fit one more token, ValueError on bad
        settings; either way the conversation is as before the call.
        """
        start = time.perf_counter()
        ids, every = self.prompt(user_text, images, audio)
        if len(ids) + 1 > self.context:
            raise ContextFull(len(ids) + 1, self.context)
        max_new_tokens = min(max_new_tokens, self.context - len(ids))  # the loops stop only at the model's context
        check_prompt(self.target, every.text_ids(0, ids) if every else ids, max_new_tokens)  # before the cache
        if self.drafter is not None:
            check_sampling(sampler, drafting)
        stops = () if ignore_eos else tuple(self.stop_ids if stop_ids is None else stop_ids)
        reused = self.reusable(ids, every)
        if every and every.longest > self.cache.slack:  # an image one forward must hold
            self.cache, reused = self.new_cache(ring_slack(every.longest)), 0
        if not self.cache.holds(reused):  # the ring has moved past the window before `reused`: start over
            reused = 0
        # From here on, whenever an exception falls, positions below min(cache.length, len(sequence))
        # hold the K/V of sequence = ids + the reply so far: the loops move `length` only past K/V
        # they wrote for it (a stop id may cut the last block short of `length`).
        self.cache.length, self.held = torch.tensor([reused]), ids[:reused]
        self.held_media = [s for s in self.held_media if s.end <= reused]
        shown: list[int] = []
        first: list[float] = []

        def commit(tokens: list[int], from_drafter: list[bool]) -> None:
            if not first:
                first.append(time.perf_counter() - start)
            shown.extend(tokens)  # before the caller's callback: an interrupt there keeps what it got
            if on_commit:
                on_commit(tokens, from_drafter)

        stats = None
        try:
            if self.drafter is not None:
                result = speculative_one(
                    self.target, self.drafter, ids, max_new_tokens, draft_length or self.draft_length, stops,
                    sampler, drafting, on_round=lambda r: commit(r.block, r.from_drafter), cache=self.cache, prefill_chunk=self.prefill_chunk,
                    images=every)
                tokens, stats, finish_reason = result.tokens, result.stats, result.finish_reason
            else:
                tokens, finish_reason = decode(self.target, [ids], max_new_tokens, [sampler], stops,
                                               on_token=lambda _, t: commit([t], [False]), cache=self.cache,
                                               prefill_chunk=self.prefill_chunk, images=every)[0]
        except KeyboardInterrupt:
            tokens, finish_reason = shown, "interrupted"
        seconds = time.perf_counter() - start

        sequence = ids + tokens
        self.held = sequence[:min(int(self.cache.length[0]), len(sequence))]
        self.cache.length = torch.tensor([len(self.held)])
        self.held_media = [s for s in (every.rows[0] if every else []) if s.end <= len(self.held)]
        # The model's turn as the template stores it: its text with its control tokens (a thought
        # is dropped when the next turn is rendered), without the stop id that closed it.
        body = tokens[:-1] if finish_reason == "stop" else tokens
        media = set(self.target.config.media_token_ids)
        media |= {self.image_tokens.boi, self.image_tokens.eoi} if self.image_tokens else set()
        media |= {self.audio_tokens.boa, self.audio_tokens.eoa} if self.audio_tokens else set()
        body = [t for t in body if t not in media]  # a generated media id carries no media: left out of the history
        self.messages += [Message("user", user_text, len(images), len(audio)),
                          Message("model", self.tokenizer.decode(body))]
        self.images += list(images)
        self.clips += list(audio)
        self.turn += 1
        return Reply(self.turn, ids, reused, len(ids) - reused, tokens,
                     self.tokenizer.decode(tokens, skip_special_tokens=True), finish_reason, stats, seconds,
                     first[0] if first else None)
