"""What one step hands the next is explicit (issue 53): the solver state travels on the state (``State.carry``: the
step takes it in and returns the new state with its own), never on the stepper, so one stepper advances any number
of trajectories, from any of their states, with the bits of a stepper per trajectory; and the step-size controller
is an object the stepper is given for the run, every parameter of its rule on it. Checkpoint and resume of the
carry: tests/methods/test_methods.py::test_a_declared_carry_is_checkpointed_and_restored_by_the_base and each
method's resume test."""
from __future__ import annotations

import numpy as np
import pytest
from pdeflow.solvers import make_stepper
from pdeflow.solvers.explicit import DormandPrince
from pdeflow.solvers.step_size import StepSizeController

from test_stiff import build

# every stepper that carries something from step to step (adaptive and wfr: nothing), with the settings under
# which it carries the most
CARRYING = [("bs23", {}), ("heun_euler", {}), ("rkc", {}), ("eserk4", {"deflate": 3}),
            ("rosenbrock", {}), ("rosenbrock", {"deflate": 4, "deflate_every": 3, "stage_solve": "auto"}),
            ("cvode", {"deflate": 3})]


def steppers(method: str, extra: dict, count: int):
    """``count`` steppers of ``method`` on the small problem (one Problem), and their two starts: the configured
    measure and the same measure shrunk by 0.8."""
    if method == "cvode":
        pytest.importorskip("sksundae", reason='scikit-sundae is not installed (pip install -e ".[sundials]")')
    cfg, problem = build(f'solver.method="{method}"', "solver.dt=0.05", "solver.rtol=1e-5", "solver.atol=1e-8",
                         *(f"solver.{key}={value!r}".replace("'", '"') for key, value in extra.items()))
    made = [make_stepper(problem, cfg) for _ in range(count)]
    start = made[0].initial_state()
    other = {"omega": 0.8 * start.fields["omega"], "mass": start.fields["mass"]}
    return made, (dict(start.fields), other)


def same(a, b) -> bool:
    """The same bits: time, step, next step, fields, the step's quadrature and the carry it hands on (the values a
    checkpoint keeps; cvode's running solver is compared by identity elsewhere)."""
    carried = [key for key in a.carry if key != "cvode"]
    return (a.t == b.t and a.dt == b.dt and a.step == b.step and a.dissipation_integral == b.dissipation_integral
            and all(np.array_equal(a.fields[key], b.fields[key]) for key in a.fields)
            and a.carry.keys() == b.carry.keys()
            and all(a.carry[key] is b.carry[key] is None or np.array_equal(a.carry[key], b.carry[key])
                    for key in carried))


@pytest.mark.parametrize(("method", "extra"), CARRYING, ids=[f"{m}-{len(e)}" for m, e in CARRYING])
def test_one_stepper_advances_interleaved_trajectories_as_one_stepper_each(method, extra):
    """One stepper stepping two trajectories in turn takes the bits, columns and carries of a stepper per
    trajectory; with the carry on the stepper (before issue 53) the second trajectory's steps found the first's
    carry, not their own, and started afresh (a cold radius, no PI memory, a new CVODE solver)."""
    (shared, first, second), (start_a, start_b) = steppers(method, extra, 3)
    mixed = [shared.initial_state(dict(start_a)), shared.initial_state(dict(start_b))]
    alone = [first.initial_state(dict(start_a)), second.initial_state(dict(start_b))]
    for _ in range(6):
        for i, own in enumerate((first, second)):
            mixed[i], columns = shared.step(mixed[i], 1.0)
            alone[i], expected = own.step(alone[i], 1.0)
            assert same(mixed[i], alone[i]) and columns == expected, (i, columns, expected)
            assert mixed[i].carry.keys() == alone[i].carry.keys() and mixed[i].carry


