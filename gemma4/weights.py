"""Loading the official safetensors checkpoints: one explicit name table and a streaming loader.

Facts a reader must know (gemma4/README.md §17):
- Official targets are multimodal files: text tensors start with `model.language_model.`, and the
  vision/audio towers beside them are never read. A bare text file uses the prefix `model.`.
- A checkpoint is one `model.safetensors` or shards listed in `model.safetensors.index.json`.
- No `lm_head.weight` is stored: the head is tied to `embed_tokens`.
- The model is built on the meta device and each tensor goes straight from its shard into the module
  (`assign=True`), so peak memory stays near the size of the text weights. safetensors hands out
  views of the memory-mapped file: a tensor already in the requested dtype is not even copied, its
  pages are read from the file (or the page cache) when first used.
- The PLE table (E2B: 262144 x 8960, the largest tensor) is only ever read a row per token. On the CPU
  it keeps the file's dtype and stays memory-mapped; rows are cast when looked up (a cast commutes with
  a row lookup, so the numbers are the same). A bfloat16 E2B run in float32 so skips a 9.4 GB copy.
- Only safetensors are read. Pickled `.bin`/`.pt` files are refused, never unpickled.
- The loaders then prepare every projection once (`prepare_weights`, gemma4/packing.py): q/k/v and gate/up
  stacked, and on the CPU a packed copy where timing it on this machine says so (`pack=False`: never),
  each read through a mapping of its own so that what is kept replaces the file's pages in resident
  memory instead of doubling them.
"""

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from gemma4.config import ConfigError, TextConfig, read_json, text_config_from_dict, text_fields
from gemma4.model import MLP, Attention, Gemma4Model
from gemma4.packing import VERIFY_ROWS, Choice, Linear, Prepared, Product, forced, measure

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or does not match its config."""


# ---------------------------------------------------------------- the name table

def target_weight_table(c: TextConfig) -> dict[str, tuple[int, ...]]:
    """Module key -> shape, for every tensor the text model owns (checkpoint name = prefix + key)."""
    e, p, lp = c.hidden_size, c.ple_dim, c.num_layers * c.ple_dim
    table: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (c.vocab_size, e), "norm.weight": (e,)}
    if p:
        table["embed_tokens_per_layer.weight"] = (c.ple_vocab_size, lp)
        table["per_layer_model_projection.weight"] = (lp, e)
        table["per_layer_projection_norm.weight"] = (p,)
    for i in range(c.num_layers):
        d, kv, width, pre = c.head_dims[i], c.kv_heads[i], c.mlp_width(i), f"layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            table[pre + norm + ".weight"] = (e,)
        table[pre + "layer_scalar"] = (1,)
        table[pre + "self_attn.q_proj.weight"] = (c.num_heads * d, e)
        table[pre + "self_attn.q_norm.weight"] = (d,)
        table[pre + "self_attn.o_proj.weight"] = (e, c.num_heads * d)
        if not c.is_shared(i):
            table[pre + "self_attn.k_proj.weight"] = (kv * d, e)
            table[pre + "self_attn.k_norm.weight"] = (d,)
            if c.has_v_proj(i):
                table[pre + "self_attn.v_proj.weight"] = (kv * d, e)
        table[pre + "mlp.gate_proj.weight"] = (width, e)
        table[pre + "mlp.up_proj.weight"] = (width, e)
        table[pre + "mlp.down_proj.weight"] = (e, width)
        if p:
            table[pre + "per_layer_input_gate.weight"] = (p, e)
            table[pre + "per_layer_projection.weight"] = (e, p)
            table[pre + "post_per_layer_input_norm.weight"] = (e,)
        if c.enable_moe:
            x, w = c.num_experts, c.moe_intermediate_size
            table[pre + "router.proj.weight"] = (x, e)
            table[pre + "router.scale"] = (e,)
            table[pre + "router.per_expert_scale"] = (x,)
            table[pre + "experts.gate_up_proj"] = (x, 2 * w, e)
            table[pre + "experts.down_proj"] = (x, e, w)
            for norm in ("pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                         "post_feedforward_layernorm_2"):
                table[pre + norm + ".weight"] = (e,)
    return table


def target_ignored(c: TextConfig) -> set[str]:
    """Keys a file may carry that the model does not use: K/V weights of KV-shared layers."""
    return {f"layers.{i}.self_attn.{n}.weight" for i in range(c.first_shared_layer, c.num_layers)
            for n in ("k_proj", "v_proj", "k_norm", "v_norm")}


# ---------------------------------------------------------------- finding the files

def resolve_model_dir(path_or_id: str | Path) -> Path:
    """A local directory as it is, or a Hub id downloaded (config, tokenizer, text shards only)."""
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return path
    text = str(path_or_id)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise CheckpointError(f"{text} is not a directory with a checkpoint, nor a Hub id like 'google/gemma-4-E2B-it'")
    return _download(text)


def _download(repo_id: str) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    def fetch(name: str, required: bool = True) -> Path | None:
        try:
            return Path(hf_hub_download(repo_id, name))
        except Exception as e:  # noqa: BLE001 (whatever the Hub client raises becomes one line)
            if not required:
                return None
            if isinstance(e, EntryNotFoundError) and not isinstance(e, LocalEntryNotFoundError):
                raise CheckpointError(f"Hub repo {repo_id} has no {name}") from None
            if isinstance(e, RepositoryNotFoundError):
                raise CheckpointError(f"Hub repo {repo_id} does not exist or is gated: check the id, log in") from None
            raise CheckpointError(
                f"cannot fetch {repo_id}/{name} from the Hugging Face Hub ({type(e).__name__}): connect, "
                f"log in if the repo is gated, or download it elsewhere and pass the local directory"
            ) from None

    config = fetch("config.json")
    for name in SIDE_FILES[1:]:
        fetch(name, required=False)
    index = fetch(INDEX, required=False)
    if index is None:
        fetch(SINGLE)
    else:  # only the shards that hold text tensors
        weight_map = json.loads(index.read_text())["weight_map"]
        _, prefix = text_fields(read_json(config))
        for shard in sorted({f for n, f in weight_map.items() if n.startswith(prefix)}):
            fetch(shard)
    return config.parent


def checkpoint_index(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it."""
    if (model_dir / INDEX).is_file():
        try:
            weight_map = json.loads((model_dir / INDEX).read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{model_dir / INDEX} is not a valid shard index ({e})") from None
        for shard in set(weight_map.values()):
            if not (model_dir / shard).is_file():
                raise CheckpointError(f"shard {shard} listed in {INDEX} is missing from {model_dir}")
        return {name: model_dir / shard for name, shard in weight_map.items()}
    if (model_dir / SINGLE).is_file():
        return dict.fromkeys(_open(model_dir / SINGLE).keys(), model_dir / SINGLE)
    pickles = [p.name for p in model_dir.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
    if pickles:
        raise CheckpointError(
            f"{model_dir} has only pickled weights ({pickles[0]}); they are never unpickled here: "
            f"convert them to model.safetensors"
        )
    raise CheckpointError(f"{model_dir} has no {SINGLE} or {INDEX}")


def _open(file: Path):  # noqa: ANN202 (safetensors' handle type is private)
    try:
        return safe_open(str(file), framework="pt")
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{file} is truncated or not a safetensors file ({e}): download it again") from None


def _read(handle, file: Path, name: str) -> torch.Tensor:  # noqa: ANN001 (safetensors' handle type is private)
    try:
        return handle.get_tensor(name)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{file} is truncated or corrupt at {name} ({e}): download it again") from None


# ---------------------------------------------------------------- streaming into a meta model

def read_state_dict(
    model_dir: Path, table: dict[str, tuple[int, ...]], prefix: str, ignored: set[str],
    owned: Callable[[str], bool], dtype: torch.dtype, device: torch.device | str,
    keep_dtype: frozenset[str] = frozenset(),
) -> dict[str, torch.Tensor]:
    """Every `prefix + key` of `table`, checked for shape and cast to dtype (floating tensors only).

    `owned(name)` says which file tensors belong to this model: the others (vision, audio) are
    never read. An owned tensor that is neither in the table nor ignored is an error. Keys in
    `keep_dtype` keep the file's dtype (and, on the CPU, stay views of the memory-mapped file).
    """
    index = checkpoint_index(model_dir)
    missing = [prefix + k for k in table if prefix + k not in index]
    if missing:
        raise CheckpointError(f"tensor {missing[0]} is missing from {model_dir} ({len(missing)} missing in all)")
    expected = {prefix + k for k in table} | {prefix + k for k in ignored}
    unexpected = sorted(n for n in index if owned(n) and n not in expected)
    if unexpected:
        raise CheckpointError(f"unexpected tensor {unexpected[0]} in {model_dir}: the config does not call for it")
    state: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for key in table:
        by_file.setdefault(index[prefix + key], []).append(key)
    for file, keys in by_file.items():
        handle = _open(file)
        for key in keys:
            name = prefix + key
            shape = tuple(handle.get_slice(name).get_shape())
            if shape != table[key]:
                raise CheckpointError(f"tensor {name} has shape {list(shape)}, the config implies {list(table[key])}")
            tensor = _read(handle, file, name)  # a view of the mapped file: no byte is read yet
            wanted = dtype if tensor.is_floating_point() and key not in keep_dtype else tensor.dtype
            if wanted != tensor.dtype:
                # Pages a cast reads stay resident as long as their mapping lives: read them through a
                # mapping of their own, gone with the cast, not through `handle`, which lives on in the
                # tensors kept as views.
                tensor = _read(_open(file), file, name)
            state[key] = tensor.to(device=device, dtype=wanted)
    return state


def stacks(model: nn.Module) -> list[tuple[list[str], object, str]]:
    """Every product of `model` as the loader prepares it: (the parameter keys it stacks by rows, the module that
    holds it, the attribute). q/k/v of a layer with its own K/V and gate/up are one product; any other
    `Linear` is its own."""
    out, stacked = [], set()
    for name, module in model.named_modules():
        pre = name + "." if name else ""
        if isinstance(module, Attention) and not module.shared:
            keys = ["q_proj", "k_proj"] + (["v_proj"] if module.has_v_proj else [])
            out.append(([f"{pre}{k}.weight" for k in keys], module, "qkv"))
        elif isinstance(module, MLP):
            keys = ["gate_proj", "up_proj"]
            out.append(([f"{pre}{k}.weight" for k in keys], module, "gate_up"))
        else:
            continue
        stacked |= {f"{pre}{k}" for k in keys}
    out += [([name + ".weight"], m, "product") for name, m in model.named_modules()
            if isinstance(m, Linear) and name not in stacked]
    return out


def _replace(model: nn.Module, key: str, tensor: torch.Tensor) -> None:
    """Parameter `key` of `model` becomes `tensor` (a view of the file, or of a stack), without gradients."""
    module, _, name = key.rpartition(".")
    setattr(model.get_submodule(module), name, nn.Parameter(tensor, requires_grad=False))


@torch.no_grad()
def prepare_weights(
    model: nn.Module, model_dir: Path, prefix: str, head: str | None, pack: bool | None = None,
    rows: int = VERIFY_ROWS,
) -> tuple[Product | None, list[Choice]]:
    """Once, after loading: every product of `model` (`stacks`) made plain or packed (gemma4/packing.py), and
    the attention norms' stacked weights. Returns the product of the tied head `head` (a key of `model`; the
    model keeps it as its own attribute) and the packing decisions, one per (shape, dtype).

    `pack`: None times plain against packed for 1 and `rows` rows and packs where packed is faster for both
    (the loaders' default), False never packs, True packs wherever oneDNN can (tests force both branches).

    Memory: each product is made from its tensors read through a mapping of their own, gone once it is made:
    pages a mapping has read stay resident as long as it lives, and the model's views keep theirs alive.
    - Packed: the parameters stay unread views of the file, so resident memory holds the packed copy alone.
      A weight the loader cast (a bfloat16 file run in float32) is a private copy: it is replaced by the
      file's view in the file's dtype (unread; `linear`'s plain fallback casts it per call). The tied head
      cannot be replaced (the embedding reads its rows in the model's dtype): a cast head keeps both.
    - Plain and stacked: the parameters become views of the stacked rows, so again one copy is held.
    - Plain and alone: the parameter itself is multiplied, as loaded.
    """
    index = checkpoint_index(model_dir)
    handles = {}  # file -> the mapping the replacing views keep alive
    choices: dict[tuple[tuple[int, ...], torch.dtype], Choice] = {}
    head_product = None
    groups = stacks(model) + ([([head], None, "")] if head is not None else [])
    for keys, owner, attribute in groups:
        parts = [model.get_parameter(key) for key in keys]  # one group at a time: a replaced cast is freed early
        stored = [_read(_open(index[prefix + key]), index[prefix + key], prefix + key) for key in keys]  # own mappings
        cast = stored[0].dtype != parts[0].dtype
        values = torch.cat([t.to(parts[0].device, parts[0].dtype) for t in stored])  # (O1 + O2 + .., I)
        del stored
        blocked = None
        signature = (tuple(values.shape), values.dtype)
        if signature not in choices:
            if pack is None:
                choices[signature], blocked = measure(values, rows)
            else:
                choices[signature] = forced(values, pack)
        if choices[signature].packed:
            if cast and owner is not None:
                for key in keys:  # the file's view in its own dtype, nothing read yet
                    file = index[prefix + key]
                    _replace(model, key, _read(handles.setdefault(file, _open(file)), file, prefix + key))
            product = Product(tuple(model.get_parameter(key) for key in keys), values, True, blocked)
        elif len(keys) > 1:  # the parameters become views of the stack's rows
            for key, rows_of_key in zip(keys, values.split([part.shape[0] for part in parts])):
                _replace(model, key, rows_of_key)
            product = Product(tuple(model.get_parameter(key) for key in keys), values, False)
        else:
            product = Product((parts[0],), parts[0], False)  # as loaded: a view of the file, or the cast copy
        del values
        if owner is None:
            head_product = product
        else:
            setattr(owner, attribute, product)
    for module in model.modules():
        if isinstance(module, Attention) and not module.shared:
            module.norms = Prepared((module.q_norm.weight, module.k_norm.weight), module.norm_weights())
    return head_product, list(choices.values())


def load_target(
    path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", pack: bool = True,
) -> Gemma4Model:
    """The Gemma 4 text model of a local directory or Hub id, in eval mode, without gradients, its products
    prepared (`prepare_weights`): packed on the CPU where measured faster, never with `pack=False`."""
    model_dir = resolve_model_dir(path)
    if not (model_dir / "config.json").is_file():
        raise CheckpointError(f"{model_dir} has no config.json")
    fields, prefix = text_fields(read_json(model_dir / "config.json"))
    config = text_config_from_dict(fields)
    table = target_weight_table(config)

    def owned(name: str) -> bool:
        return name.startswith(prefix) and not name.startswith(("model.vision_tower.", "model.embed_vision.",
                                                                "model.audio_tower.", "model.embed_audio."))

    on_cpu = torch.device(device).type == "cpu"  # elsewhere the table is copied to the device anyway
    keep = frozenset({"embed_tokens_per_layer.weight"} if on_cpu else ())
    state = read_state_dict(model_dir, table, prefix, target_ignored(config), owned, dtype, device, keep)
    with torch.device("meta"):
        model = Gemma4Model(config)
    model.load_state_dict(state, strict=True, assign=True)
    del state  # the model holds every tensor now; a cast that packing replaces must not live on here
    model.eval().requires_grad_(False)
    model.head_product, model.packing = prepare_weights(model, model_dir, prefix, "embed_tokens.weight",
                                                        None if pack else False)
    return model


__all__ = ["CheckpointError", "ConfigError", "load_target", "prepare_weights", "read_state_dict", "resolve_model_dir"]
