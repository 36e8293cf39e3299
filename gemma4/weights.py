"""Loading the official safetensors checkpoints: one explicit name table and a streaming loader.

Facts a reader must know (gemma4/README.md §17):
- Official targets are multimodal files: text tensors start with `model.language_model.`, and the
  vision/audio towers beside them (the 12B's encoder-free `model.vision_embedder.` and
  `model.embed_vision.` included) are never read. A bare text file uses the prefix `model.`.
- A checkpoint is one `model.safetensors` or shards listed in `model.safetensors.index.json`.
- No `lm_head.weight` is stored: the head is tied to `embed_tokens`.
- The model is built on the meta device and each tensor goes straight from its shard into the module
  (`assign=True`), so peak memory stays near the size of the text weights. safetensors hands out
  views of the memory-mapped file: a tensor already in the requested dtype is not even copied, its
  pages are read from the file (or the page cache) when first used.
- The PLE table (E2B: 262144 x 8960, the largest tensor) is only ever read a row per token. It keeps the
  file's dtype and stays in host memory (memory-mapped; pinned for a GPU, which gets only the rows of each
  step); rows are cast when looked up (a cast commutes with a row lookup, so the numbers are the same). A
  bfloat16 E2B run in float32 so skips a 9.4 GB copy, and a GPU holds none of its 4.7 GB.
- Only safetensors are read. Pickled `.bin`/`.pt` files are refused, never unpickled.
- Google's QAT w4a16 files (gemma4/int4.py) store most projections as int4 triples (`M.weight_packed`,
  `M.weight_scale`, `M.weight_shape` in place of `M.weight`): the file says which, and those layers are built as
  `Int4Linear` and loaded packed. `quantize="int4"` turns a floating-point file's same layers into that layout
  as each tensor is read, so the floating-point weights are never all in memory (a layer whose inputs are not
  a multiple of 32 stays floating point: none in the releases). A dense `lm_head.weight` beside
  the text model (the 31B's files may carry one) is compared with the embedding: equal, it is the tied head and
  is not read again; different, the file is refused.
- The loaders build the textbook's modules of gemma4/model.py unless asked for the speed layer (`fast=True`,
  gemma4/fast/, as the commands ask): q/k/v and gate/up stacked, and on the CPU a packed copy where the rule of
  gemma4/fast/kernels.py says so; the same tokens. gemma4/fast/ is imported only then, inside the loader.
"""

import json
import socket
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from gemma4.config import ConfigError, TextConfig
from gemma4.config_file import read_json, target_config, text_fields
from gemma4.model import Gemma4Model

if TYPE_CHECKING:  # int4 files and tensor parallelism are imported when a load asks for them
    from gemma4.parallel.plan import Shard, Slice

