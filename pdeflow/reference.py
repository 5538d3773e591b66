"""Manufactured checks for other codes (the public API; docs/guide.md, "Checking another code").

A handful of small problems with known answers that exercise a code's model, not only its stepper: ``Phi`` and
``grad Phi`` at given points, the energy identity of one explicit Euler step, and Dirac measures whose stability
verdict is known in closed form. Each case carries the explicit problem arrays, its inputs, the expected values with
their tolerances (``|actual - expected| <= atol + rtol |expected|``) and what each value means; pdeflow's own test suite
asserts every expected value. In another code's tests::

    import pdeflow.reference as ref

    for case in ref.load_cases():
        mine = my_code_evaluate(case.problem, case.inputs)    # a dict keyed like case.expected
        case.assert_matches(mine, partial=True)

``case.problem`` has the keys of :meth:`pdeflow.Problem.arrays` (``embedding [V, d]``, ``positions [T, d]``,
``unembedding [V, d]``, ``theta0 [p]``, ``basis [p, k]`` or None, ``tokens``, ``targets [B, T]``, ``mask [B, T]``,
``weights [B]``, ``head_dim``, ``score_scale``, ``weight_decay``); ``case.config`` is the pdeflow config that defines
the same problem; ``case.meaning`` says what every input and expected value is.
"""
from __future__ import annotations

from .analysis.comparison.manufactured import ManufacturedCase, Tolerance, case_names, load_case, load_cases

__all__ = ["ManufacturedCase", "Tolerance", "case_names", "load_case", "load_cases"]
