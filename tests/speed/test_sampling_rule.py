"""Each model samples by its own rule (gemma4/sampling.py `Sampling`): the speed layer gives a model off the CPU the
rule that keeps rows whole (gemma4/fast/sampling.py), through the same function `make_fast` calls there
(`for_a_device`). Two models of one process then draw independently of each other's device and speed choices."""

import torch

from gemma4 import SamplerConfig, load_target, sample_generate
from gemma4.fast.apply import for_a_device
from gemma4.fast.sampling import WHOLE_ROWS
from gemma4.engine.sampling import RULE, rule_of
from mtp import DraftLength, load_drafter, speculative_generate
from gemma4.engine.forward import forward_rows
from tests.pairs import prompt

SAMPLER = SamplerConfig(temperature=0.8, top_k=40, top_p=0.9, seed=7)


def test_two_models_sample_by_their_own_rules(make_pair) -> None:  # noqa: ANN001 (conftest's fixture)
    target_dir, assistant_dir = make_pair("e2b", ordered_embeddings=True, echo=True)
    cpu, device_like = load_target(target_dir, fast=True), load_target(target_dir, fast=True)
    drafter = load_drafter(assistant_dir, fast=True)
    assert rule_of(cpu) is RULE and rule_of(device_like) is RULE  # the speed layer on the CPU keeps it
    ids = prompt(9)
    before = sample_generate(cpu, ids, 16, SAMPLER)
    spec_before = speculative_generate(cpu, drafter, ids, 16, DraftLength(3), sampler=SAMPLER).tokens

    for_a_device(device_like, pin=False)  # what make_fast gives a model on a GPU, here on the CPU
    assert rule_of(device_like) is WHOLE_ROWS and rule_of(cpu) is RULE  # one model's, not the process's

    # The CPU model draws as before, by picking candidates out; the other keeps every id of a row.
    logits = forward_rows(cpu, torch.tensor([ids])).logits[0, -1]  # (V,)
    picked, _ = rule_of(cpu).candidates(logits, SAMPLER)
    whole, probs = rule_of(device_like).candidates(logits, SAMPLER)
    assert len(picked) <= SAMPLER.top_k < len(whole) == logits.shape[0]
    assert torch.equal(whole[probs > 0], picked)
    assert sample_generate(cpu, ids, 16, SAMPLER) == before
    assert speculative_generate(cpu, drafter, ids, 16, DraftLength(3), sampler=SAMPLER).tokens == spec_before

    # Each model's loops agree with its own plain sampling, the drafter drawing by its target's rule.
    plain = sample_generate(device_like, ids, 16, SAMPLER)
    assert speculative_generate(device_like, drafter, ids, 16, DraftLength(3), sampler=SAMPLER).tokens == plain
    assert len(speculative_generate(device_like, drafter, ids, 16, DraftLength(3), sampler=SAMPLER,
                                    drafting="sample").tokens) == 16
