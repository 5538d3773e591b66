"""The mutation check: named mutations of the code that decides (the certificate, the report's verdict rules,
``compare --order``'s verdict, the counter's Share, validate's checkpoint rules, the slot a resume falls back to, the
split of one item's work units over threads),
each applied in turn to the checkout with the tests that must catch it run against it; a mutation none of them
catches *survived*, and the test it names does not guard what it claims to.

    python tests/mutations/run_mutations.py              # every mutation; exit 0 when all are caught
    python tests/mutations/run_mutations.py --list       # the names
    python tests/mutations/run_mutations.py rump-scaled dense-delta-zero

A :class:`Mutation` is (name, file, the exact text replaced, its replacement, the tests: pytest node ids). Each is
applied in place to its file and the file restored byte for byte afterwards, whatever happens (``finally``, and
SIGINT / SIGTERM turned into an exception); a copy of the original is kept beside it as ``<file>.unmutated`` while it
is mutated, and restored by the next run if a kill left one behind. The named tests run first on the unmutated code
(they must pass: a test failing anyway catches nothing), then once per mutation with ``pytest -x -q``: exit code 1
(a test failed) is *caught*, 0 is *survived*, anything else an error. The mutated files are not kernel modules, so
numba's cache stays valid. tests/meta/test_mutations.py checks, fast, that each mutation's text still occurs exactly
once in its file and that its tests exist, so the list cannot go stale silently. Issue 52's twelve mutations
(findings 1-3) and a few more are listed."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BACKUP = ".unmutated"

CERTIFICATE = "pdeflow/analysis/certificate/certificate.py"
SECTIONS = "pdeflow/analysis/report/sections.py"
ORDER = "pdeflow/analysis/comparison/convergence_order.py"
ABOUT = "pdeflow/analysis/certificate/about_minimum.py"
FAILURES = "tests/analysis/test_certificate_failures.py"
RULES = "tests/analysis/test_verdict_rules.py"
BRACKET = "tests/analysis/test_bracket_about_minimum.py"
PROBLEM = "pdeflow/core/problem.py"
METADATA = "pdeflow/interface/recompute_metadata.py"
KILLS = "tests/methods/test_reliability.py"


@dataclass(frozen=True)
class Mutation:
    """``old`` (exact text, once in ``file``, relative to the checkout) replaced by ``new``; ``tests``: pytest node
    ids (relative to the checkout) of which at least one must fail."""
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str


MUTATIONS: tuple[Mutation, ...] = (
    # ---- the certificate (issue 52, finding 1)
    Mutation("origin-ignored", CERTIFICATE,
             "    n_dead = int(dead.sum())\n", "    n_dead = 0\n",
             (f"{FAILURES}::test_a_saddle_in_the_origin_block_alone_is_a_saddle",),
             "the heads at the origin left out of the certificate"),
    Mutation("cholesky-origin-unchecked", CERTIFICATE,
             "origin_lower = float(o_values[0]) - o_delta if n_dead else math.inf",
             "origin_lower = math.inf",
             (f"{FAILURES}::test_a_saddle_in_the_origin_block_alone_is_a_saddle",),
             "the Cholesky path taken whatever the origin block's sign"),
    Mutation("origin-out-of-lower-end", CERTIFICATE,
             "lower, upper = min(lower, float(o_values[0]) - o_delta), min(upper, float(o_values[0]) + o_delta)",
             "lower, upper = lower, min(upper, float(o_values[0]) + o_delta)",
             (f"{FAILURES}::test_the_bracket_holds_the_origin_blocks_eigenvalue_below_the_live_ones",),
             "the origin block left out of the Cholesky bracket's lower end"),
    Mutation("failed-cholesky-accepted", CERTIFICATE,
             "    except np.linalg.LinAlgError:\n        return None\n    return shift - min(",
             "    except np.linalg.LinAlgError:\n        R = work\n    return shift - min(",
             (f"{FAILURES}::test_a_cholesky_failing_just_above_lambda_min_proves_nothing",),
             "a failed shifted factorisation taken as a success"),
    Mutation("rump-deleted", CERTIFICATE,
             "return shift - min(trace, g * perron_bound(R)) - rest, R",
             "return shift - rest, R",
             (f"{FAILURES}::test_the_rump_term_is_the_theorems",),
             "Rump's rounding term deleted"),
    Mutation("rump-scaled", CERTIFICATE,
             "return shift - min(trace, g * perron_bound(R)) - rest, R",
             "return shift - 1e-3 * min(trace, g * perron_bound(R)) - rest, R",
             (f"{FAILURES}::test_the_rump_term_is_the_theorems",),
             "Rump's rounding term 1000x too small"),
    Mutation("dense-delta-zero", CERTIFICATE,
             "return values, vectors, n * np.finfo(float).eps * float(np.linalg.norm(A)) + asymmetry",
             "return values, vectors, 0.0",
             (f"{FAILURES}::test_the_dense_bound_holds_an_exact_zero_that_eigh_computes_positive",),
             "the dense bound's delta set to 0"),
    Mutation("proven-by-upper-end", CERTIFICATE,
             "return bool(self.kind in PROOFS and self.lower > 0)",
             "return bool(self.kind in PROOFS and self.upper > 0)",
             (f"{FAILURES}::test_the_dense_bound_holds_an_exact_zero_that_eigh_computes_positive",),
             "proven_minimum testing the bracket's upper end"),
    # ---- the bracket about the minimum (finding 6)
    Mutation("drift-too-small", ABOUT,
             "    return MinimumDrift(distance, slope, change, problem.products_since(mark), q / slope)",
             "    return MinimumDrift(distance, slope, 0.1 * change, problem.products_since(mark), q / slope)",
             (f"{BRACKET}::test_the_slope_is_the_gradient_of_lambda_min_and_the_widening_its_size",),
             "the bracket about the minimum widened 10x too little"),
    Mutation("distance-too-small", ABOUT,
             "    distance = math.sqrt(float(g @ g)) / lower\n",
             "    distance = 0.1 * math.sqrt(float(g @ g)) / lower\n",
             (f"{BRACKET}::test_the_distance_bound_is_attained_along_the_slowest_direction",),
             "the distance to the minimum 10x too small"),
    # ---- the report's verdict rules (finding 2)
    Mutation("rates-forced-holds", SECTIONS,
             '    if math.isfinite(analysis.kl_theta) and not status.startswith(("no ", "pre-asymptotic")):\n'
             "        lo, hi = analysis.kl_theta_range\n        if lo <= 0.5 + 1e-9 and hi > 0:",
             "    if True:\n        lo, hi = analysis.kl_theta_range\n        if True:",
             (f"{RULES}::test_the_rates_verdict_follows_the_kl_interval",
              f"{RULES}::test_no_kl_exponent_is_not_a_verdict"),
             "the rates verdict forced to holds"),
    Mutation("rates-interval-ignored", SECTIONS,
             "        if lo <= 0.5 + 1e-9 and hi > 0:", "        if True:",
             (f"{RULES}::test_the_rates_verdict_follows_the_kl_interval",),
             "any KL exponent holds"),
    Mutation("rates-at-minimum-forced-holds", SECTIONS,
             "    if test.state in (APPROACHING, PRE_ASYMPTOTIC):", "    if True:",
             (f"{RULES}::test_the_rates_verdict_at_a_minimum_follows_the_pl_bound",),
             "the rates verdict at a proven minimum holding when the PL bound fails"),
    Mutation("rate-verdict-forced-holds", SECTIONS,
             "    if float(errors.max()) <= RATE_TOLERANCE:", "    if True:",
             (f"{RULES}::test_the_minimum_rates_verdict_follows_the_tolerance",
              f"{RULES}::test_the_dirac_rates_verdict_follows_the_tolerance"),
             "_rate_verdict (minimum and Dirac sections) forced to holds"),
    Mutation("rate-verdict-always-holds", SECTIONS,
             "    errors = np.abs(relative_errors[np.isfinite(relative_errors)])\n",
             '    s.verdict, s.reason = HOLDS, "forced"\n    return\n',
             (f"{RULES}::test_the_minimum_rates_verdict_follows_the_tolerance",
              f"{RULES}::test_the_dirac_rates_verdict_follows_the_tolerance"),
             "_rate_verdict holds even with no rate measured"),
    Mutation("chaos-any-slope", SECTIONS,
             "if not lo <= -0.5 <= hi]", "if not lo <= slope <= hi]",
             (f"{RULES}::test_the_chaos_verdict_asks_whether_minus_one_half_is_inside",),
             "the chaos verdict accepting any slope inside its interval"),
    Mutation("chaos-zero-inside", SECTIONS,
             "if not hi < 0.0]", "if False]",
             (f"{RULES}::test_the_chaos_verdict_asks_whether_minus_one_half_is_inside",),
             "the chaos verdict holding with an interval that holds 0 (no decay measured)"),
    # ---- compare --order (finding 3)
    Mutation("order-coarsest-pair", ORDER,
             "        return float(self.orders[-1])", "        return float(self.orders[0])",
             (f"{RULES}::test_the_order_verdict_reads_the_finest_pair",),
             "the observed order taken from the coarsest pair"),
    Mutation("order-from-slope", ORDER,
             "        return float(self.orders[-1])", "        return float(self.slope)",
             (f"{RULES}::test_the_order_verdict_reads_the_finest_pair",),
             "the observed order taken from the least-squares slope"),
    # ---- the one counter (issue 53) and validate's checkpoint rule (issue 52's fuzz)
    Mutation("share-keeps-last-block", PROBLEM,
             "self.calls = {kind: self.calls[kind] + spent[kind] for kind in COST_KINDS}", "self.calls = spent",
             ("tests/core/test_system_jacobian.py::"
              "test_a_share_sums_the_calls_inside_its_blocks_and_float32_counts_on_the_same_counter",),
             "a Share holding its last block's calls only"),
    Mutation("active-slot-claimed-checked", METADATA,
             '        elif int(other["step"]) == int(mine["step"]):', "        elif False:",
             ("tests/io/test_validate_numbers.py::"
              "test_which_slot_is_active_is_listed_as_unchecked_when_both_commit_the_same_step",),
             "validate claiming to check which of two slots of the same step is active"),
    # ---- the commit a kill cut between its two flushes (CI's flake of the session after issue 52)
    Mutation("fallback-to-a-later-slot", "pdeflow/io/checkpoint.py",
             "if before is None or int(found[index][0][\"step\"]) >= before:", "if before is None:",
             (f"{KILLS}::test_a_kill_between_a_commits_two_flushes_keeps_the_commit_before",),
             "a resume falling back from a damaged active slot to a later slot never made active"),
    Mutation("index-damaged-takes-the-later", "pdeflow/io/checkpoint.py",
             "index = min(good, key=lambda i: int(found[i][0][\"step\"]))",
             "index = max(good, key=lambda i: int(found[i][0][\"step\"]))",
             (f"{KILLS}::test_a_kill_between_a_commits_two_flushes_keeps_the_commit_before",),
             "with the active index damaged, the later slot taken (it may never have been made active)"),
    Mutation("interrupted-commit-invalid", METADATA,
             "    if len(commits) == 2 and active in (0, 1) and not st.ended:",
             "    if len(commits) == 2 and active in (0, 1) and st.ended and False:",
             (f"{KILLS}::test_a_kill_between_a_commits_two_flushes_keeps_the_commit_before",),
             "validate calling a commit a kill interrupted before its flip a damaged file"),
    # ---- the allocator's thresholds (a speed setting, asserted in page faults)
    Mutation("allocator-claimed-set", "pdeflow/core/allocator.py",
             "refused = [p for p, value in SETTINGS.items() if mallopt(p, value) != 1]", "refused = []",
             ("tests/core/test_allocator.py::test_freed_arrays_are_reused_without_faulting_their_pages_in_again",),
             "the thresholds reported kept without being set"),
    # ---- one item's kernel work units over several threads (results bitwise those of one thread)
    Mutation("range-split-overlaps", "pdeflow/core/workers.py",
             "_together(lambda: run_range(0, n // w),", "_together(lambda: run_range(0, n // w + 1),",
             ("tests/core/test_workers.py::test_each_unit_goes_to_one_range_and_the_ranges_run_together",),
             "the caller's range reaching into the next thread's"),
    Mutation("helper-error-dropped", "pdeflow/core/workers.py",
             "            raise error", "            pass",
             ("tests/core/test_workers.py::test_a_helpers_exception_reaches_the_caller_and_the_helpers_are_reused",),
             "an exception of a helper thread not reaching the caller"),
    Mutation("multiplier-guess-ignored", "solvers/unbalanced_jko.py",
             "    if guess is not None and guess[0] < upper:", "    if False and guess is not None:",
             ("tests/methods/test_wfr.py::test_wfr_jko_multiplier_search_started_at_a_guess_finds_the_same_root_with_"
              "fewer_plans",),
             "wfr_jko's multiplier search starting at the pole whatever the guess"),
    Mutation("layout-one-pass", "pdeflow/analysis/plots/figures.py",
             "LAYOUT_PASSES = 6", "LAYOUT_PASSES = 1",
             ("tests/analysis/test_figure_layout.py::test_a_saved_figure_is_at_its_layouts_fixed_point_and_each_format_"
              "is_drawn_once",),
             "a figure saved after one layout pass, before its axes stop moving"),
)


class Interrupted(Exception):
    """SIGINT or SIGTERM while a file was mutated: raised so that ``finally`` restores it."""


def _raise(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def restore_leftovers(root: Path = ROOT) -> list[Path]:
    """Restore every ``<file>.unmutated`` a killed run left behind (the original bytes) and return the files."""
    restored = []
    for backup in {root / m.file for m in MUTATIONS}:
        saved = backup.with_name(backup.name + BACKUP)
        if saved.exists():
            backup.write_bytes(saved.read_bytes())
            saved.unlink()
            restored.append(backup)
    return restored


def stale(m: Mutation, root: Path = ROOT) -> str:
    """Why ``m`` cannot be applied ("" when it can): its text must occur exactly once in its file."""
    path = root / m.file
    if not path.is_file():
        return f"{m.file} does not exist"
    count = path.read_text(encoding="utf-8").count(m.old)
    return "" if count == 1 else f"its text occurs {count} times in {m.file} (must be once)"


def run_tests(tests: tuple[str, ...], root: Path = ROOT) -> tuple[int, str]:
    """``pytest -x -q`` on the node ids from ``root``: its exit code and the last line of its output."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=root, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, (lines[-1] if lines else proc.stderr.strip()[-200:])


