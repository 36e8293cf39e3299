"""`make_fast`: what the loaders do after building a model: every projection prepared once, plain or packed,
and the fast modules swapped in (gemma4/fast/modules.py, gemma4/fast/norms.py). The model's own files never import this.

Memory: each product is made from its tensors read through a mapping of their own, gone once it is made:
pages a mapping has read stay resident as long as it lives, and the model's views keep theirs alive.
- Packed: the parameters stay unread views of the file, so resident memory holds the packed copy alone. A
  weight the loader cast (a bfloat16 file run in float32) is a private copy: it is replaced by the file's view
  in the file's dtype (unread). The tied head cannot be replaced (the embedding reads its rows in the model's
  dtype): a cast head keeps both.
- Plain and stacked: the parameters become views of the stacked rows, so again one copy is held.
- Plain and alone: the parameter itself is multiplied, as loaded.
- Int4 (gemma4/fast/int4.py): the kernel's packed copy is made from the file's words and scales, read through
  a mapping of their own; the layer's buffers stay unread views. A layer quantized at load has no file words:
  its own buffers are read, and both copies are held.
"""

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from gemma4.fast.experts import by_token, gather_experts
from gemma4.fast.int4 import FastInt4Linear, Int4Product, PlannedInt4Linear, int4_product
from gemma4.fast.kernels import Choice, Product, choose, forced, library_of
from gemma4.fast.modules import (FastHead, FastLinear, GateLinear, QueryAttention, StackedAttention, StackedMLP, adopt,
                                 row_by_row)
from gemma4.fast.norms import FastRMSNorm
from gemma4.fast.rows import RowPlan, measure
from gemma4.fast.sampling import WHOLE_ROWS
from gemma4.fast.staging import StagedRows
from gemma4.config import ConfigError
from gemma4.int4 import Int4Linear, quantize
from gemma4.model import MLP, Attention, Gemma4Model
from gemma4.norms import RMSNorm
from gemma4.weights import Progress, Reader


def groups(model: nn.Module) -> list[tuple[str, list[str]]]:
    """(module name, the parameter keys its product stacks by rows): q/k/v of an attention layer with its own K/V,
    gate/up of an MLP, and every other `nn.Linear` or int4 layer alone. A group whose members are not all of one
    kind (an int4 file that leaves one of them floating point) is not stacked: each member multiplies alone."""
    out, stacked = [], set()
    for name, module in model.named_modules():
        if isinstance(module, Attention) and not module.shared:
            children = ["q_proj", "k_proj"] + (["v_proj"] if module.has_v_proj else [])
        elif isinstance(module, MLP):
            children = ["gate_proj", "up_proj"]
        else:
            continue
        if len({type(module.get_submodule(child)) for child in children}) > 1:
            continue
        out.append((name, [f"{name}.{child}.weight" for child in children]))
        stacked |= {f"{name}.{child}" for child in children}
    return out + [(name, [name + ".weight"]) for name, m in model.named_modules()
                  if isinstance(m, (nn.Linear, Int4Linear)) and name not in stacked]


def _replace_parameter(model: nn.Module, key: str, tensor: torch.Tensor) -> None:
    module, _, name = key.rpartition(".")
    setattr(model.get_submodule(module), name, nn.Parameter(tensor, requires_grad=False))


def _swap(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, new)


