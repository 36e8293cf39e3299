"""The one tolerance of the parity tests: float32 errors bound against a float64 run of the same checkpoint.

A constant like `atol=1e-4` means something else on every CPU: AVX2, AVX-512 and AMX kernels sum in
other orders, and fp32 logits move by different amounts. On a Zen 4 machine the MoE model's cached
steps were 1.2e-4 from transformers' because each was off float64 the other way (5e-5 and 9e-5). So
each parity test runs four models on the same input and asserts:

1. Same math: ours in float64 equals transformers in float64 to 1e-9 of the reference's size. float64
   rounding alone stays far below (3e-14 relative at most, measured); a wrong formula, or a step left
   in fp32 (~1e-7 per rounding), shows far above. Transformers' float64 run is tests/tf_oracle.py's.
2. Our fp32 error against that reference is at most RATIO times transformers' fp32 error on the same
   input on this CPU, or the fp32 floor below, whichever is larger. Both evaluate the same formulas
   layer by layer, so their roundings are of the same kind and number, and a CPU whose kernels round
   more makes both err more: the ratio, not the absolute error, is what holds across CPUs.
   RATIO = 4: the two maxima over hundreds to thousands of values differ by well under 2x (0.5x-1.5x
   over all the cases here, printed in the terminal summary); 4x leaves room for kernels that order
   sums differently (our packed products, TF's per-expert loop), while a wrong model is off by orders
   of magnitude more, and check 1 already pins the math to 1e-9.
The floor keeps the bound meaningful where transformers' own error happens to be small: see FLOOR.
Every comparison is recorded in tests/measured.py and printed after the run.
"""

import math

import torch

from tests.measured import PARITY, Parity

RATIO = 4.0
SAME_MATH = 1e-9  # max |ours float64 - transformers float64| / max |reference|
EPS32 = torch.finfo(torch.float32).eps  # 2^-23
# The floor: FLOOR * EPS32 * max|reference| * sqrt(depth). fp32 rounds every value to EPS32/2 of its
# size; the test logits and the hidden states that make them have the reference's scale; the `depth`
# layers add independent roundings, which grow like a random walk (sqrt); within a layer a dot
# product of H = 64 terms carries sqrt(64) = 8 roundings' worth, and about 8 such steps depend on
# each other (norm, q/k/v, attention, output, MLP in and out): 8 x 8 = 64. Measured on the test
# models, both implementations' errors are 3 to 195 such units, most under 64: the floor decides
# where transformers' error is small, the ratio where it is large.
FLOOR = 64.0


def assert_fp32_parity(test: str, case: str, ours: torch.Tensor, theirs: torch.Tensor, ours64: torch.Tensor,
                       theirs64: torch.Tensor, depth: int) -> None:
    """ours, theirs: the same output of our model and of transformers' in float32; ours64, theirs64: the
    same two in float64, of the same checkpoint and input. depth: the layers the values went through.
    test, case: what is compared and on which input, for the messages and the summary."""
    assert ours.dtype == theirs.dtype == torch.float32 and ours64.dtype == theirs64.dtype == torch.float64
    reference = theirs64
    scale = float(reference.abs().max())
    error, tf_error = float((ours.double() - reference).abs().max()), float((theirs.double() - reference).abs().max())
    floor = FLOOR * EPS32 * scale * math.sqrt(depth)
    bound = max(RATIO * tf_error, floor)
    PARITY.append(Parity(test, case, error, tf_error, floor, bound, float((ours64 - reference).abs().max()) / scale))
    torch.testing.assert_close(ours64, reference, atol=SAME_MATH * scale, rtol=0,
                               msg=lambda m: f"{test} [{case}], float64: {m}")
    torch.testing.assert_close(ours.double(), reference, atol=bound, rtol=0,
                               msg=lambda m: f"{test} [{case}], fp32 (transformers' own error {tf_error:.2e}): {m}")
