"""Tensor parallelism on torch.distributed: what each rank holds (plan.py), the reduction that gives every
row the same bits whatever the row count (reduce.py), and the ranks as torchrun starts them (group.py). The
loaders apply it after building a rank's model (`load_target(..., shard=)`), as they apply the speed layer."""

from gemma4.parallel.plan import Shard, check_world, local_config, slices
from gemma4.parallel.reduce import Reduced, exact_sum, parallelize

__all__ = ["Reduced", "Shard", "check_world", "exact_sum", "local_config", "parallelize", "slices"]