@torch.no_grad()
def make_fast(model: nn.Module, read: Reader, head: tuple[str, str] | None,
              kernels: tuple[str, str] | None = None, progress: Progress | None = None,
              quantize_head: str | None = None) -> list[Choice]:
    """Prepare every product of `model` (`groups`, and the tied head `head` = (head module, weight key)) and swap
    in the fast modules. Returns the kernel decisions, one per (shape, dtype).

    `kernels`: None takes the rule's kernels (`choose`: the device, dtype and shape decide, no timing); a pair
    (1 row, 2 or more), e.g. ("packed", "packed") or ("mkl", "onednn"), forces those kernels wherever oneDNN can
    (tests force every choice).

    `quantize_head="int4"`: the tied head multiplies by an int4 copy of the embedding (`int4_head`), which
    changes logits and so may change tokens; the embedding itself stays as loaded."""
    choices: dict[tuple[tuple[int, ...], torch.dtype], Choice] = {}
    described: dict[tuple, Choice] = {}  # one decision object per (shape, dtype, kernels), its row plan written in
    todo = groups(model) + ([(head[0], [head[1]])] if head is not None else [])
    for name, keys in todo if progress is None else progress(todo, "preparing the speed layer", len(todo)):
        if isinstance(model.get_submodule(keys[0].removesuffix(".weight")), Int4Linear):
            product, choice = int4_group(model, [key.removesuffix(".weight") for key in keys], read)
            if product is not None:
                choice = planned(product, product.multiply, choice.shape, product.dtype, product.device,
                                 choice, described)
                _swap_product(model, name, product)
            else:  # the textbook layers stay, row-planned, and carry the decision for `kernels_of`
                choice = [dequantizing(model, key.removesuffix(".weight"), choice, described) for key in keys][0]
            choices.setdefault((choice.shape, choice.dtype), choice)
            continue
        parts = [model.get_parameter(key) for key in keys]  # one group at a time: a replaced cast is freed early
        # On the CPU, the file's tensors through mappings of their own (see above); on a GPU, the parameters
        # already there: nothing is read or uploaded twice.
        on_cpu = parts[0].device.type == "cpu"
        stored = [read(key, False) for key in keys] if on_cpu else list(parts)
        cast = stored[0].dtype != parts[0].dtype
        stored = [t.to(parts[0].device, parts[0].dtype) for t in stored]  # no copy where they already are
        values = torch.cat(stored) if len(stored) > 1 else stored[0]  # (O1 + O2 + .., I)
        del stored
        is_head = head is not None and name == head[0]
        if is_head and quantize_head:
            product, choice = int4_head(values, parts[0].dtype)
            del values
            choices[(choice.shape, choice.dtype)] = planned(product, product.multiply, choice.shape, product.dtype,
                                                            product.device, choice, described)
            _swap(model, name, FastHead(product))
            continue
        signature = (tuple(values.shape), values.dtype)
        if signature not in choices:
            choices[signature] = choose(values) if kernels is None else forced(values, kernels)
        choice = choices[signature]
        if choice.packed:
            if cast and not is_head and on_cpu:
                for key in keys:  # the file's view in its own dtype, nothing read yet
                    _replace_parameter(model, key, read(key, True))
            product = Product(values, True, choice=choice)
        elif len(keys) > 1:  # the parameters become views of the stack's rows
            for key, rows_of_key in zip(keys, values.split([part.shape[0] for part in parts])):
                _replace_parameter(model, key, rows_of_key)
            product = Product(values, False, onednn=choice.onednn, choice=choice)
        else:  # as loaded: a view of the file, or the cast copy
            product = Product(parts[0], False, onednn=choice.onednn, choice=choice)
        del values
        choices[signature] = planned(product, product.multiply, choice.shape, product.dtype, product.device, choice,
                                     described)
        if is_head:
            _swap(model, name, FastHead(product))
        else:
            _swap_product(model, name, product)
    for name, module in list(model.named_modules()):
        if type(module) is RMSNorm:  # the same weight, normed in fewer calls (gemma4/fast/norms.py)
            _swap(model, name, FastRMSNorm(module))
        elif type(module) is Attention:  # a layer with no stacked product (KV-shared): its queries one by one
            _swap(model, name, adopt(QueryAttention, module))
        elif name.endswith("masked_embedding"):  # a drafter's centroid head
            _swap(model, name, row_by_row(module))
    device = next(model.parameters()).device.type
    if device != "cpu":
        for_a_device(model, pin=device == "cuda")
    else:
        by_token(model)  # a step's tokens through their experts one by one: the decode step's bits
    if device == "cuda":
        choose_attention()
    return list(choices.values())


# Row plans measured in this process (gemma4/fast/rows.py): a plan depends on the kernel, the shape, the dtype, the
# device and the thread count alone, so a second model with the same products is not measured again.
PLANS: dict[tuple, RowPlan] = {}


def planned(prepared: Any, multiply: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, int],
            dtype: torch.dtype, device: torch.device, choice: Choice, described: dict[tuple, Choice]) -> Choice:
    """Give `prepared` (a product, or an int4 layer no kernel takes) the row plan of `multiply`, its one-call
    product of weight shape (O, I) for activations of `dtype` on `device`, and its decision with the plan written
    in, one object per kind."""
    key = (shape, dtype, choice.kernels, device.type, torch.get_num_threads())
    if key not in PLANS:
        PLANS[key] = measure(multiply, shape[1], dtype, device, library_of(choice, dtype, device))
    prepared.plan = PLANS[key]
    prepared.choice = described.setdefault(key[:3], replace(choice, rows=prepared.plan.describe()))
    return prepared.choice


def _swap_product(model: nn.Module, name: str, product: Product | Int4Product) -> None:
    """The fast module for `name` (an attention, an MLP, or one linear layer) multiplying by `product`."""
    module = model.get_submodule(name)
    if isinstance(module, Attention):
        _swap(model, name, StackedAttention.replacing(module, product))
    elif isinstance(module, MLP):
        _swap(model, name, StackedMLP.replacing(module, product))
    elif isinstance(module, Int4Linear):
        _swap(model, name, FastInt4Linear(module, product))
    elif name.endswith("per_layer_input_gate"):
        _swap(model, name, GateLinear(module, product))
    else:
        _swap(model, name, FastLinear(module, product))


# Rows of the head quantized at a time: the recipe's temporaries for the whole (262,144, 1,536) E2B head would be
# several GB (its nibbles are packed through int64); 16,384 rows take tens of MB.
HEAD_ROWS = 16384


