"""`scripts/train_drafter.py` and its siblings: a short distillation works, and no script overwrites the demo.

- A few dozen steps of `kl` on sampled continuations of a tiny random target lower the loss and raise
  sample drafting's acceptance on held-out prompts (seeded, seconds).
- The training scripts refuse to run without `--out` (exit 2, one line naming the flag), and every
  script's `--help` shows its defaults.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gemma4 import SamplerConfig, load_target
from mtp import DraftLength, SpecStats, speculative_generate
from mtp.drafter import Drafter
from mtp.loading import drafter_config_from_dict
from tests.checkpoints import write_target
from tests.pairs import shrink_branches
from train_drafter import drafter_config, init_drafter, unrolled_loss
from training.common import adamw
from training.distill import Distill, continuations

REPO = Path(__file__).resolve().parents[2]

VOCAB = 512  # tests/checkpoints.py


def prompts(count: int, length: int, seed: int) -> torch.Tensor:
    """(count, length) random prompts, each starting with <bos>."""
    ids = torch.randint(3, VOCAB, (count, length - 1), generator=torch.Generator().manual_seed(seed))
    return torch.cat([torch.full((count, 1), 2), ids], dim=1)


def sampled_acceptance(target, drafter, held: torch.Tensor, temperature: float) -> float:  # noqa: ANN001
    """Sample drafting's acceptance rate at K = 1 over the held-out prompts, one seed each."""
    total = SpecStats()
    for seed, prompt in enumerate(held.tolist()):
        sampler = SamplerConfig(temperature, top_k=64, top_p=0.95, seed=seed)
        stats = speculative_generate(target, drafter, prompt, 16, DraftLength(1), sampler=sampler,
                                     drafting="sample").stats
        total.drafted += stats.drafted
        total.accepted += stats.accepted
    return total.acceptance_rate


def test_a_short_distillation_lowers_the_loss_and_raises_sampled_acceptance(tmp_path):
    torch.manual_seed(0)
    target_dir = write_target(tmp_path / "target", "e2b", multimodal=False)
    shrink_branches(target_dir, 0.2)  # a target whose next token depends mostly on the last: learnable in seconds
    target = load_target(target_dir)
    raw = drafter_config(target_dir, target.config, hidden=32, intermediate=64, heads=2, num_centroids=16, top_k=4,
                         dtype=torch.float32)
    drafter = Drafter(drafter_config_from_dict(raw))
    cluster_of = init_drafter(drafter, target, seed=0)
    cfg = Distill(("kl",), "sampled", (0.7, 1.0))
    data = continuations(target, prompts(64, 8, seed=1), 16, cfg, seed=0)  # (64, 24): the training split
    held = prompts(16, 8, seed=2)  # never trained on
    before = sampled_acceptance(target, drafter, held, 1.0)

    opt = adamw(drafter, 1e-2, weight_decay=0.0)
    losses = []
    for step in range(60):
        loss, _ = unrolled_loss(drafter, target, data[(step % 8) * 8:][:8], 3, cluster_of, cfg)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    after = sampled_acceptance(target, drafter, held, 1.0)
    # The loss holds the centroid classifier's soft cross-entropy, whose floor is the clusters' entropy.
    assert sum(losses[-8:]) < 0.8 * sum(losses[:8]), losses
    # One draft per round (K = 1): the acceptance rate is the mean of sum min(p, q) (tests/commands/test_distill.py).
    assert after > before + 0.06, (before, after)


@pytest.mark.parametrize("script", ["train_drafter.py", "train_target.py"])
def test_training_needs_an_explicit_out(script, tmp_path):
    run = subprocess.run([sys.executable, str(REPO / "scripts" / script)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert run.returncode == 2
    assert "--out" in run.stderr.splitlines()[-1] and "Traceback" not in run.stderr


@pytest.mark.parametrize("script", ["train_drafter.py", "train_target.py", "measure_pair.py"])
def test_help_shows_the_defaults(script):
    run = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--help"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0
    assert "(default: " in run.stdout


def test_a_bad_loss_is_one_line_and_exit_2(tmp_path):
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "train_drafter.py"), "--out", str(tmp_path / "a"),
                          "--loss", "kl+js"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "losses must be some of ce, kl, tv" in run.stderr
    assert not (tmp_path / "a").exists()
