"""`embed_audio`, which carries audio vectors into the text width; on the 12B it is the whole audio model, applied to
frames of raw samples.

Facts a reader must know (transformers 5.22.2 `Gemma4MultimodalEmbedder`, `Gemma4UnifiedMultimodalEmbedder`):
- A weightless RMSNorm (eps = audio_config.rms_norm_eps) and one projection without bias to E, as `embed_vision`.
- E2B/E4B: it reads the tower's `output_proj` vectors (gemma4/audio/tower.py), O = output_proj_dims.
- 12B: no tower. Each soft token is a frame of 640 raw samples (40 ms at 16 kHz; the last frame zero-padded,
  gemma4/audio/features.py `frames`), so O = audio_embed_dim = 640. The norm removes the frame's loudness: a clip
  and the same clip twice as loud give the same vectors. The frames are cast to the weights' dtype before the norm.
- Names: `model.embed_audio.embedding_projection.weight` in the files and in transformers (no renaming on load).

Shape legend: n soft tokens, O the width entering the embedder, E text width.
"""

import torch
from torch import nn

from gemma4.audio.config import AudioConfig
from gemma4.norms import rms_norm

EMBED_PREFIX = "model.embed_audio."  # + a key of embed_weight_table: the checkpoint's name


def embed_weight_table(c: AudioConfig) -> dict[str, tuple[int, ...]]:
    """Module key -> shape for AudioEmbedder (checkpoint name = EMBED_PREFIX + key); its norm has no weight."""
    return {"embedding_projection.weight": (c.text_hidden_size, c.output_proj_dims)}


class AudioEmbedder(nn.Module):
    """`embed_audio`: the tower's vectors, or the 12B's raw frames, (n, O) -> (n, E), ready to replace the clip's
    soft tokens (checkpoint names: EMBED_PREFIX + key)."""

    def __init__(self, config: AudioConfig) -> None:
        super().__init__()
        self.eps = config.rms_norm_eps
        self.embedding_projection = nn.Linear(config.output_proj_dims, config.text_hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.embedding_projection.weight.dtype)  # the 12B's float32 frames; a no-op after the tower
        return self.embedding_projection(rms_norm(x, None, self.eps))  # weightless norm, then (n, O) -> (n, E)