def int4_head(weight: torch.Tensor, dtype: torch.dtype) -> tuple[Int4Product, Choice]:
    """The tied head's weight (V, E) as an int4 product for activations of `dtype`, by the release recipe
    (gemma4/int4.py `quantize`: symmetric, a bf16 scale per group of 32, round to nearest) in the weight's dtype.
    Bytes a step reads: 0.31 of bfloat16's (0.5 a weight and a scale and a zero per 32). Raises ConfigError where
    no int4 kernel takes it (its size, the dtype or the device)."""
    words, scales = zip(*(quantize(rows) for rows in weight.split(HEAD_ROWS)))  # (V, E/8) and (V, G) in pieces
    product, choice = int4_product(torch.cat(words), torch.cat(scales), dtype)
    if product is None:
        raise ConfigError(f"quantize_head='int4': {choice.why}; there the head cannot be quantized, drop it")
    return product, replace(choice, why=choice.why + ", the tied head quantized at load")


def dequantizing(model: nn.Module, name: str, choice: Choice, described: dict[tuple, Choice]) -> Choice:
    """The int4 layer `name`, which no kernel takes, as a `PlannedInt4Linear`: the textbook's dequantizing forward
    with a row plan. Returns its decision, the plan written in."""
    layer = adopt(PlannedInt4Linear, model.get_submodule(name))
    multiply = Int4Linear.forward.__get__(layer)  # the textbook's call, without the plan
    shape = (layer.out_features, layer.in_features)
    choice = planned(layer, multiply, shape, dtype_of(model), layer.weight_packed.device, choice, described)
    _swap(model, name, layer)
    return choice


def dtype_of(model: nn.Module) -> torch.dtype:
    """The activations' dtype: the embedding's (only a target has int4 layers)."""
    return model.embed_tokens.weight.dtype


def int4_group(model: nn.Module, names: list[str], read: Reader) -> tuple[Int4Product | None, Choice]:
    """The int4 layers `names` (stacked by rows when several) as one int4 product, in the model's dtype."""
    dtype = dtype_of(model)
    words, scales = [], []
    for name in names:
        layer = model.get_submodule(name)
        for stored, out in ((f"{name}.weight_packed", words), (f"{name}.weight_scale", scales)):
            tensor = getattr(layer, stored.rpartition(".")[2])
            if tensor.device.type == "cpu":
                try:  # the file's own tensor through a mapping of its own (see above)
                    tensor = read(stored, False)
                except KeyError:  # quantized at load: not in the file
                    pass
            out.append(tensor.to(layer.weight_packed.device))
    return int4_product(torch.cat(words), torch.cat(scales), dtype)  # (O1 + O2 + .., I/8), (O1 + .., G)


def for_a_device(model: nn.Module, pin: bool) -> None:
    """What a model off the CPU gets, where a read of the device waits for its queue to drain: MoE experts gathered
    one call a layer (gemma4/fast/experts.py); and, on a target, its own sampling rule, rows kept whole with no
    `nonzero` (gemma4/fast/sampling.py), and the PLE table's rows staged through `pin`ned memory (staging.py).
    Each is this model's: another model in the process keeps its own."""
    gather_experts(model)
    if isinstance(model, Gemma4Model):
        model.sampling = WHOLE_ROWS
        if model.config.ple_dim:
            model.per_layer_rows = StagedRows(model, pin=pin)


def choose_attention(cudnn: bool = False) -> None:
    """CUDA: attention by the flash, memory-efficient or math kernels, not cuDNN's, unless `cudnn`. Recent torch
    tries cuDNN's scaled-dot-product attention first on H100/H200, and it builds one graph per key length: the
    sliding layers and the drafter read a new key length every step until the window fills. A process-wide switch
    (`torch.backends.cuda.enable_cudnn_sdp`), set when a model is made fast on CUDA; the device check times both."""
    torch.backends.cuda.enable_cudnn_sdp(cudnn)


def products(model: nn.Module) -> list[Product | Int4Product]:
    """Every prepared product of a fast model, in module order."""
    out = []
    for module in model.modules():
        for attribute in ("product", "qkv", "gate_up"):
            if isinstance(getattr(module, attribute, None), (Product, Int4Product)):
                out.append(getattr(module, attribute))
    return out


def kernels_of(model: nn.Module) -> list[Choice]:
    """The kernel decisions of a fast model, one per (shape, dtype), each with its reason; [] if plain."""
    seen: dict[tuple[tuple[int, ...], str], Choice] = {}
    for product in products(model):
        seen.setdefault((product.choice.shape, product.choice.dtype), product.choice)
    for module in model.modules():  # int4 layers no kernel takes (gemma4/fast/int4.py)
        if isinstance(module, Int4Linear) and hasattr(module, "choice"):
            seen.setdefault((module.choice.shape, module.choice.dtype), module.choice)
    return list(seen.values())
