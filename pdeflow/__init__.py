"""pdeflow: the mean-field Wasserstein gradient flow of multi-head causal self-attention.

See README.md for a tour and ``MODEL.md`` conventions restated in the docstrings.
"""
__version__ = "0.1.0"

from . import jit  # noqa: E402,F401 - first: it sets thread environment variables before numpy loads BLAS
from .config import Config, ConfigError, load_config, loads_config  # noqa: E402
from .problem import Evaluation, Problem  # noqa: E402
from .trajectory import Trajectory, TrajectoryError, open_trajectory  # noqa: E402

__all__ = ["Config", "ConfigError", "load_config", "loads_config", "Problem", "Evaluation",
           "Trajectory", "TrajectoryError", "open_trajectory", "__version__"]
