"""The 12B's image embedder: no encoder, each merged patch is normalised, projected and given its position.

Facts a reader must know (transformers 5.22.2 `Gemma4UnifiedVisionEmbedder`):
- The input is k x k patches of p px merged into one (k·p = 48 px: 3·48² = 6912 values), in [0, 1] as the
  processor rescales them, with no 2x - 1 step (unlike the ViT of gemma4/vision/tower.py) and no pooling: one
  merged patch is one image vector.
- LayerNorm (with bias, eps 1e-5: nn.LayerNorm's default, which transformers keeps; the config carries no eps for
  it) -> Linear with bias -> LayerNorm, then the position, then a last LayerNorm.
- The position table is factorized and stored (rows, axis, width): row x of axis 0 plus row y of axis 1.
- Then `embed_vision` (VisionEmbedder of tower.py, out_dim = output_proj_dims) carries the vectors into E. In the
  released file (and files transformers saves) the names are `model.vision_embedder.*` for this module and
  `model.embed_vision.embedding_projection.weight` for the projection; transformers renames them on load
  (conversion_mapping.py, "gemma4_unified"), we load them as they are.

Shape legend: N merged patches of one image, C = 3·(k·p)² values per merged patch, U = mm_embed_dim.
"""

import torch
from torch import nn

from gemma4.vision.config import VisionConfig

UNIFIED_PREFIX = "model.vision_embedder."  # + a key of weight_table: the checkpoint's name

LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, as transformers builds these norms


def weight_table(c: VisionConfig) -> dict[str, tuple[int, ...]]:
    """Module key -> shape, for every tensor UnifiedEmbedder owns (checkpoint name = UNIFIED_PREFIX + key)."""
    patch, u = 3 * (c.patch_size * c.pooling_kernel_size) ** 2, c.mm_embed_dim
    return {
        "patch_ln1.weight": (patch,), "patch_ln1.bias": (patch,),
        "patch_dense.weight": (u, patch), "patch_dense.bias": (u,),
        "patch_ln2.weight": (u,), "patch_ln2.bias": (u,),
        "pos_embedding": (c.mm_posemb_size, 2, u),
        "pos_norm.weight": (u,), "pos_norm.bias": (u,),
    }


class UnifiedEmbedder(nn.Module):
    """merged patches and positions of one image -> its N vectors of width U (checkpoint names: UNIFIED_PREFIX +
    key); VisionEmbedder then takes them to E."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        patch, u = 3 * (config.patch_size * config.pooling_kernel_size) ** 2, config.mm_embed_dim
        self.patch_ln1 = nn.LayerNorm(patch, eps=LAYER_NORM_EPS)
        self.patch_dense = nn.Linear(patch, u)
        self.patch_ln2 = nn.LayerNorm(u, eps=LAYER_NORM_EPS)
        self.pos_embedding = nn.Parameter(torch.empty(config.mm_posemb_size, 2, u))  # (rows, axis x|y, U)
        self.pos_norm = nn.LayerNorm(u, eps=LAYER_NORM_EPS)

    def forward(self, patches: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """patches (N, C) in [0, 1], positions (N, 2) long as (x, y) of the merged patches -> (N, U)."""
        x = patches.to(self.patch_dense.weight.dtype)
        h = self.patch_ln2(self.patch_dense(self.patch_ln1(x)))  # (N, C) -> (N, U)
        table = self.pos_embedding
        position = table[positions[:, 0], 0] + table[positions[:, 1], 1]  # (N, U): the x row plus the y row
        return self.pos_norm(h + position)
