"""``Problem``: the one object every solver and diagnostic talks to.

A Problem holds a data set and the fixed layer (docs/model.md) and evaluates, for a weighted particle measure
``rho = sum_i m_i delta_{omega_i}`` on reduced coordinates ``omega`` [N, k] with masses ``mass`` [N]: ``risk``,
``energy`` ``E(rho) = R(rho) + (lam/2) sum_i m_i |omega_i|^2``, ``phi`` [Q], ``grad_phi`` [Q, k], ``hvp`` and
``translation_hvp`` [k] (complex step, exact to rounding) and ``system_jvp`` [N, k] (forward mode,
:mod:`pdeflow.core.kernels_jvp`). Sharded across MPI ranks (:meth:`Problem.with_comm`), the arrays a method receives are
this rank's block and the results equal the serial values. Details: docs/design.md, "The problem".

Cost: a Problem counts what it is asked (:attr:`Problem.counts`, by kind of :data:`COST_KINDS`): ``gradient``, one
evaluation of grad Phi (:meth:`Problem.grad_phi_field`, which :meth:`Problem.evaluate`, :meth:`Problem.grad_phi` and
:meth:`Problem.velocity` call once each); ``jvp_exact``, one forward-mode product (:meth:`Problem.system_jvp`, and
each pass a kernel makes on the Problem's data itself, recorded by :meth:`Problem.count`); ``jvp_difference``, one
forward-difference product (:meth:`Problem.system_jvp_difference`, one real grad Phi). It is the one counter: a
caller's share is the calls between :meth:`Problem.mark` and :meth:`Problem.since`, or inside the ``with`` blocks of
a :class:`Share` (a part counted apart, as a search's certification), never a tally of its own
(tests/meta/test_one_counter.py); the same problem in another precision (:meth:`Problem.in_precision`) counts on it
too. :func:`gradient_equivalents` is the one formula that turns counts into grad Phi
evaluations.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import mean_field
from .config import Config, ConfigError
from .mean_field import AttentionData
from .model import Coordinates, make_coordinates, make_tables, n_params
from .parallel import SERIAL, SerialComm
from .tasks import TASKS, TaskError, make_task

COMPLEX_STEP = 1e-30
# a whole-system Jacobian-vector product in forward mode costs about this many grad Phi evaluations (measured on the
# full.toml (then the quickstart) and the benchmark reference problem: 2.2-2.5, studies/race/HVP_COST.md)
JVP_COST = 2.5
# the cost of one call of each kind the Problem counts, in grad Phi evaluations at all particles: a difference product
# is one grad Phi call (plus vector arithmetic)
GRADIENT_EQUIVALENTS: dict[str, float] = {"gradient": 1.0, "jvp_exact": JVP_COST, "jvp_difference": 1.0}
COST_KINDS = tuple(GRADIENT_EQUIVALENTS)


def gradient_equivalents(counts: Mapping[str, float]) -> float:
    """``sum_kind GRADIENT_EQUIVALENTS[kind] counts[kind]``: the cost of ``counts`` (kinds of :data:`COST_KINDS`; a
    kind left out counts 0) in grad Phi evaluations."""
    return float(sum(GRADIENT_EQUIVALENTS[kind] * counts.get(kind, 0.0) for kind in COST_KINDS))


class Share:
    """The calls a Problem makes inside ``with share:`` blocks (any number of them, not nested), summed: ``calls``
    by kind of :data:`COST_KINDS`, read from the Problem's counter (:meth:`Problem.mark`, :meth:`Problem.since`) -
    one part of a computation's cost counted apart from the rest (a search's certification beside its search)."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.calls: dict[str, int] = dict.fromkeys(COST_KINDS, 0)
        self._mark: dict[str, int] | None = None

    def __enter__(self) -> Share:
        self._mark = self.problem.mark()
        return self

    def __exit__(self, *exc: object) -> None:
        spent = self.problem.since(self._mark)
        self.calls = {kind: self.calls[kind] + spent[kind] for kind in COST_KINDS}
        self._mark = None

    @property
    def gradients(self) -> int:
        """The grad Phi evaluations inside the blocks."""
        return self.calls["gradient"]

    @property
    def products(self) -> int:
        """The Jacobian-vector products (exact and difference) inside the blocks."""
        return self.calls["jvp_exact"] + self.calls["jvp_difference"]


