"""The kernels' vector width (issue 18): pdeflow.core.jit's choice, the user's override, results that do not depend
on the width, and the machine-code counter of ``benchmarks/codegen.py`` (``python -m pdeflow.benchmarks.codegen``)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import llvmlite.binding as ll
import numpy as np
import pytest
from pdeflow.benchmarks import codegen

REPO = Path(__file__).resolve().parents[2]
HOST_AVX512 = bool(ll.get_host_cpu_features().get("avx512f"))

ASM = """\
_kernel:
\tpushq\t%rbp
\tvmovupd\t%zmm3, 64(%rsp)
.LBB0_1:
\tvmovupd\t(%rdi,%rax,8), %zmm0
\tvfmadd231pd\t(%rsi,%rax,8), %zmm0, %zmm1
\tvfmadd231pd\t64(%rsi,%rax,8), %zmm0, %zmm2
\tvrndscalepd\t$9, %zmm1, %zmm1
\tvmovupd\t%zmm1, (%rdx,%rax,8)
\taddq\t$8, %rax
\tcmpq\t%rcx, %rax
\tjb\t.LBB0_1
.LBB0_2:
\tvmovsd\t(%rdi,%rax,8), %xmm0
\tvfmadd213sd\t(%rsi,%rax,8), %xmm0, %xmm1
\tcallq\t*%r11
\tincq\t%rax
\tjne\t.LBB0_2
\tvaddpd\t%ymm1, %ymm2, %ymm3
\tretq
"""


def test_analyse_counts_loops_widths_spills_and_calls():
    a = codegen.analyse(ASM)
    assert a["fma"] == {"zmm": 2, "ymm": 0, "xmm": 0, "scalar": 1}
    assert a["fp_ops"] == {"zmm": 3, "ymm": 1, "xmm": 0, "scalar": 1}  # vaddpd ymm outside any loop
    assert a["fp_loops_by_width"] == {"zmm": 1, "ymm": 0, "xmm": 0, "scalar": 1}
    assert a["fma_in_innermost_loops"] == {"zmm": 2, "ymm": 0, "xmm": 0, "scalar": 1}
    assert a["vector_width"] == "zmm" and a["vexp_packed"]
    assert a["spills"] == 1 and a["spills_in_innermost_loops"] == 0
    assert a["calls_in_innermost_loops"] == 1
    assert [loop["width"] for loop in a["loops"]] == ["zmm", "scalar"]
    assert a["loops"][0]["loads"] == 3 and a["loops"][0]["stores"] == 1


def test_intel_tuning_prefers_256_bit_and_pdeflow_policy_restores_512():
    """What the issue is about, compiled (not run) for an Intel AVX-512 server core: LLVM's tuning alone
    gives ymm loops; pdeflow's feature flag gives zmm; an AVX2-only target never has zmm."""
    skx = codegen.inspect("skylake-avx512", "llvm", ("float64",), ("exp_array",))["kernels"]["exp_array[float64]"]
    ours = codegen.inspect("skylake-avx512", "pdeflow", ("float64",), ("exp_array",))["kernels"]["exp_array[float64]"]
    avx2 = codegen.inspect("haswell", "pdeflow", ("float64",), ("exp_array",))["kernels"]["exp_array[float64]"]
    assert skx["vector_width"] == "ymm" and skx["fp_ops"]["zmm"] == 0 and skx["vexp_packed"]
    assert ours["vector_width"] == "zmm" and ours["vexp_packed"]
    assert avx2["fp_ops"]["zmm"] == 0