def apply(m: Mutation, root: Path = ROOT) -> tuple[str, str, float]:
    """Run ``m``'s tests with ``m`` applied; the file restored afterwards. (verdict, pytest's last line, seconds)."""
    path = root / m.file
    original = path.read_bytes()
    saved = path.with_name(path.name + BACKUP)
    saved.write_bytes(original)
    t0 = time.perf_counter()
    try:
        path.write_bytes(original.decode("utf-8").replace(m.old, m.new, 1).encode("utf-8"))
        code, last = run_tests(m.tests, root)
    finally:
        path.write_bytes(original)
        saved.unlink()
    verdict = {1: "caught", 0: "SURVIVED"}.get(code, f"error (pytest exit {code})")
    return verdict, last, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="mutations to apply (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip running the tests on the unmutated code")
    args = parser.parse_args(argv)
    known = {m.name: m for m in MUTATIONS}
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:30} {m.file}: {m.what}")
        return 0
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"unknown mutation(s): {', '.join(unknown)} (see --list)", file=sys.stderr)
        return 2
    chosen = [known[n] for n in args.names] or list(MUTATIONS)
    for path in restore_leftovers():
        print(f"restored {path.relative_to(ROOT)} from a run that was killed")
    problems = [f"{m.name}: {why}" for m in chosen if (why := stale(m))]
    if problems:
        print("stale mutation list:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, _raise)
    signal.signal(signal.SIGTERM, _raise)
    if not args.no_baseline:
        tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        code, last = run_tests(tests)
        print(f"baseline (unmutated, {len(tests)} tests): {last}")
        if code != 0:
            print("the tests fail without a mutation: nothing can be judged", file=sys.stderr)
            return 2
    results = []
    for m in chosen:
        verdict, last, seconds = apply(m)
        results.append(verdict)
        print(f"{m.name:30} {verdict:9} {seconds:6.1f} s  {m.what}  [{last}]", flush=True)
    caught = results.count("caught")
    print(f"{caught}/{len(results)} caught" + ("" if caught == len(results) else
                                                f"; {len(results) - caught} survived or failed to run"))
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
