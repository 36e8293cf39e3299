"""The oracle of the equivalence tests: greedy decoding that is obviously correct because it keeps nothing between
steps. Every new token recomputes the whole sequence without a cache (`Gemma4Model.forward`), so no cache, ring,
rollback or batch can be wrong in it."""

import torch

from gemma4.model import Gemma4Model


@torch.inference_mode()
def reference_greedy(
    model: Gemma4Model, prompt: list[int], max_new_tokens: int, stop_ids: list[int] | tuple[int, ...] = (),
) -> list[int]:
    """Obviously correct and slow: recompute the whole sequence for every new token, no cache."""
    seq = list(prompt)
    for _ in range(max_new_tokens):
        token = int(model(seq).logits[-1].argmax())  # the one row, from position 0, no cache
        seq.append(token)
        if token in stop_ids:
            break
    return seq[len(prompt):]
