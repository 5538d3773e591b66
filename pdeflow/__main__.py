"""``python -m pdeflow`` is the ``pdeflow`` command."""
from .interface.cli import entry

entry()
