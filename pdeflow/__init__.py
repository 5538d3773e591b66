"""pdeflow: the mean-field Wasserstein gradient flow of multi-head causal self-attention.

See README.md for a tour and docs/model.md for the model contract the docstrings restate.
"""
from . import jit  # noqa: F401 - first: it sets thread environment variables before numpy loads BLAS
from ._version import __version__
from .config import Config, ConfigError, load_config, loads_config
from .file_access import TrajectoryError
from .problem import Evaluation, Problem
from .trajectory import Trajectory, open_trajectory

__all__ = ["Config", "ConfigError", "load_config", "loads_config", "Problem", "Evaluation",
           "Trajectory", "TrajectoryError", "open_trajectory", "__version__"]
