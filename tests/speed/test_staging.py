"""The PLE table's rows through a staging buffer (gemma4/fast/staging.py), as the loaders give a model on a GPU. Here
without pinning (a CPU build of torch has none): the same lookup, copy, cast and scale."""

import copy

import torch

from gemma4 import greedy_generate
from gemma4.fast.staging import StagedRows
from tests.pairs import plain, prompt


def test_staged_rows_are_the_textbooks_and_hold_one_forwards_rows(models) -> None:  # noqa: ANN001
    target, _ = models["e2b", "echo"]
    assert "per_layer_rows" not in vars(target)  # on the CPU the loaders keep the textbook's lookup
    staged = StagedRows(target, pin=False)
    ids = torch.tensor([prompt("long"), prompt("long", seed=5)])  # (2, 21)
    x = target.embed(ids)
    assert torch.equal(staged(ids, x), target.per_layer_rows(ids, x))
    c, table = target.config, target.embed_tokens_per_layer.weight
    assert staged.staged_bytes == ids.numel() * c.num_layers * c.ple_dim * table.element_size()  # this forward's rows
    staged(ids[:1, :1], x)
    assert staged.staged_bytes == c.num_layers * c.ple_dim * table.element_size()  # a decode step: one row


def test_a_model_with_staged_rows_decodes_the_same_tokens(models) -> None:  # noqa: ANN001
    target = copy.deepcopy(models["e2b", "echo"][0])
    target.per_layer_rows = StagedRows(target, pin=False)  # what make_fast does off the CPU
    assert greedy_generate(target, prompt("long"), 12) == plain(models["e2b", "echo"][0], prompt("long"), 12)
    assert target.per_layer_rows.staged_bytes > 0  # it ran