@dataclass(frozen=True)
class Evaluation:
    """Everything one evaluation at the particles gives: energy, risk, Phi and grad Phi at the particles.

    ``dissipation = sum_i m_i |grad_phi_i|^2`` (the integral of |grad Phi|^2 d rho).
    """
    energy: float
    risk: float
    phi: np.ndarray        # [N]
    grad_phi: np.ndarray   # [N, k]
    dissipation: float


def task_params(cfg: Config) -> dict[str, Any]:
    """The task-specific keyword arguments of :func:`pdeflow.core.tasks.make_task` / ``sample_task`` for ``cfg.task``
    (the Markov chain seed defaults to ``task.seed``; text paths are resolved relative to the config)."""
    t = cfg.task
    task = TASKS[t.name]
    values = {key: getattr(t, key) for key in task.params}
    if "path" in values:
        values["path"] = str(cfg.resolve_path(values["path"]))
    return task.keyword_arguments(values, t.seed)


class Problem:
    """A data set, the fixed tables of the attention layer and the reduced coordinates.

    Build with :meth:`from_config` or :meth:`from_arrays` (the inverse of :meth:`arrays`).
    """

    def __init__(self, arrays: dict[str, Any], precision: str = "float64", beta: float = np.inf,
                 comm: SerialComm | None = None) -> None:
        self.comm = comm or SERIAL  # the ranks the measure's particles are split across
        # calls so far by kind (module docstring); with_comm shares them (the same problem, split)
        self.counts: dict[str, int] = dict.fromkeys(COST_KINDS, 0)
        self._arrays = {key: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
                        for key, v in arrays.items()}
        a = self._arrays
        for key in ("embedding", "positions", "unembedding", "tokens", "targets", "mask", "weights", "theta0"):
            if not isinstance(a.get(key), np.ndarray):
                raise ValueError(f"problem array {key!r} is missing")
        for key, arr in a.items():
            if isinstance(arr, np.ndarray):
                arr.setflags(write=False)
        self.beta = float(beta)
        self.precision = precision
        self.dtype = np.dtype(precision)
        E, P, U = a["embedding"], a["positions"], a["unembedding"]
        self.vocab_size, self.d = E.shape
        self.seq_len = P.shape[0]
        self.head_dim = int(a["head_dim"])
        self.p = n_params(self.d, self.head_dim)
        basis = a.get("basis")
        self.coords = Coordinates(theta0=a["theta0"], basis=basis, k=self.p if basis is None else basis.shape[1])
        self.k = self.coords.k
        self.weight_decay = float(a["weight_decay"])
        inputs = E[a["tokens"]] + P[None, :, :]
        self._data64 = AttentionData(inputs, U, np.asarray(a["targets"], dtype=np.int64),
                                     mean_field.loss_weights(a["mask"], a["weights"]),
                                     self.head_dim, float(a["score_scale"]),
                                     np.ascontiguousarray(a["tokens"], dtype=np.int64), E, P)
        self._data = self._data64 if self.dtype == np.float64 else self._data64.astype(self.dtype)

    # ---- the counter ----------------------------------------------------------------------------
    def mark(self) -> dict[str, int]:
        """The counts of calls so far by kind (module docstring), for :meth:`since`."""
        return dict(self.counts)

    def since(self, mark: Mapping[str, int]) -> dict[str, int]:
        """The calls by kind of :data:`COST_KINDS` made since ``mark`` (:meth:`mark`)."""
        return {kind: self.counts[kind] - mark[kind] for kind in COST_KINDS}

    def products_since(self, mark: Mapping[str, int]) -> int:
        """The Jacobian-vector products (exact and difference) made since ``mark`` (:meth:`mark`)."""
        calls = self.since(mark)
        return calls["jvp_exact"] + calls["jvp_difference"]

    def count(self, kind: str, calls: int = 1) -> None:
        """Record ``calls`` of ``kind`` made on the Problem's data without its methods (the forward-mode passes of
        :func:`pdeflow.core.hessian_assembly.frozen_blocks` and ``gauss_newton_factor``, one exact product each)."""
        self.counts[kind] += calls

    def share(self) -> Share:
        """A new :class:`Share`: the calls made inside its ``with`` blocks."""
        return Share(self)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: Config) -> Problem:
        """Task data, tables and coordinates from a validated config; ConfigError on inconsistent shapes."""
        t, m = cfg.task, cfg.model
        try:
            task = make_task(t.name, vocab_size=t.vocab_size, seq_len=t.seq_len, exact=t.exact,
                             n_samples=t.n_samples, seed=t.seed, **task_params(cfg))
        except TaskError as exc:
            raise ConfigError(f"task: {exc}") from None
        E, P, U = make_tables(m, task.vocab_size, t.seq_len)
        base = cfg.resolve_path(".") if cfg.source else None
        coords = make_coordinates(m, base)
        scale = m.score_scale if m.score_scale > 0 else 1.0 / np.sqrt(m.head_dim)
        arrays = {"embedding": E, "positions": P, "unembedding": U, "tokens": task.tokens,
                  "targets": task.targets, "mask": task.mask, "weights": task.weights,
                  "theta0": coords.theta0, "basis": coords.basis, "head_dim": m.head_dim,
                  "score_scale": float(scale), "weight_decay": m.weight_decay}
        return cls(arrays, precision=m.precision, beta=m.beta)

    @classmethod
    def from_arrays(cls, arrays: dict[str, Any], precision: str = "float64", beta: float = np.inf) -> Problem:
        """A Problem from the dictionary :meth:`arrays` returns (as stored in a trajectory file)."""
        return cls(arrays, precision=precision, beta=beta)

    def arrays(self) -> dict[str, Any]:
        """``embedding`` [V,d], ``positions`` [T,d], ``unembedding`` [V,d], ``tokens``, ``targets``, ``mask`` [B,T],
        ``weights`` [B], ``theta0`` [p], ``basis`` [p,k] or None, ``head_dim``, ``score_scale``, ``weight_decay``."""
        return dict(self._arrays)

    def with_data(self, tokens: np.ndarray, targets: np.ndarray, mask: np.ndarray, weights: np.ndarray) -> Problem:
        """The same layer on another data set (minibatches, probe sets)."""
        arrays = self.arrays()
        arrays.update(tokens=tokens, targets=targets, mask=mask, weights=weights)
        return Problem(arrays, precision=self.precision, beta=self.beta, comm=self.comm)

    def with_weight_decay(self, weight_decay: float) -> Problem:
        """The same problem with another weight decay lam."""
        arrays = self.arrays()
        arrays["weight_decay"] = float(weight_decay)
        return Problem(arrays, precision=self.precision, beta=self.beta, comm=self.comm)

    def in_precision(self, precision: str) -> Problem:
        """The same problem evaluated in ``precision`` (float32 or float64); its calls are counted on this
        Problem's counter (one search's cost, whichever precision each call used)."""
        other = Problem(self.arrays(), precision=precision, beta=self.beta, comm=self.comm)
        other.counts = self.counts
        return other

    def with_comm(self, comm: SerialComm | None) -> Problem:
        """The same problem with measures split across the ranks of ``comm`` (None: serial); shares the arrays."""
        other = copy.copy(self)
        other.comm = comm or SERIAL
        return other

    # ---- measures -----------------------------------------------------------------------------
    def initial_particles(self, n: int, seed: int, distribution: str = "gaussian", scale: float = 0.5,
                          mean: Any = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """N i.i.d. initial particles [n, k] (gaussian: mean + scale N(0, I); uniform: mean + scale U(-1, 1)^k;
        point: all at mean) and equal masses 1/n [n]."""
        centre = np.zeros(self.k)
        mean = np.atleast_1d(np.asarray(mean, dtype=float))
        if mean.size not in (0, 1, self.k):
            raise ConfigError(f"init.mean must hold 0, 1 or k = {self.k} numbers, got {mean.size}")
        if mean.size:
            centre[:] = mean
        rng = np.random.default_rng(seed)
        if distribution == "gaussian":
            omega = centre + scale * rng.standard_normal((n, self.k))
        elif distribution == "uniform":
            omega = centre + scale * rng.uniform(-1.0, 1.0, size=(n, self.k))
        elif distribution == "point":
            omega = np.tile(centre, (n, 1))
        else:
            raise ConfigError(f"init.distribution must be gaussian, uniform or point, got {distribution!r}")
        return omega, np.full(n, 1.0 / n)

    def initial_measure(self, cfg: Config) -> tuple[np.ndarray, np.ndarray]:
        """The initial particles and masses of ``cfg.init``."""
        i = cfg.init
        return self.initial_particles(i.n_particles, i.seed, i.distribution, i.scale, i.mean)

    # ---- evaluation ---------------------------------------------------------------------------
    def _cast(self, omega: np.ndarray) -> np.ndarray:
        omega = np.asarray(omega)
        if np.iscomplexobj(omega):
            return omega.astype(np.complex128, copy=False)
        return omega.astype(self.dtype, copy=False)

    def _data_for(self, omega: np.ndarray) -> AttentionData:
        return self._data64 if np.iscomplexobj(omega) else self._data

    @property
    def data64(self) -> AttentionData:
        """The data set and fixed tables in float64, whatever the problem's precision (what a second-order analysis
        assembles with, :mod:`pdeflow.core.hessian_assembly`)."""
        return self._data64

    def theta(self, omega: np.ndarray) -> np.ndarray:
        """Head parameters ``theta0 + basis @ omega``: [N, k] -> [N, p]."""
        omega = self._cast(omega)
        return self.coords.theta(omega).astype(omega.dtype, copy=False)

    def logits(self, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """``z[b, l] = sum_i m_i psi_l(x_b; theta(omega_i))``: [B, T, V]; the aggregate output ``O`` [B, T, d] is summed
        over the ranks before the unembedding (the one communication of an evaluation)."""
        omega = self._cast(omega)
        data = self._data_for(omega)
        O = self.comm.allreduce_sum(mean_field.aggregate_output(self.theta(omega), np.asarray(mass, dtype=omega.dtype),
                                                                data))
        return O @ data.unembedding.T.astype(O.dtype, copy=False)

    def _risk_and_residual(self, omega: np.ndarray, mass: np.ndarray):
        z = self.logits(omega, mass)
        return mean_field.cross_entropy(z, self._data_for(omega))

    def risk(self, omega: np.ndarray, mass: np.ndarray) -> float:
        """``R(rho)``, the weighted masked cross-entropy of the mean-field logits."""
        return float(self._risk_and_residual(omega, mass)[0])

    def confinement(self, omega: np.ndarray, mass: np.ndarray) -> float:
        """``(lam/2) sum_i m_i |omega_i|^2``."""
        return self.comm.sum_over_ranks(self._local_confinement(omega, mass))[0]

    def _local_confinement(self, omega: np.ndarray, mass: np.ndarray) -> float:
        omega = np.asarray(omega, dtype=float)
        return 0.5 * self.weight_decay * float(np.dot(mass, np.einsum("ik,ik->i", omega, omega)))

    def energy(self, omega: np.ndarray, mass: np.ndarray) -> float:
        """``E(rho) = R(rho) + (lam/2) sum_i m_i |omega_i|^2`` (no entropy: see the module docstring)."""
        return self.risk(omega, mass) + self.confinement(omega, mass)

    def risk_and_features(self, omega: np.ndarray, mass: np.ndarray) -> tuple[float, np.ndarray]:
        """``R(rho)`` and the residual features ``G`` [B, T, d] from one pass over the measure."""
        risk, G = self._risk_and_residual(omega, mass)
        return float(risk), G

    def residual_features(self, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """``G[b, l] = lw[b, l] (softmax z - onehot y) U``: [B, T, d], what Phi needs of rho."""
        return self._risk_and_residual(omega, mass)[1]

    def phi_field(self, query: np.ndarray, G: np.ndarray) -> np.ndarray:
        """``Phi(q; rho)`` [Q] at query points [Q, k] for a measure given by its residual features G."""
        query = self._cast(np.atleast_2d(query))
        data = self._data_for(query) if not np.iscomplexobj(G) else self._data64
        phi = mean_field.phi_data(self.theta(query), G, data)
        return self._real(phi + 0.5 * self.weight_decay * np.einsum("qk,qk->q", query, query))

    def grad_phi_field(self, query: np.ndarray, G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``Phi`` [Q] and ``grad_omega Phi`` [Q, k] at query points for residual features G (one ``gradient``)."""
        self.counts["gradient"] += 1
        return self._grad_phi_field(query, G)

    def _grad_phi_field(self, query: np.ndarray, G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        query = self._cast(np.atleast_2d(query))
        data = self._data_for(query) if not np.iscomplexobj(G) else self._data64
        phi, grad_theta = mean_field.grad_phi_data(self.theta(query), G, data)
        phi = phi + 0.5 * self.weight_decay * np.einsum("qk,qk->q", query, query)
        grad = self.coords.pullback(grad_theta)
        if self.weight_decay:  # no [Q, k] temporary when there is no weight decay (512 MiB at Q = 65536)
            grad = grad + self.weight_decay * query
        return self._real(phi), self._real(grad)

    def _real(self, x: np.ndarray) -> np.ndarray:
        return x if np.iscomplexobj(x) else x.astype(np.float64, copy=False)

    def phi(self, query: np.ndarray, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """``Phi(q; rho) = sum_b w_b/|L_b| sum_l <r[b,l], psi_l(x_b; theta(q))> + (lam/2)|q|^2`` for q [Q, k] -> [Q]."""
        return self.phi_field(query, self.residual_features(omega, mass))

    def grad_phi(self, query: np.ndarray, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """``grad_omega Phi(q; rho)`` at query points [Q, k] -> [Q, k]."""
        return self.grad_phi_field(query, self.residual_features(omega, mass))[1]

    def velocity(self, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """The particle velocity ``-grad Phi(omega_i; rho_N)``: [N, k]."""
        return -self.grad_phi(omega, omega, mass)

    def evaluate(self, omega: np.ndarray, mass: np.ndarray) -> Evaluation:
        """Energy, risk, Phi and grad Phi at the particles, and the dissipation, from one pass."""
        risk, G = self._risk_and_residual(omega, mass)
        phi, grad = self.grad_phi_field(omega, G)
        dissipation, confinement = self.comm.sum_over_ranks(float(np.dot(mass, np.einsum("ik,ik->i", grad, grad))),
                                                            self._local_confinement(omega, mass))
        risk = float(risk)
        return Evaluation(energy=risk + confinement, risk=risk, phi=phi, grad_phi=grad, dissipation=dissipation)

    # ---- second order -------------------------------------------------------------------------
    def hvp(self, point: np.ndarray, vector: np.ndarray, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """``Hessian_omega Phi(point; rho) @ vector`` with rho frozen: point, vector [k] -> [k].

        Complex step on grad Phi (exact to rounding, see the module docstring).
        """
        G = self.residual_features(np.asarray(omega, dtype=float), mass)
        return self._complex_step(point, vector, lambda z: self.grad_phi_field(z[None, :], G)[1][0])

    def system_jvp(self, omega: np.ndarray, mass: np.ndarray, direction: np.ndarray) -> np.ndarray:
        """``d/ds grad Phi(omega_i + s u_i; rho_{omega + s u})`` at s = 0: the particles and the measure move
        together, so this is ``M^-1 Hess E(omega) u`` with ``M = diag(m_i)`` (minus the Jacobian of the particle
        velocity). ``omega``, ``direction`` u [N, k] -> [N, k]. Sharded, u is this rank's block.

        Forward mode, exact to rounding in the problem's precision: with ``theta' = basis u``, the logits
        pass and its tangent give ``O, O'`` (:func:`pdeflow.core.mean_field.aggregate_output_jvp`; one Allreduce
        of both), ``z' = O' U^T``, the residual features' tangent ``G'``
        (:func:`pdeflow.core.mean_field.residual_features_jvp`), then the gradient pass's tangent
        ``Hess_theta Phi_data(theta_i; G) theta'_i + grad_theta Phi_data(theta_i; G')``
        (:func:`pdeflow.core.mean_field.grad_phi_data_jvp`), pulled back, plus ``lam u_i``. About 2.2-2.5 grad Phi
        evaluations of work (studies/race/HVP_COST.md); :meth:`system_jvp_complex_step` is the slower
        complex-step reference."""
        self.counts["jvp_exact"] += 1
        omega = self._cast(np.asarray(omega, dtype=float))
        direction = np.asarray(direction, dtype=float)
        data = self._data
        theta = self.theta(omega)
        basis = self.coords.basis
        dtheta = (direction if basis is None else direction @ basis.T).astype(self.dtype, copy=False)
        O, dO = mean_field.aggregate_output_jvp(theta, dtheta, np.asarray(mass, dtype=self.dtype), data)
        z, dz = self.comm.allreduce_sum(np.stack([O, dO])) @ data.unembedding.T
        G = mean_field.cross_entropy(z, data)[1]
        dG = mean_field.residual_features_jvp(z, dz, data)
        grad = self.coords.pullback(mean_field.grad_phi_data_jvp(theta, dtheta, G, dG, data))
        if self.weight_decay:
            grad = grad + self.weight_decay * direction
        return self._real(grad)

    def system_jvp_difference(self, omega: np.ndarray, mass: np.ndarray, direction: np.ndarray,
                              grad0: np.ndarray, eps: float) -> np.ndarray:
        """:meth:`system_jvp` by the forward difference ``(grad Phi(y + eps u; rho_{y + eps u}) - grad0) / eps``
        (``grad0`` = grad Phi at ``y = omega`` [N, k]): one real grad Phi evaluation, counted as a
        ``jvp_difference``."""
        self.counts["jvp_difference"] += 1
        y = omega + eps * direction
        return (self._grad_phi_field(y, self.residual_features(y, mass))[1] - grad0) / eps

    def system_jvp_complex_step(self, omega: np.ndarray, mass: np.ndarray, direction: np.ndarray) -> np.ndarray:
        """:meth:`system_jvp` by the complex step (module docstring): one complex evaluation of grad Phi at all
        particles, in float64 whatever the problem's precision; the reference the forward mode is tested
        against, at 4.2-6.7 grad Phi evaluations (studies/race/HVP_COST.md)."""
        direction = np.asarray(direction, dtype=float)
        norm = math.sqrt(self.comm.sum_over_ranks(float(np.sum(direction * direction)))[0])
        if norm == 0.0:
            return np.zeros_like(direction)
        h = COMPLEX_STEP / norm
        z = np.asarray(omega, dtype=float) + 1j * h * direction
        return self.grad_phi(z, z, mass).imag / h

    def translation_hvp(self, point: np.ndarray, vector: np.ndarray) -> np.ndarray:
        """``Hessian e(point) @ vector`` for the one-head energy ``e(w) = E(delta_w)``: [k] -> [k].

        ``grad e(w) = grad Phi(w; delta_w)``; the complex step moves the head and the measure together.
        """
        one = np.ones(1)
        whole = self.with_comm(None)  # the one-head measure is the same on every rank, not a block of one
        return self._complex_step(point, vector, lambda z: whole.grad_phi(z[None, :], z[None, :], one)[0])

    def _complex_step(self, point: np.ndarray, vector: np.ndarray, grad) -> np.ndarray:
        vector = np.asarray(vector, dtype=float)
        norm = float(np.linalg.norm(vector))
        if norm == 0.0:
            return np.zeros_like(vector)
        h = COMPLEX_STEP / norm
        z = np.asarray(point, dtype=float) + 1j * h * vector
        return np.asarray(grad(z)).imag / h
