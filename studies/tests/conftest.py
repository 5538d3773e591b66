"""The study tests (run by ``.ci/run`` after the README's test command, from the checkout's root:
``python -m pytest -q studies/tests``): the fixtures and small problems of the package's tests are shared."""
import importlib.util
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"
sys.path.insert(0, str(TESTS))

# the package's conftest under a name of its own: this file is itself imported as "conftest"
_spec = importlib.util.spec_from_file_location("pdeflow_tests_conftest", TESTS / "conftest.py")
_package_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_package_conftest)
one_numba_thread = _package_conftest.one_numba_thread