def _jit_choice(env: dict[str, str]) -> dict[str, str | None]:
    code = ("import json, os, pdeflow.core.jit as j; print(json.dumps({'choice': j.VECTOR_WIDTH_CHOICE, "
            "'features': os.environ.get('NUMBA_CPU_FEATURES')}))")
    full = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES",
                                                               "PDEFLOW_CPU_FEATURES")}
    full.update(env)
    full["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_jit_sets_512_bit_on_avx512_hosts_and_leaves_the_users_choice_alone():
    host = ll.get_host_cpu_features().flatten()
    default = _jit_choice({})
    if HOST_AVX512:
        assert default == {"choice": "pdeflow", "features": host + ",-prefer-256-bit"}
    else:
        assert default == {"choice": "numba", "features": None}
    mine = host + ",+prefer-256-bit"
    assert _jit_choice({"NUMBA_CPU_FEATURES": mine}) == {"choice": "user", "features": mine}
    assert _jit_choice({"NUMBA_CPU_NAME": "generic"})["choice"] == "user"
    # pdeflow's own setting, inherited by a subprocess, is decided again there (not taken for the user's)
    flags = "+sse2,-prefer-256-bit"
    inherited = _jit_choice({"NUMBA_CPU_FEATURES": flags, "PDEFLOW_CPU_FEATURES": flags})
    assert inherited == default


_GRAD = r"""
import sys
import numpy as np
import pdeflow


def gradients(config):
    # grad Phi [70 heads, k] of the config at 6 sequences of length 11, float64 and float32, as hex bytes
    out = []
    for precision in ("float64", "float32"):
        cfg = pdeflow.load_config(config, overrides=["init.n_particles=70", "task.n_samples=6", "task.seq_len=11",
                                                     'model.precision="' + precision + '"'])
        problem = pdeflow.Problem.from_config(cfg)
        omega, mass = problem.initial_measure(cfg)
        g = np.ascontiguousarray(problem.grad_phi(omega, omega, mass))
        assert np.isfinite(g).all()
        out.append(g.tobytes().hex())
    return out


if __name__ == "__main__":
    for g in gradients(sys.argv[1]):
        sys.stdout.write(g + "\n")
    # the kernels were compiled in this process (an empty cache folder): read their machine code here, the
    # narrowest FMA-loop width over every compiled signature of the two core kernels, as codegen.in_use does
    from pdeflow.core import kernels
    from pdeflow.benchmarks.codegen import WIDTHS, analyse
    order = {w: i for i, w in enumerate(WIDTHS + ("none",))}
    core = (kernels._attention_units, kernels._attention_vjp_units)
    widths = {analyse(fn.inspect_asm(sig))["vector_width"] for fn in core for sig in fn.signatures}
    sys.stdout.write(min(widths, key=order.get) + "\n")
"""


@pytest.mark.slow
def test_results_do_not_depend_on_the_vector_width(tmp_path):
    """grad Phi compiled with the host's widest vectors (zmm on AVX-512 hosts: this process's kernels) and with
    256-bit vectors (AVX-512 switched off; 128-bit SSE on AVX2 hosts, where AVX alone still gives 256-bit float
    vectors, so every AVX feature and FMA go, the fused multiply-adds then correctly rounded in software) is
    bit-identical: no fastmath, sums in a fixed order, fused multiply-adds written out - a lane computes the same
    operations in any loop. 70 heads, T = 11: vector bodies and scalar remainders both run. The narrow kernels
    are compiled afresh in a child (an empty cache folder), which reports the width of their machine code; the
    host's width of the same two kernels, compiled afresh, is asserted by the installed ``pdeflow bench`` run
    (tests/meta/test_packaging.py, ``codegen.in_use``)."""
    host = ll.get_host_cpu_features()

    def narrowed(k: str) -> bool:
        return k.startswith("avx512") or (not HOST_AVX512 and (k.startswith("avx") or k in ("fma", "f16c")))

    narrow = ",".join(f"-{k}" if narrowed(k) else ("+" if v else "-") + k for k, v in host.items())
    namespace: dict = {"__name__": "host"}
    exec(_GRAD, namespace)
    wide = namespace["gradients"](str(REPO / "benchmarks/bench-reference.toml"))
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_FEATURES", "PDEFLOW_CPU_FEATURES")}
    env["PYTHONPATH"] = str(REPO)
    # compiled afresh (numba keeps no machine code of what it loads from its cache), in a folder of its own
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "narrow")
    env["NUMBA_CPU_FEATURES"] = narrow
    proc = subprocess.run([sys.executable, "-c", _GRAD, str(REPO / "benchmarks/bench-reference.toml")],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.split()
    assert len(out) == 3 and all(len(g) > 1000 for g in wide)
    # SSE code has no VEX-encoded vector instructions, which codegen.in_use reports as "none"
    assert out[2] in ({"ymm"} if HOST_AVX512 else {"xmm", "none"})
    assert out[:2] == wide


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
def test_kernel_scratch_arrays_start_at_cache_lines(dtype):
    """The kernels' scratch comes from ``kernels.empty_aligned``: every array at a 64-byte boundary (numba's
    np.empty guarantees 32, so zmm loads of a row could straddle two cache lines)."""
    from pdeflow.core import kernels

    offsets = kernels._aligned_addresses(64, np.zeros(1, dtype=dtype))
    assert offsets.shape == (64,) and not offsets.any()


def test_functions_and_hot_loops_split_a_library_by_function():
    """The static model's input: the library's machine code split at its functions (numba links the jitted
    helpers into the kernel's library), and each function's vectorized FMA loops with their bodies."""
    sym = "_ZN7pdeflow4core7kernels7_scoresB3v10B56c8tJTIeFxx"
    assert codegen.short_name(sym) == "pdeflow.core.kernels._scores"
    asm = ASM.replace("_kernel:", sym + ":") + "_ZN7pdeflow4core7kernels4_fooB2v1E:\n" + ASM.split("\n", 1)[1]
    funcs = codegen.functions(asm)
    assert list(funcs) == ["pdeflow.core.kernels._scores", "pdeflow.core.kernels._foo"]
    loops = codegen.hot_loops(asm)
    assert [(lp["function"], lp["width"], lp["fma"], lp["loads"]) for lp in loops] == [
        ("pdeflow.core.kernels._scores", "zmm", 2, 3), ("pdeflow.core.kernels._foo", "zmm", 2, 3)]
    assert loops[0]["body"].count("\n") == 8 and "jb\t.LBB0_1" in loops[0]["body"]


def _mca_targets(cpus: tuple[str, ...]) -> list[str]:
    """The CPUs of ``cpus`` that the installed llvm-mca models: LLVM 14 (Debian 12's default) knows
    sapphirerapids but not znver4, so the test checks what the tool can do, not only that it exists."""
    exe = next((shutil.which(e) for e in codegen.MCA if shutil.which(e)), None)
    if exe is None:
        return []
    known = []
    for cpu in cpus:
        proc = subprocess.run([exe, f"-mcpu={cpu}", "-"], input="\taddq\t$8, %rax\n", capture_output=True,
                              text=True, timeout=60)
        if proc.returncode == 0 and "not a recognized processor" not in proc.stderr:
            known.append(cpu)
    return known


def test_mca_cycles_of_a_load_bound_loop():
    """llvm-mca's model of a loop of two zmm loads, an add and a store per iteration on each target it models: a few
    cycles, never less than its busiest resource, and the same work twice per iteration (independent
    registers, same loop overhead) takes between 1.3 and 2.4 times as long."""
    one = "\tvmovupd\t(%rdi,%rax,8), %zmm0\n\tvaddpd\t(%rsi,%rax,8), %zmm0, %zmm0\n" \
          "\tvmovupd\t%zmm0, (%rdx,%rax,8)\n"
    tail = "\taddq\t$8, %rax\n\tcmpq\t%rcx, %rax\n\tjne\t.LBB0_1\n"
    targets = _mca_targets(("sapphirerapids", "znver4"))
    if not targets:
        pytest.skip("no llvm-mca here models sapphirerapids or znver4")
    for cpu in targets:
        single = codegen.mca(".LBB0_1:\n" + one + tail, cpu)
        double = codegen.mca(".LBB0_1:\n" + one + one.replace("%zmm0", "%zmm1").replace("(%rdi", "64(%rdi")
                             .replace("(%rsi", "64(%rsi").replace("(%rdx", "64(%rdx") + tail, cpu)
        assert 0.5 < single["cycles"] < 4 and 1.3 < double["cycles"] / single["cycles"] < 2.4
        assert single["resource_cycles"] <= single["cycles"] + 1e-9
