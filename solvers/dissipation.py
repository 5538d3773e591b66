"""The system Jacobian at a stepper's state and the step's Hermite quadrature of the dissipation: what rkc, eserk4,
rosenbrock and cvode share to close the energy identity.

Along the flow ``dE/dt = -I``, ``I = sum_i m_i |grad Phi(omega_i)|^2``. A stepper that knows ``dI/dt`` at both ends
of a step (:meth:`pdeflow.core.system_jacobian.SystemJacobian.slope`, one product each) leaves on the new state
``Q_n = int_0^h I dt`` by the Hermite rule (:func:`pdeflow.solvers.base.hermite`, error ``O(h^5)``) and carries the
new end's slope to the next step, so each step costs one product more than its own.
"""
from __future__ import annotations

from pdeflow.core.system_jacobian import SystemJacobian

from .base import State, Stepper, hermite
from .parameters import Param

# the [solver] key of the steppers whose Jacobian-vector products are of a kind the user chooses (rosenbrock, cvode);
# "cvode" (CVODE's own difference quotients) is cvode's alone, refused by rosenbrock
JACOBIAN = Param("jacobian", str, "exact", "Jacobian-vector products in forward mode (exact) or by a forward "
                 "difference of grad Phi (one real evaluation; the W-method keeps its order); cvode only: 'cvode', "
                 "CVODE's own difference quotients on its right-hand side", choices=("exact", "difference", "cvode"))


def state_jacobian(stepper: Stepper, state: State, kind: str) -> SystemJacobian:
    """The system Jacobian at ``state`` (grad Phi from the stepper's evaluation cache) on ``kind`` products
    ("exact" or "difference"; the Problem counts each)."""
    grad = stepper.evaluate(state).grad_phi
    return SystemJacobian(stepper.problem, state.fields["omega"], state.fields["mass"], grad, kind)


def hermite_dissipation(stepper: Stepper, state: State, new: State, h: float, slope0: float, kind: str) -> float:
    """Leaves on ``new`` (``h`` after ``state``) the step's ``dissipation_integral`` by the Hermite rule from ``I``
    at both ends and the slopes ``slope0`` (``dI/dt`` at ``state``, carried) and ``dI/dt`` at ``new`` (one product of
    ``kind``); returns the latter, the next step's ``slope0``."""
    slope1 = state_jacobian(stepper, new, kind).slope()
    new.dissipation_integral = hermite(h, stepper.evaluate(state).dissipation, stepper.evaluate(new).dissipation,
                                       slope0, slope1)
    return slope1


__all__ = ["JACOBIAN", "hermite_dissipation", "state_jacobian"]
