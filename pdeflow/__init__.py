"""pdeflow: the mean-field Wasserstein gradient flow of multi-head causal self-attention.

See README.md for a tour and docs/model.md for the model contract the docstrings restate.
"""
from ._version import __version__
from .core import jit  # noqa: F401 - first: it sets thread environment variables before numpy loads BLAS
from .core.allocator import keep_freed_memory
from .core.config import Config, ConfigError, load_config, loads_config
from .core.problem import Evaluation, Problem
from .io.file_access import TrajectoryError
from .io.trajectory import Trajectory, open_trajectory

keep_freed_memory()   # every process that imports pdeflow: pdeflow/core/allocator.py says why

__all__ = ["Config", "ConfigError", "load_config", "loads_config", "Problem", "Evaluation",
           "Trajectory", "TrajectoryError", "open_trajectory", "__version__"]
