"""Test-wide settings. The test models are tiny: one thread runs them as fast as two, and on a
2-core machine a second thread per process only fights the other processes for the cores."""

import torch

torch.set_num_threads(1)
