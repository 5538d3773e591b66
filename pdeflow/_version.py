"""The version of pdeflow: its one source (setup.cfg reads it, the package and the file writers import it)."""
__version__ = "0.1.0"
