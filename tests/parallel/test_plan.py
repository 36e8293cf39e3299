"""gemma4/parallel/plan.py `check_world` on its own: a rank count an int4 layer's input slices cannot take is
refused for each o and down projection that is int4, whichever of the two a file leaves in floating point."""

from dataclasses import replace
from pathlib import Path

import pytest

from gemma4.config import ConfigError
from gemma4.config_file import load_config
from gemma4.parallel import check_world
from tests.checkpoints import write_target


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """The 12B-like geometry (4 query heads of 16 and 32, MLP 96) with an MLP of 192: whole groups of 32, and
    whole in halves (96), but a quarter (48) cuts one."""
    c = load_config(write_target(Path(tmp_path_factory.mktemp("t")), "12b"))
    return replace(c, intermediate_size=192, head_dims=tuple(32 for _ in c.head_dims))


def test_int4_down_proj_alone_is_checked(config) -> None:  # noqa: ANN001
    down = {f"layers.{i}.mlp.down_proj.weight" for i in range(config.num_layers)}
    with pytest.raises(ConfigError, match="4 ranks cannot split the target: int4 down_proj inputs of 192 in slices "
                                          "that cut groups of 32"):
        check_world(config, 4, "target", down)  # o_proj floating point: down_proj is still cut
    check_world(config, 2, "target", down)  # 96 inputs a rank: whole groups
    check_world(config, 4, "target", ())  # floating point: any slice


def test_int4_o_proj_alone_is_checked(config) -> None:  # noqa: ANN001
    narrow = replace(config, head_dims=tuple(16 for _ in config.head_dims))  # 64 inputs: 16 a rank at N = 4
    o = {f"layers.{i}.self_attn.o_proj.weight" for i in range(config.num_layers)}
    with pytest.raises(ConfigError, match="int4 o_proj inputs of 64 in slices that cut groups of 32"):
        check_world(narrow, 4, "target", o)
    check_world(narrow, 2, "target", o)
    check_world(narrow, 4, "target", ())


def test_the_fingerprint_sees_the_weights_not_the_layout(tmp_path: Path) -> None:
    """Another checkpoint of the same geometry (other weights, same headers) has another fingerprint; the same
    tensors sharded otherwise, with other metadata, have the same one."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from gemma4.parallel.group import fingerprint

    first = write_target(tmp_path / "a", "e2b")
    tensors = load_file(first / "model.safetensors")
    other = shutil.copytree(first, tmp_path / "b")
    changed = dict(tensors)
    key = next(k for k in tensors if k.endswith("q_proj.weight"))
    changed[key] = tensors[key] * 1.01  # a fine-tune: the same name, dtype and shape
    save_file(changed, other / "model.safetensors", metadata={"format": "pt"})
    assert fingerprint(first) != fingerprint(other)

    sharded = shutil.copytree(first, tmp_path / "c")
    (sharded / "model.safetensors").unlink()
    names = sorted(tensors, reverse=True)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, sharded / file, metadata={"format": "pt", "note": "resharded"})
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: file for file, part in halves.items() for n in part}}))
    assert fingerprint(first) == fingerprint(sharded)
    assert torch.equal(tensors[key], load_file(first / "model.safetensors")[key])
