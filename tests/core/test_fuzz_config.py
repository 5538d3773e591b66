"""``pdeflow run`` on generated configs and ``--set`` strings: exit 0, or 2 with one line; never a traceback,
never 1 or 3 (the properties and strategies: benchmarks/fuzz_config.py, which runs many more examples).

Bounded here (60 examples per property, derandomized): a few seconds. The ``build`` property goes
through ``Problem.from_config`` and ``make_stepper`` with small sizes; the others stop after the parser.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from pdeflow.benchmarks.fuzz_config import PROPERTIES, check, pdeflow_run, toml_text

pytestmark = pytest.mark.usefixtures("one_numba_thread")

BOUNDED = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                   suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("name", list(PROPERTIES))
def test_generated_configs_give_exit_0_or_one_line_and_exit_2(name):
    strategy, build = PROPERTIES[name]

    @BOUNDED
    @given(example=strategy)
    def prop(example):
        check(*example, build=build)

    prop()


def test_the_property_tells_a_good_config_from_a_bad_one():
    """The stand-ins do not hide the outcome: a valid config exits 0 at both levels, a bad key exits 2 naming
    it, a bad --set too."""
    data = {"task": {"name": "markov", "vocab_size": 3, "seq_len": 3, "n_samples": 4},
            "model": {"d": 4, "head_dim": 2}, "init": {"n_particles": 3},
            "run": {"t_end": 0.02, "frame_interval": 0.01}, "diagnostics": {"enabled": False}}
    good = toml_text(data)
    assert pdeflow_run(good, [], build=False)[0] == 0
    assert pdeflow_run(good, [], build=True)[0] == 0
    code, err = pdeflow_run(toml_text(dict(data, model={"d": -4, "head_dim": 2})), [], build=True)
    assert code == 2 and "model.d" in err
    code, err = pdeflow_run(good, ["run.t_end=[1, {a = 2}]"], build=False)
    assert code == 2 and "run.t_end" in err and len(err.strip().splitlines()) == 1
