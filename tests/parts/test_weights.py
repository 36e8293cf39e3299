"""Loading the official layouts (multimodal and bare prefixes, single file and shards, fp32 and bf16,
both config forms) and every loading error, each with a message that names the problem."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gemma4 import CheckpointError, ConfigError, load_target
from gemma4.weights import target_weight_table
from mtp import load_drafter
from gemma4.engine.forward import forward_rows
from tests.checkpoints import write_target

PREFIX = "model.language_model."


@pytest.fixture(scope="module")
def e2b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_target(tmp_path_factory.mktemp("e2b"), "e2b")


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("layout", [
    dict(sharded=True), dict(multimodal=False), dict(official_config=True),
    dict(sharded=True, multimodal=False, official_config=True),
])
def test_layouts_load_the_same_weights(tmp_path: Path, e2b: Path, layout: dict) -> None:
    if layout.get("sharded"):
        write_target(tmp_path, "e2b", **layout)
        assert len(list(tmp_path.glob("model-*.safetensors"))) >= 2
    else:
        write_target(tmp_path, "e2b", **layout)
    reference, other = state(load_target(e2b)), state(load_target(tmp_path))
    assert reference.keys() == other.keys()
    for k in reference:
        torch.testing.assert_close(other[k], reference[k], atol=0, rtol=0, msg=k)


def test_bf16_file_loads_in_both_dtypes(tmp_path: Path, e2b: Path) -> None:
    write_target(tmp_path, "e2b", dtype=torch.bfloat16, sharded=True)
    as_bf16 = load_target(tmp_path, dtype=torch.bfloat16)
    assert as_bf16.embed_tokens.weight.dtype == torch.bfloat16
    as_fp32 = load_target(tmp_path, dtype=torch.float32)
    reference = load_target(e2b)
    w32, w16 = as_fp32.layers[0].mlp.up_proj.weight, as_bf16.layers[0].mlp.up_proj.weight
    assert torch.equal(w32, w16.float())  # the same file, only the dtype differs
    assert torch.equal(w16, reference.layers[0].mlp.up_proj.weight.bfloat16())  # the fp32 model rounded
    logits = forward_rows(as_bf16, torch.tensor([[2, 10, 20, 30]])).logits
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()  # a bfloat16 head is capped in float32


def test_vision_tensors_are_never_read(e2b: Path) -> None:
    names = load_file(e2b / "model.safetensors").keys()
    assert any(n.startswith("model.vision_tower.") for n in names)  # the fixture carries a vision tower
    assert all(not k.startswith("vision") for k in load_target(e2b).state_dict())


def rewrite(src: Path, dst: Path, edit) -> Path:  # noqa: ANN001
    """Copy a single-file checkpoint with its tensor dict edited."""
    dst.mkdir(exist_ok=True)
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors")
    return dst


def test_missing_tensor(tmp_path: Path, e2b: Path) -> None:
    name = PREFIX + "layers.3.self_attn.k_norm.weight"
    rewrite(e2b, tmp_path, lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=f"tensor {name} is missing"):
        load_target(tmp_path)


def test_misshaped_tensor(tmp_path: Path, e2b: Path) -> None:
    name = PREFIX + "layers.1.mlp.up_proj.weight"
    rewrite(e2b, tmp_path, lambda t: t.update({name: t[name][:-1].clone()}))
    with pytest.raises(CheckpointError, match=f"tensor {name} has shape"):
        load_target(tmp_path)


def test_unexpected_tensor(tmp_path: Path, e2b: Path) -> None:
    name = PREFIX + "layers.2.self_attn.extra.weight"
    rewrite(e2b, tmp_path, lambda t: t.update({name: torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=f"unexpected tensor {name}"):
        load_target(tmp_path)


def test_shared_layers_kv_tensors_are_ignored(tmp_path: Path, e2b: Path) -> None:
    # Layers 5..7 are KV-shared: a file may still carry their k/v weights; they are not used.
    name = PREFIX + "layers.6.self_attn.k_proj.weight"
    rewrite(e2b, tmp_path, lambda t: t.update({name: torch.zeros(16, 64)}))
    assert "layers.6.self_attn.k_proj.weight" not in load_target(tmp_path).state_dict()


def test_truncated_safetensors(tmp_path: Path, e2b: Path) -> None:
    rewrite(e2b, tmp_path, lambda t: None)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_target(tmp_path)


def test_garbage_safetensors(tmp_path: Path, e2b: Path) -> None:
    rewrite(e2b, tmp_path, lambda t: None)
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="truncated or not a safetensors file"):
        load_target(tmp_path)


def test_pickle_weights_are_refused_unopened(tmp_path: Path, e2b: Path) -> None:
    (tmp_path / "config.json").write_bytes((e2b / "config.json").read_bytes())
    # A pickle that would raise if it were ever unpickled.
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04cbuiltins\nexec\n(Vraise SystemExit(9)\ntR.")
    with pytest.raises(CheckpointError, match="only pickled weights.*never unpickled"):
        load_target(tmp_path)


def test_directory_without_weights(tmp_path: Path, e2b: Path) -> None:
    (tmp_path / "config.json").write_bytes((e2b / "config.json").read_bytes())
    with pytest.raises(CheckpointError, match="has no model.safetensors"):
        load_target(tmp_path)


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_target(tmp_path)


def test_path_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a directory"):
        load_target(tmp_path / "nowhere")


def test_missing_shard(tmp_path: Path) -> None:
    write_target(tmp_path, "dense", sharded=True)
    next(tmp_path.glob("model-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="shard .* is missing"):
        load_target(tmp_path)


def test_hub_id_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub.constants

    # The library reads HF_HUB_OFFLINE once, at import: set the value it consults.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(CheckpointError, match="nobody/no-such-gemma is not on this machine"):
        load_target("nobody/no-such-gemma")


def test_hub_id_without_a_network_fails_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without a network (here: the Hub's host refused), the cache alone is read: no retries, one clear line that
    says the files are not here and how to get them."""
    import huggingface_hub.constants

    import gemma4.weights

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused
    assert not gemma4.weights.hub_reachable(huggingface_hub.constants.ENDPOINT)
    with pytest.raises(CheckpointError, match=r"is not on this machine .* \(hf download nobody/no-such-gemma"):
        load_target("nobody/no-such-gemma")


