"""Floating-point operation counts of one grad Phi evaluation (docs/model.md), documented term by term.

"grad Phi at the particles" is what one explicit step needs: the logits of the measure (forward pass over all N
heads), the residual features ``G`` and the gradient of ``Phi_data(theta_i)`` for every head (backward pass). A
multiply-add is 2 flops, ``[M, K] @ [K, N]`` is ``2 M K N``, causal products count the ``P = T (T + 1) / 2`` pairs.
``model`` is one forward and one backward pass (what every GFLOP/s divides by); ``executed`` is what pdeflow does
(the forward core recomputed in the gradient pass, tables projected instead of inputs); both split per pass.
Details, term by term: docs/benchmarks.md, "Flop counts of one grad Phi evaluation".
"""
from __future__ import annotations


def grad_phi_flops(N: int, B: int, T: int, d: int, dh: int, V: int) -> dict[str, float]:
    """Flop counts of grad Phi at N particles: the parts and the ``model`` and ``executed`` totals."""
    from pdeflow.core.mean_field import factored_projections

    P = T * (T + 1) / 2
    pr = 2.0 * T * d * dh
    heads = float(N) * B
    parts = {
        "projections_forward": heads * 4 * pr,
        "core_forward": heads * (4 * dh + 5) * P,
        "unembedding": 2.0 * B * T * d * V * 2 + 5.0 * B * T * V,
        "projections_backward": heads * 5 * pr,
        "core_backward": heads * (8 * dh + 5) * P,
    }
    model = sum(parts.values())
    core_again = heads * (4 * dh + 5) * P
    model_logits = parts["projections_forward"] + parts["core_forward"] + parts["unembedding"]
    if factored_projections(B, T, V):
        table = float(N) * 2 * (V + T) * d * 3 * dh  # E W and P W (each pass), or E^T S + P^T R
        gather = heads * 3 * dh * T                   # one add per gathered element (each pass)
        executed_logits = table + gather + parts["core_forward"] + heads * pr + parts["unembedding"]
        executed_gradient = 2 * table + 3 * gather + core_again + parts["core_backward"] + heads * 2 * pr
    else:
        executed_logits = model_logits
        executed_gradient = heads * 3 * pr + core_again + parts["projections_backward"] + parts["core_backward"]
    executed = executed_logits + executed_gradient
    out = dict(parts)
    out["projections_share"] = (parts["projections_forward"] + parts["projections_backward"]) / model
    out["factored_projections"] = bool(factored_projections(B, T, V))
    out["model"] = model
    out["executed"] = executed
    out["model_logits_pass"] = model_logits
    out["model_gradient_pass"] = model - model_logits
    out["executed_logits_pass"] = executed_logits
    out["executed_gradient_pass"] = executed_gradient
    return out


def system_jvp_flops(N: int, B: int, T: int, d: int, dh: int, V: int) -> dict[str, float]:
    """Flop counts of one forward-mode whole-system JVP (:meth:`pdeflow.core.problem.Problem.system_jvp`,
    pdeflow/core/kernels_jvp.py), by the rules above. Per head and sequence:

    - tangent logits pass: q, k, v and their tangents ``6 pr``; ``O`` and ``O' = c' WO^T + c WO'^T`` ``3 pr``;
      core ``(12 dh + 10) P`` (s and s' ``6 dh P``, softmax ``5 P``, a' ``5 P``, c and c' ``6 dh P``);
    - tangent gradient pass: ``g = G WO``, ``g' = G' WO + G WO'`` ``3 pr``; ``dWO' = G'^T c + G^T c'`` ``2 pr``;
      ``dW{Q,K,V}'`` ``3 pr``; core ``(18 dh + 8) P + 6 dh T`` (dA and dA' ``6 dh P``, dS and dS' ``8 P``,
      dq', dk', dv' ``12 dh P``, w and w' ``6 dh T``);
    - shared: ``z, z'`` ``4 B T d V``, the softmax and its tangent ``10 B T V``, ``G, G'`` ``4 B T V d``.

    ``model`` is that sum; ``executed`` adds the tangent forward core recomputed in the gradient pass and
    counts the projections as pdeflow does them (the tables, for W and for the direction, when factored)."""
    from pdeflow.core.mean_field import factored_projections

    P = T * (T + 1) / 2
    pr = 2.0 * T * d * dh
    heads = float(N) * B
    core_forward = heads * (12 * dh + 10) * P
    core_backward = heads * ((18 * dh + 8) * P + 6 * dh * T)
    shared = 8.0 * B * T * d * V + 10.0 * B * T * V
    model = heads * 17 * pr + core_forward + core_backward + shared
    if factored_projections(B, T, V):
        table = float(N) * 2 * (V + T) * d * 3 * dh
        gather = heads * 3 * dh * T
        executed = (2 * table + 2 * gather + heads * 3 * pr + core_forward       # tangent logits pass
                    + 3 * table + 4 * gather + heads * 5 * pr + core_forward + core_backward + shared)
    else:
        executed = model + heads * 6 * pr + core_forward
    return {"model": model, "executed": executed}
