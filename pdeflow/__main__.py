"""``python -m pdeflow`` is the ``pdeflow`` command."""
from .cli import entry

entry()