def test_assistant_config_is_not_a_target(tmp_path: Path, e2b: Path) -> None:
    rewrite(e2b, tmp_path, lambda t: None)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model_type"] = "gemma4_assistant"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="not a Gemma 4 target"):
        load_target(tmp_path)


def test_the_loaders_show_their_long_loops_to_a_progress_wrapper() -> None:
    """`progress=` sees every tensor read (and, with the speed layer, every product prepared), with the count
    it will yield; the model it gives is the one loaded without it."""
    seen: list[tuple[str, int, int]] = []

    def watch(items, what: str, total: int):  # noqa: ANN001, ANN202 (any iterable, as the loaders give)
        items = list(items)
        seen.append((what, total, len(items)))
        return items

    demo = Path(__file__).resolve().parents[2] / "scripts" / "demo"
    watched = load_target(demo / "target", fast=True, progress=watch)
    assert [what for what, _, _ in seen] == ["reading tensors", "preparing the speed layer"]
    assert all(total == n > 0 for _, total, n in seen)
    assert seen[0][1] == len(target_weight_table(watched.config))  # every tensor of the name table
    plain = load_target(demo / "target")
    ids = torch.tensor([[2, 5, 9, 11]])
    torch.testing.assert_close(forward_rows(watched, ids).logits, forward_rows(plain, ids).logits, rtol=1e-5, atol=1e-5)
    seen.clear()
    load_drafter(demo / "assistant", progress=watch)
    assert [what for what, _, _ in seen] == ["reading tensors"]