# key -> the file's tensor: `fresh` through a mapping of its own (gone with the tensor), or `view` through one
# that lives on with the model's views (gemma4/fast/apply.py reads the file's tensors with it).
Reader = Callable[[str, bool], torch.Tensor]
# A wrapper the caller may give a loader to watch its long loops (the commands draw a bar on a terminal):
# progress(items, what, how many) yields the items.
Progress = Callable[[Iterable, str, int], Iterable]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or does not match its config."""


FLOATS = ("F64", "F32", "F16", "BF16")  # safetensors' names of the floating dtypes


def stored_dtypes(key: str) -> tuple[str, ...]:
    """The safetensors dtypes a tensor of this name-table key may have: int4 words are int32 (another integer
    width would read other nibbles), an int4 layer's shape and the drafter's token ordering are integers, every
    other tensor is floating point."""
    if key.endswith("weight_packed"):
        return ("I32",)
    if key.endswith(("weight_shape", "token_ordering")):
        return ("I64", "I32")
    return FLOATS


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
    return {f"layers.{i}.self_attn.{n}.{t}" for i in range(c.first_shared_layer, c.num_layers)
            for n in ("k_proj", "v_proj", "k_norm", "v_norm")
            for t in ("weight", "weight_packed", "weight_scale", "weight_shape")}


def load_modules(model_dir: Path, parts: list[tuple[type[nn.Module], dict[str, tuple[int, ...]], str]], config: object,
                 dtype: torch.dtype, device: torch.device | str) -> list[nn.Module]:
    """A media side's modules (each: class, name table, checkpoint prefix), built on the meta device from `config`
    and loaded from the same files as the text model, strictly, in eval mode, without gradients."""
    modules = []
    for cls, table, prefix in parts:
        state = read_state_dict(model_dir, table, prefix, set(), lambda name, p=prefix: name.startswith(p),
                                dtype, device)
        with torch.device("meta"):
            module = cls(config)
        module.load_state_dict(state, strict=True, assign=True)
        modules.append(module.eval().requires_grad_(False))
    return modules


# ---------------------------------------------------------------- finding the files

def resolve_model_dir(path_or_id: str | Path, images: bool = False, audio: bool = False) -> Path:
    """A local directory as it is, or a Hub id downloaded (config, tokenizer, text shards only; `images`, `audio`:
    also the processor config and the shards of the vision or audio side, gemma4/vision/, gemma4/audio/)."""
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return path
    text = str(path_or_id)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise CheckpointError(f"{text} is not a directory with a checkpoint, nor a Hub id like 'google/gemma-4-E2B-it'")
    return _download(text, images, audio)


IMAGE_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")
IMAGE_PREFIXES = ("model.vision_tower.", "model.vision_embedder.", "model.embed_vision.")
AUDIO_PREFIXES = ("model.audio_tower.", "model.embed_audio.")


class HubUnreachable(CheckpointError):
    """A Hub id whose files are neither in the cache nor reachable: `repo_id` names it (a command adds the other
    repos the run needs)."""

    def __init__(self, message: str, repo_id: str) -> None:
        super().__init__(message)
        self.repo_id = repo_id


def hub_reachable(endpoint: str, seconds: float = 5.0) -> bool:
    """Whether the Hub's host takes a connection within `seconds`. Without a network the Hub client retries each
    file for about 25 s before it fails; asked first, an offline run uses the cache alone and fails at once."""
    url = urllib.parse.urlsplit(endpoint)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=seconds).close()
        return True
    except OSError:
        return False


def _download(repo_id: str, images: bool = False, audio: bool = False) -> Path:
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    offline = constants.HF_HUB_OFFLINE or not hub_reachable(constants.ENDPOINT)  # then the Hub cache alone

    def fetch(name: str, required: bool = True) -> Path | None:
        try:
            return Path(hf_hub_download(repo_id, name, local_files_only=offline))
        except Exception as e:  # noqa: BLE001 (whatever the Hub client raises becomes one line)
            if not required:
                return None
            if offline:
                raise HubUnreachable(
                    f"{repo_id} is not on this machine ({name} is not in the Hugging Face cache) and the Hub cannot "
                    f"be reached: download it where there is a network (hf download {repo_id} --local-dir DIR) and "
                    f"pass that directory in place of the id", repo_id) from None
            if isinstance(e, EntryNotFoundError) and not isinstance(e, LocalEntryNotFoundError):
                raise CheckpointError(f"Hub repo {repo_id} has no {name}") from None
            if isinstance(e, RepositoryNotFoundError):
                raise CheckpointError(f"Hub repo {repo_id} does not exist or is gated: check the id, log in") from None
            raise CheckpointError(
                f"cannot fetch {repo_id}/{name} from the Hugging Face Hub ({type(e).__name__}): connect, "
                f"log in if the repo is gated, or download it elsewhere and pass the local directory"
            ) from None

    config = fetch("config.json")
    for name in SIDE_FILES[1:] + (IMAGE_FILES if images or audio else ()):
        fetch(name, required=False)
    index = fetch(INDEX, required=False)
    if index is None:
        fetch(SINGLE)
    else:  # only the shards that hold text tensors
        weight_map = json.loads(index.read_text())["weight_map"]
        _, prefix = text_fields(read_json(config))
        wanted = (prefix, *(IMAGE_PREFIXES if images else ()), *(AUDIO_PREFIXES if audio else ()))
        for shard in sorted({f for n, f in weight_map.items() if n.startswith(wanted)}):
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


def _read(handle, file: Path, name: str, cut: "Slice | None" = None) -> torch.Tensor:  # noqa: ANN001
    """The tensor `name` (a view of the mapped file), or only the ranges of `cut` along its dimension (a
    tensor-parallel rank's part, gemma4/parallel/plan.py: those bytes alone read, into a tensor of their own)."""
    try:
        if cut is None:
            return handle.get_tensor(name)
        from gemma4.parallel.plan import part

        return part(handle.get_slice(name), cut)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{file} is truncated or corrupt at {name} ({e}): download it again") from None


# ---------------------------------------------------------------- streaming into a meta model

def read_state_dict(
    model_dir: Path, table: dict[str, tuple[int, ...]], prefix: str, ignored: set[str],
    owned: Callable[[str], bool], dtype: torch.dtype, device: torch.device | str,
    host_keys: frozenset[str] = frozenset(), progress: Progress | None = None,
    as_stored: frozenset[str] = frozenset(), to_int4: frozenset[str] = frozenset(),
    cuts: "dict[str, Slice] | None" = None,
) -> dict[str, torch.Tensor]:
    """Every `prefix + key` of `table`, checked for shape and cast to dtype (floating tensors only, and not the
    keys `as_stored`, which keep the file's dtype: int4 scales).

    `owned(name)` says which file tensors belong to this model: the others (vision, audio) are
    never read. An owned tensor that is neither in the table nor ignored is an error. Keys in
    `host_keys` keep the file's dtype and stay in host memory: views of the memory-mapped file, or pinned
    copies for a model on a GPU (a step moves only the rows it reads). Elsewhere each tensor moves to the
    device in the file's dtype and is cast there, one at a time. `progress`: a wrapper to watch the tensors
    go by (the commands draw a bar). `to_int4`: weight keys quantized as they are read (gemma4/int4.py
    `quantize`), each replaced in the state by its int4 triple. `cuts`: key -> the part of it this rank of a
    tensor-parallel run reads (gemma4/parallel/plan.py), checked first against the whole tensor's shape.
    """
    cuts = cuts or {}
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
    reads = [(file, key) for file, keys in by_file.items() for key in keys]
    handles: dict[Path, Any] = {}  # one mapping of each file, for the views that stay
    for file, key in reads if progress is None else progress(reads, "reading tensors", len(reads)):
        if file not in handles:
            handles[file] = _open(file)
        handle = handles[file]
        name = prefix + key
        shape = tuple(handle.get_slice(name).get_shape())
        if shape != table[key]:
            raise CheckpointError(f"tensor {name} has shape {list(shape)}, the config implies {list(table[key])}")
        stored = handle.get_slice(name).get_dtype()
        if stored not in stored_dtypes(key):
            raise CheckpointError(f"tensor {name} is stored as {stored}, expected {' or '.join(stored_dtypes(key))}: "
                                  f"the file is not a checkpoint this config describes")
        # A view of the mapped file (no byte read yet), or a rank's part, read as it is cut into a tensor of its own.
        tensor = _read(handle, file, name, cuts.get(key))
        if key in host_keys:  # a view of the file: a step reads its rows (pinning it would lock the whole table)
            state[key] = tensor
            continue
        wanted = dtype if tensor.is_floating_point() and key not in as_stored else tensor.dtype
        if key not in cuts and (wanted != tensor.dtype or key in to_int4):
            # Pages a cast or a quantization reads stay resident as long as their mapping lives: read them
            # through a mapping of their own, gone with the result, not through `handle`, which lives on in
            # the tensors kept as views.
            tensor = _read(_open(file), file, name)
        if key in to_int4:  # its int4 triple in its place (gemma4/int4.py)
            from gemma4.int4 import packed_state

            base = key.removesuffix("weight")
            state |= {base + part: t for part, t in packed_state(tensor, table[key], device).items()}
            continue
        state[key] = tensor.to(device=device).to(dtype=wanted)
    return state


def file_reader(model_dir: Path, prefix: str, cuts: "dict[str, Slice] | None" = None) -> Reader:
    """What the speed layer reads the file's tensors with: `read(key, keep)`. Each tensor through a mapping of
    its own (`keep=False`: gone with the tensor), or through one that lives as long as the tensors kept. `cuts`:
    a tensor-parallel rank's parts, as `read_state_dict` takes them (read into tensors of their own)."""
    index, kept, cuts = checkpoint_index(model_dir), {}, cuts or {}

    def read(key: str, keep: bool) -> torch.Tensor:
        file = index[prefix + key]
        handle = kept.setdefault(file, _open(file)) if keep else _open(file)
        return _read(handle, file, prefix + key, cuts.get(key))
    return read


def check_head(model_dir: Path, prefix: str, index: dict[str, Path]) -> None:
    """A dense `lm_head.weight` beside the text model must equal the embedding the head is tied to (§5)."""
    if "lm_head.weight" not in index:
        return
    read = file_reader(model_dir, "")
    head, embedding = read("lm_head.weight", False), read(prefix + "embed_tokens.weight", False)
    if head.shape != embedding.shape or not all(
            torch.equal(a, b) for a, b in zip(head.split(4096), embedding.split(4096))):  # 4096 rows at a time
        raise CheckpointError(f"{model_dir}: lm_head.weight differs from embed_tokens.weight; a Gemma 4 head is tied "
                              f"to its embedding, so this is not a Gemma 4 checkpoint as released")


def load_target(
    path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", fast: bool = False,
    progress: Progress | None = None, quantize: str | None = None, shard: "Shard | None" = None,
    quantize_head: str | None = None,
) -> Gemma4Model:
    """The Gemma 4 text model of a local directory or Hub id, in eval mode, without gradients. `fast`: the speed
    layer swapped in (gemma4/fast/); `gemma4.fast.kernels_of(model)` lists the kernel decisions and why each
    was taken. `progress`: a wrapper to watch the tensors read and the products prepared (`Progress`).
    An int4 file (Google's w4a16 releases) loads its quantized layers packed; `quantize="int4"` makes a
    floating-point file's same layers int4 as they are read (gemma4/int4.py; a no-op on an int4 file).
    `shard`: this process is one rank of a tensor-parallel run (gemma4/parallel/): it reads its parts of the
    weights alone and its model reduces what they compute (Shard(0, 1): that path on one rank, as the device check
    runs it); None is the one-process model.
    `quantize_head="int4"` (with `fast`): the tied output head multiplies by an int4 copy of the embedding, made at
    load by the same recipe, about a third of the bytes a step reads there; logits change, and so may tokens
    (scripts/benchmark.md states how often its argmax agrees). The embedding stays as the file is."""
    if quantize not in (None, "int4"):
        raise ConfigError(f"quantize={quantize!r}: the one scheme is 'int4' (or None: as the file is)")
    if quantize_head not in (None, "int4"):
        raise ConfigError(f"quantize_head={quantize_head!r}: the one scheme is 'int4' (or None: as the file is)")
    if quantize_head and not fast:
        raise ConfigError("quantize_head='int4' is a product of the speed layer: load with fast=True")
    model_dir = resolve_model_dir(path)
    if not (model_dir / "config.json").is_file():
        raise CheckpointError(f"{model_dir} has no config.json")
    raw = read_json(model_dir / "config.json")
    config, prefix = target_config(raw)
    table = target_weight_table(config)
    index = checkpoint_index(model_dir)
    int4: list[str] = []  # the int4 layers' weight keys
    to_int4: frozenset[str] = frozenset()
    if quantize or raw.get("quantization_config") is not None:  # an int4 file, or a float one made int4
        from gemma4.int4 import int4_layers

        table, int4, to_int4 = int4_layers(raw, table, lambda key: prefix + key in index, quantize is not None)
    check_head(model_dir, prefix, index)
    whole, cuts = config, None
    if shard is not None:  # before a byte is read: the split checked, the same files on every rank
        from gemma4.parallel.group import rank_part

        cuts, config = rank_part(config, table, shard, model_dir, "target", int4=frozenset(int4))

    def owned(name: str) -> bool:
        return name.startswith(prefix) and not name.startswith(("model.vision_tower.", "model.embed_vision.",
                                                                "model.audio_tower.", "model.embed_audio."))

    host = frozenset({"embed_tokens_per_layer.weight"})  # E2B: 262144 x 8960; a step reads one row of it
    scales = frozenset(k.removesuffix("weight") + "weight_scale" for k in int4)  # int4 scales keep bf16
    state = read_state_dict(model_dir, table, prefix, target_ignored(config), owned, dtype, device, host, progress,
                            as_stored=scales, to_int4=to_int4, cuts=cuts)
    with torch.device("meta"):
        model = Gemma4Model(config)
    if int4:
        from gemma4.int4 import check_shapes, swap_in

        check_shapes(state, int4, target_weight_table(whole), target_weight_table(config), prefix)
        swap_in(model, int4)
    model.load_state_dict(state, strict=True, assign=True)
    del state  # the model holds every tensor now; a cast that packing replaces must not live on here
    model.eval().requires_grad_(False)
    if fast:
        from gemma4.fast import make_fast  # here, not at the top: the textbook's imports hold no speed layer

        make_fast(model, file_reader(model_dir, prefix, cuts), ("head", "embed_tokens.weight"), progress=progress,
                  quantize_head=quantize_head)
    if cuts is not None:
        from gemma4.parallel.reduce import parallelize

        parallelize(model)
    return model


__all__ = ["CheckpointError", "ConfigError", "HubUnreachable", "file_reader", "load_target", "read_state_dict", "resolve_model_dir"]