@pytest.mark.parametrize(("method", "extra"), CARRYING[:-1], ids=[f"{m}-{len(e)}" for m, e in CARRYING[:-1]])
def test_a_step_from_an_earlier_state_repeats_its_step(method, extra):
    """Stepping again from a state the trajectory has passed repeats the step taken from it, bit for bit: what the
    step reads is that state's carry, whatever the stepper did since."""
    (stepper,), (start, _) = steppers(method, extra, 1)
    s1, _ = stepper.step(stepper.initial_state(start), 1.0)
    s2, columns = stepper.step(s1, 1.0)
    s3, _ = stepper.step(s2, 1.0)
    again, columns_again = stepper.step(s1, 1.0)
    assert same(again, s2) and columns_again == columns


def test_cvode_restarts_from_a_state_its_solver_has_passed():
    """CVODE's memory advances with its steps: from a state it has passed the step starts a new solver there (order
    1, as after a resume) instead of continuing from where the solver stands; the trajectory it left goes on."""
    (stepper,), (start, _) = steppers("cvode", {}, 1)
    states = [stepper.initial_state(start)]
    for _ in range(6):
        state, columns = stepper.step(states[-1], 1.0)
        states.append(state)
    assert columns["order"] > 1
    again, columns = stepper.step(states[2], 1.0)
    assert columns["order"] == 1 and again.carry["cvode"] is not states[2].carry["cvode"]
    on, columns = stepper.step(states[-1], 1.0)
    assert columns["order"] > 1 and on.carry["cvode"] is states[-1].carry["cvode"]


def run(stepper, fields, t_end: float = 1.0):
    state, states = stepper.initial_state(dict(fields)), []
    while t_end - state.t > 1e-12:
        state, _ = stepper.step(state, t_end - state.t)
        states.append(state)
    return states


def test_the_controller_is_an_object_the_stepper_is_given():
    """``from_config`` builds each method's controller from ``[solver]``: ``adaptive``'s the elementary one (no
    memory: nothing carried or checkpointed), ``bs23``'s the PI one (its memory carried). A stepper given another
    controller follows it and nothing else: Dormand-Prince with ``adaptive``'s own controller object repeats
    ``adaptive`` bit for bit, with the PI controller it carries err and takes other steps, with a safety factor of
    0.5 it takes more steps; the ``solver.*`` keys read back from the controller."""
    cfg, problem = build()
    solver = {"method": "adaptive", "dt": 0.1, "rtol": 1e-6, "atol": 1e-9, "max_growth": 4.0}
    adaptive = make_stepper(problem, cfg.replace(solver=solver))
    bs23 = make_stepper(problem, cfg.replace(solver={**solver, "method": "bs23"}))
    assert not adaptive.controller.remembers and adaptive.kept() == ()
    assert bs23.controller.remembers and [c.name for c in bs23.kept()] == ["err"]
    assert (adaptive.rtol, adaptive.atol, adaptive.max_growth) == (1e-6, 1e-9, 4.0)
    assert adaptive.controller == StepSizeController.elementary(rtol=1e-6, atol=1e-9, dt_min=1e-10, max_growth=4.0)

    fields = adaptive.initial_state().fields
    reference = run(adaptive, fields)
    given = run(DormandPrince(problem, 0.1, controller=adaptive.controller), fields)
    assert len(given) == len(reference) and all(same(a, b) for a, b in zip(given, reference))
    pi = DormandPrince(problem, 0.1, controller=StepSizeController(rtol=1e-6, atol=1e-9, max_growth=4.0))
    assert [c.name for c in pi.kept()] == ["err"]
    with_memory = run(pi, fields)
    assert all("err" in s.carry for s in with_memory) and not any(s.carry for s in reference)
    assert [s.t for s in with_memory] != [s.t for s in reference]
    cautious = run(DormandPrince(problem, 0.1, controller=StepSizeController.elementary(
        rtol=1e-6, atol=1e-9, max_growth=4.0, safety=0.5)), fields)
    assert len(cautious) > len(reference)
