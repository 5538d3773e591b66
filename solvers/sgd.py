"""Finite-head SGD: the training process whose mean-field limit is the particle flow (docs/model.md).

``solver.method = "sgd"`` moves N heads [N, k] with masses ``1/N`` by
``omega_i <- omega_i - eta g_i (+ sqrt(2 eta / beta) xi_i)``, ``t <- t + eta``, ``eta = solver.dt`` in mean-field
time, ``g_i`` the gradient of ``Phi`` on a minibatch (``sgd.sampling`` = ``"resample"`` from the data set, weights
rescaled to keep it unbiased, or ``"fresh"`` from the task). The generator lives in ``State.rng`` and is
checkpointed, so resume is exact; the recorded energy is the full data set's, ``batch_risk`` the minibatch's.
Details: docs/solvers.md, "Finite heads: sgd".
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from pdeflow.core.config import Config, ConfigError
from pdeflow.core.problem import Problem, task_params
from pdeflow.core.state import rng_from_state, rng_state
from pdeflow.core.tasks import TaskData, TaskError, sample_task

from .base import State, Stepper

SEED_BOUND = 2**63 - 1  # seeds of fresh minibatches are drawn in [0, SEED_BOUND)


class SGD(Stepper):
    """Minibatch SGD (optionally Langevin) on N heads in mean-field time; see the module docstring."""
    name = "sgd"
    summary = "finite-head SGD: minibatches, optional Langevin noise"
    use_when = "the training process of finite heads against its mean-field limit (`pdeflow chaos`)"
    step_columns = ("batch_risk",)
    sharded = True

    def __init__(self, problem: Problem, dt: float, *, batch_size: int, sampling: str = "resample",
                 noise: bool = False, seed: int = 0, sampler: Callable[[int], TaskData] | None = None) -> None:
        """``dt`` = eta (``solver.dt``); ``batch_size``, ``sampling``, ``noise`` and ``seed`` as ``sgd.*``;
        ``sampler(seed)``: ``batch_size`` fresh sequences of the task (needed by ``sampling = "fresh"``)."""
        super().__init__(problem)
        self.dt, self.batch_size, self.sampling = float(dt), int(batch_size), sampling
        self.noise, self.seed, self.sampler = bool(noise), seed, sampler
        if self.noise and not math.isfinite(problem.beta):
            raise ConfigError("sgd.noise = true needs a finite model.beta (the noise is sqrt(2 eta / beta) xi)")
        self.n_data = int(problem.arrays()["tokens"].shape[0])
        self.full_batch = sampling == "resample" and self.batch_size >= self.n_data
        if sampling == "fresh":
            if sampler is None:
                raise ValueError("SGD: sampling = 'fresh' needs a sampler")
            self._check_fresh_sampling()
        # full-batch, noiseless SGD is explicit Euler: its identity and stability checks apply
        self.exact_gradient = self.full_batch and not self.noise
        self.stability_bound = 2.0 if self.exact_gradient else math.nan

    @classmethod
    def from_config(cls, problem: Problem, cfg: Config) -> SGD:
        return cls(problem, cfg.solver.dt, **cls.parameters(cfg))

    @staticmethod
    def parameters(cfg: Config) -> dict:
        """The minibatch parameters of ``cfg`` (``sgd.*``, and the ``task.*`` the fresh sampler draws from), as
        keyword arguments."""
        s, t = cfg.sgd, cfg.task
        draw = functools.partial(sample_task, t.name, vocab_size=t.vocab_size, seq_len=t.seq_len,
                                 n_samples=s.batch_size, **task_params(cfg))
        return {"batch_size": s.batch_size, "sampling": s.sampling, "noise": s.noise, "seed": s.seed,
                "sampler": lambda seed: draw(seed=seed)}

    @property
    def energy_identity(self) -> bool:
        return self.exact_gradient and super().energy_identity

    def identity_note(self) -> str:
        if not self.exact_gradient:
            return ("SGD with minibatches or noise descends a random estimate of the gradient, so "
                    "dE/dt = -I holds only in expectation")
        return super().identity_note()

    def _check_fresh_sampling(self) -> None:
        """Draw one fresh minibatch now, so that a task that cannot be sampled fails before any output."""
        try:
            self._fresh_batch(0)
        except TaskError as exc:
            raise ConfigError(f"sgd.sampling = 'fresh': task: {exc}") from None

    # ---- state --------------------------------------------------------------------------------
    def initial_state(self, fields: dict[str, np.ndarray] | None = None) -> State:
        state = super().initial_state(fields)
        state.rng = np.random.default_rng(self.seed)
        return state

    # ---- minibatches --------------------------------------------------------------------------
    def _fresh_batch(self, seed: int) -> Problem:
        data = self.sampler(seed)
        return self.problem.with_data(data.tokens, data.targets, data.mask, data.weights)

    def minibatch(self, rng: np.random.Generator) -> Problem | None:
        """The Problem on the next minibatch drawn from ``rng``; None for the full data set."""
        if self.full_batch:
            return None
        if self.sampling == "fresh":
            return self._fresh_batch(int(rng.integers(SEED_BOUND)))
        n = self.batch_size
        index = np.sort(rng.choice(self.n_data, size=n, replace=False))
        a = self.problem.arrays()
        return self.problem.with_data(a["tokens"][index], a["targets"][index], a["mask"][index],
                                      a["weights"][index] * (self.n_data / n))

    # ---- stepping -----------------------------------------------------------------------------
    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        h = min(self.dt, dt_limit)
        omega, mass = state.fields["omega"], state.fields["mass"]
        # a copy: the state handed in keeps its generator, so an interrupted step checkpoints cleanly
        rng = rng_from_state(rng_state(state.rng))
        batch = self.minibatch(rng)
        ev = self.evaluate(state) if batch is None else batch.evaluate(omega, mass)
        new = omega - h * ev.grad_phi
        if self.noise:
            # the noise of all N particles from the shared generator, and this rank's rows: the draws of a
            # run split across MPI ranks are those of the serial run
            comm = self.problem.comm
            n_total = int(comm.sum_over_ranks(omega.shape[0])[0])
            xi = comm.local_rows(rng.standard_normal((n_total,) + omega.shape[1:]))
            new += math.sqrt(2.0 * h / self.problem.beta) * xi
        return state.advanced({"omega": new, "mass": mass}, h, rng=rng), {"batch_risk": ev.risk}

    def likely_cause(self, state: State) -> str:
        return (f"the SGD step solver.dt = eta = {self.dt:g} is likely too large for this problem "
                f"(mean-field time: the finite-head learning rate is N eta); reduce solver.dt")
