"""What LLVM makes of pdeflow's causal-core kernels for a given x86-64 target (issue 18).

``python -m pdeflow.benchmarks.codegen --cpu skylake-avx512 [--cpu znver4 ...] [--policy llvm|pdeflow|256] [--json]``

Compiles (does not run) ``_attention_units`` and ``_attention_vjp_units`` of :mod:`pdeflow.core.kernels` for each target
in a fresh interpreter (``NUMBA_CPU_NAME``, ``NUMBA_CPU_FEATURES`` from ``--policy``) and reports, per kernel and
dtype, the packed floating-point instructions by register width, FMAs, the innermost loops by widest register,
whether :func:`pdeflow.core.kernels.vexp` runs packed, calls in innermost loops and vector spills.
Details: docs/benchmarks.md, "What LLVM makes of the kernels".
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

POLICIES = {"llvm": "", "pdeflow": "-prefer-256-bit", "256": "+prefer-256-bit"}
TARGETS = ("skylake-avx512", "icelake-server", "sapphirerapids", "znver4", "znver3", "haswell")
KERNELS = ("_attention_units", "_attention_vjp_units")
WIDTHS = ("zmm", "ymm", "xmm", "scalar")

_LABEL = re.compile(r"^(\.?[\w$.]+):")
_JUMP = re.compile(r"^\s+(j[a-z]+)\s+(\.?[\w$.]+)\s*$")
_REG = re.compile(r"%([xyz]mm)\d+")


def _instruction(line: str) -> tuple[str, str] | None:
    """(mnemonic, operands) of an AT&T instruction line, None for labels, directives and comments."""
    s = line.strip()
    if not s or s.startswith((".", "#")) or _LABEL.match(s) or not line[0].isspace():
        return None
    parts = s.split(None, 1)
    return parts[0], (parts[1].strip() if len(parts) > 1 else "")


def _operands(operands: str) -> list[str]:
    """AT&T operands split at the commas outside parentheses (``8(%rsi,%rax,8), %zmm0`` is two)."""
    out, depth, cur = [], 0, ""
    for ch in operands:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()] if cur.strip() else out


def _fp_width(mnemonic: str, operands: str) -> str | None:
    """Register width of a floating-point arithmetic instruction (packed: widest register; ``scalar`` for
    the *sd / *ss forms), None for anything else (moves, integer ops)."""
    if not mnemonic.startswith("v") or mnemonic.startswith(("vmov", "vbroadcast", "vperm", "vshuf", "vunpck",
                                                            "vinsert", "vextract", "vblend", "vgather",
                                                            "vscatter", "vpermil", "vmask", "vcompress",
                                                            "vexpand")):
        return None
    if mnemonic.endswith(("sd", "ss")) and not mnemonic.endswith(("psd", "pss")):
        return "scalar"
    if mnemonic.endswith(("pd", "ps")):
        regs = set(_REG.findall(operands))
        for w in ("zmm", "ymm", "xmm"):
            if w in regs:
                return w
    return None


def _is_fma(mnemonic: str) -> bool:
    return mnemonic.startswith(("vfmadd", "vfmsub", "vfnmadd", "vfnmsub"))


def _is_floor(mnemonic: str) -> bool:
    return mnemonic.startswith(("vrndscale", "vround"))


def _exp_step_width(mnemonic: str, operands: str) -> str | None:
    """Register width of an instruction that marks :func:`pdeflow.core.kernels.vexp`: a floor (float32) or the
    shift of 2^n's exponent into place (``vpsllq $52``, float64, whose n comes from a rounding by addition),
    None for anything else."""
    if _is_floor(mnemonic):
        return _fp_width(mnemonic, operands)
    if (mnemonic == "vpsllq" and operands.startswith("$52,")) or (mnemonic == "vpslld" and operands.startswith("$23,")):
        regs = set(_REG.findall(operands))
        return next((w for w in ("zmm", "ymm", "xmm") if w in regs), None)
    return None


def analyse(asm: str) -> dict[str, Any]:
    """Counts of one function's machine code (AT&T syntax, as numba prints it); see the module docstring."""
    lines = asm.splitlines()
    labels: dict[str, int] = {}
    for i, line in enumerate(lines):
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = i
    loops = []  # (first line, last line) of every backward branch
    for i, line in enumerate(lines):
        m = _JUMP.match(line)
        if m and m.group(2) in labels and labels[m.group(2)] < i:
            loops.append((labels[m.group(2)], i))
    innermost = [(a, b) for a, b in loops if not any((c, d) != (a, b) and a <= c and d <= b for c, d in loops)]

    def count(a: int, b: int) -> dict[str, Any]:
        fp = dict.fromkeys(WIDTHS, 0)
        fma = dict.fromkeys(WIDTHS, 0)
        floor = dict.fromkeys(WIDTHS, 0)
        spills = calls = loads = stores = 0
        for line in lines[a:b + 1]:
            ins = _instruction(line)
            if ins is None:
                continue
            mnemonic, operands = ins
            if mnemonic.startswith("call"):
                calls += 1
            ops = _operands(operands)
            if mnemonic.startswith("vmov") and len(ops) == 2 and "(%rsp" in ops[1] and _REG.search(ops[0]):
                spills += 1
            if "(" in operands and mnemonic.startswith("v"):  # vector memory operands: source or destination
                if mnemonic.startswith("vmov") and "(" in ops[-1]:
                    stores += 1
                else:
                    loads += 1
            marker = _exp_step_width(mnemonic, operands)
            if marker is not None:
                floor[marker] += 1
            w = _fp_width(mnemonic, operands)
            if w is None:
                continue
            fp[w] += 1
            if _is_fma(mnemonic):
                fma[w] += 1
        return {"fp": fp, "fma": fma, "floor": floor, "spills": spills, "calls": calls, "loads": loads,
                "stores": stores}

    whole = count(0, len(lines) - 1)
    by_width = dict.fromkeys(WIDTHS, 0)
    fma_in_loops = dict.fromkeys(WIDTHS, 0)
    floor_in_loops = dict.fromkeys(WIDTHS, 0)
    loop_spills = loop_calls = 0
    fp_loops = []
    for a, b in innermost:
        c = count(a, b)
        if not any(c["fp"].values()):
            continue
        widest = next(w for w in WIDTHS if c["fp"][w])
        fp_loops.append({"lines": [a + 1, b + 1], "width": widest, "fma": sum(c["fma"].values()),
                         "fp_ops": sum(c["fp"].values()), "floor": sum(c["floor"].values()),
                         "loads": c["loads"], "stores": c["stores"]})
        by_width[widest] += 1
        for w in WIDTHS:
            fma_in_loops[w] += c["fma"][w]
            floor_in_loops[w] += c["floor"][w]
        loop_spills += c["spills"]
        loop_calls += c["calls"]
    packed_fma = sum(fma_in_loops[w] for w in ("zmm", "ymm", "xmm"))
    return {"instructions": sum(1 for line in lines if _instruction(line)), "fp_ops": whole["fp"],
            "fma": whole["fma"], "fp_loops_by_width": by_width, "fma_in_innermost_loops": fma_in_loops,
            "floor_in_innermost_loops": floor_in_loops, "spills": whole["spills"],
            "spills_in_innermost_loops": loop_spills, "calls_in_innermost_loops": loop_calls,
            "vector_width": next((w for w in WIDTHS if fma_in_loops[w]), "none"),  # widest: the main loop bodies
            "vexp_packed": any(floor_in_loops[w] for w in ("zmm", "ymm", "xmm")),
            "fma_packed_fraction": packed_fma / max(1, packed_fma + fma_in_loops["scalar"]), "loops": fp_loops}


_FUNCTION = re.compile(r"^(_Z\w+):")
_NAME_PART = re.compile(r"(\d+)")


def short_name(symbol: str) -> str:
    """``pdeflow.core.kernels._scores`` from numba's mangled ``_ZN7pdeflow4core7kernels7_scoresB3v10...`` (the
    length-prefixed parts of the nested name, up to numba's ``B``/``E`` suffix)."""
    rest = symbol[3:] if symbol.startswith("_ZN") else symbol
    parts = []
    while rest and rest[0].isdigit():
        n = int(_NAME_PART.match(rest).group(1))
        k = len(str(n))
        parts.append(rest[k:k + n])
        rest = rest[k + n:]
    return ".".join(parts) or symbol


def functions(asm: str) -> dict[str, str]:
    """The machine code of a numba library split into its functions (the kernel and the jitted helpers
    linked into it), by short name; a helper's first copy wins."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in asm.splitlines():
        m = _FUNCTION.match(line)
        if m:
            name = short_name(m.group(1))
            current = [] if name in out else out.setdefault(name, [])
        if current is not None:
            current.append(line)
    return {k: "\n".join(v) + "\n" for k, v in out.items()}


def hot_loops(asm: str) -> list[dict[str, Any]]:
    """The vectorized bodies of a library's innermost loops that do fused multiply-adds or floors (the
    exponential), per function: ``function``, ``width`` (widest register), ``fma``, ``loads``, ``stores``,
    ``spills`` and ``stack_reads`` (operands read back from the stack: spilled registers or pointers) per
    iteration, and ``body`` (the instructions, AT&T, for llvm-mca). Scalar remainder loops are left out."""
    loops = []
    for name, text in functions(asm).items():
        a = analyse(text)
        lines = text.splitlines()
        for loop in a["loops"]:
            if loop["width"] == "scalar" or not (loop["fma"] or loop["floor"]):
                continue
            first, last = loop["lines"]
            body = [line for line in lines[first:last] if _instruction(line)]
            ins = [_instruction(line) for line in body]
            spills = sum(1 for m, o in ins if m.startswith("vmov") and "(%rsp" in _operands(o)[-1])
            stack_reads = sum(1 for m, o in ins if "(%rsp" in o and not ("(%rsp" in _operands(o)[-1]
                                                                            and m.startswith("vmov")))
            loops.append({"function": name, "width": loop["width"], "fma": loop["fma"], "floor": loop["floor"],
                          "fp_ops": loop["fp_ops"], "loads": loop["loads"], "stores": loop["stores"],
                          "spills": spills, "stack_reads": stack_reads, "instructions": len(body),
                          "body": "\n".join(body) + "\n"})
    return loops


MCA = ("llvm-mca-19", "llvm-mca")


def mca(body: str, cpu: str, iterations: int = 200) -> dict[str, Any]:
    """llvm-mca's steady-state model of one loop body on ``cpu``: ``cycles`` per iteration (total cycles /
    iterations), ``block_rthroughput`` and the most loaded ``resource`` (name, cycles per iteration)."""
    import shutil

    exe = next((shutil.which(e) for e in MCA if shutil.which(e)), None)
    if exe is None:
        raise RuntimeError("llvm-mca not found (Debian/Ubuntu: apt-get install llvm-19)")
    proc = subprocess.run([exe, f"-mcpu={cpu}", f"-iterations={iterations}", "-"], input=body,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"llvm-mca -mcpu={cpu}: {proc.stderr.strip().splitlines()[-1:]}")
    out = proc.stdout
    total = int(re.search(r"Total Cycles:\s+(\d+)", out).group(1))
    its = int(re.search(r"Iterations:\s+(\d+)", out).group(1))
    rthr = float(re.search(r"Block RThroughput:\s+([\d.]+)", out).group(1))
    names = re.findall(r"^\[([\d.]+)\]\s+- (\w+)", out.split("Resources:", 1)[1], re.M)
    pressure = out.split("Resource pressure per iteration:", 1)[1].splitlines()[2].split()
    loads = {n: (0.0 if v == "-" else float(v)) for (_, n), v in zip(names, pressure)}
    top = max(loads, key=loads.get)
    return {"cycles": total / its, "block_rthroughput": rthr, "resource": top, "resource_cycles": loads[top]}


def static_model(cpu: str, policy: str = "pdeflow", dtype: str = "float64",
                 kernels: tuple[str, ...] = KERNELS, models: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The hot loops (:func:`hot_loops`) of the kernels compiled for ``cpu`` (in a fresh interpreter, as
    :func:`inspect`), each with llvm-mca's cycles per iteration (:func:`mca`) for that CPU or for each of
    ``models`` (other llvm-mca CPU models of the same code: LLVM's ``sapphirerapids`` and ``icelake-server``
    models issue 512-bit FMAs on one port, its ``skylake-avx512`` model on two, as Intel's server cores with
    two FMA units do) and the cycles per fused multiply-add. Identical bodies (a helper linked into both
    kernels) are reported once; ``body`` is kept for llvm-mca runs by hand."""
    res = inspect(cpu, policy, (dtype,), kernels, child_mode="--child-loops")
    rows, seen = [], set()
    for key, loops in res["kernels"].items():
        for loop in loops:
            same = (loop["function"], re.sub(r"\.LBB\d+_\d+", ".L", loop["body"]))  # labels differ per library
            if same in seen:
                continue
            seen.add(same)
            for model in models or (cpu,):
                m = mca(loop["body"], model)
                row = dict(loop)
                row.update(m, kernel=key, cpu=cpu if model == cpu else f"{cpu} on the {model} model",
                           cycles_per_fma=m["cycles"] / loop["fma"] if loop["fma"] else None)
                rows.append(row)
    return rows


def model_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one row per hot loop of :func:`static_model`."""
    lines = ["| target | function | width | FMAs | loads | stack reads | spills | cycles / iteration (llvm-mca) | "
             "cycles / FMA | busiest resource |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        per = "" if r["cycles_per_fma"] is None else f"{r['cycles_per_fma']:.2f}"
        lines.append(f"| {r['cpu']} | {r['function'].split('.')[-1]} | {r['width']} | {r['fma']} | {r['loads']} | "
                     f"{r['stack_reads']} | {r['spills']} | {r['cycles']:.2f} | {per} | {r['resource']} "
                     f"({r['resource_cycles']:.2f}) |")
    return "\n".join(lines) + "\n"


def _signatures(kernel: str, dtype: str) -> list:
    """The signatures pdeflow compiles ``kernel`` for (as a grad Phi call types them)."""
    from numba import types

    f = getattr(types, dtype)
    a1, a4, a5 = types.Array(f, 1, "C"), types.Array(f, 4, "C"), types.Array(f, 5, "C")
    tok = types.Array(types.int64, 2, "C", readonly=True)
    i = types.int64
    if kernel == "_attention_units":
        return [(a4, a4, tok, types.float64, a5, i, i, i)]
    if kernel == "_attention_vjp_units":  # accumulate is a run-time flag, on one thread and on several alike
        return [(a4, a4, tok, a5, types.float64, a5, a4, a4, types.boolean, i, i, i)]
    if kernel == "exp_array":
        return [(a1, a1)]
    raise ValueError(f"no signature known for kernel {kernel!r}")


def _child(kernels_: list[str], dtypes: list[str], loops: bool = False) -> dict[str, Any]:
    """In the interpreter whose environment names the target: compile, read the machine code, count."""
    from numba.core.registry import cpu_target

    from pdeflow.core import kernels

    codegen = cpu_target.target_context.codegen()
    out: dict[str, Any] = {"cpu_name": codegen._get_host_cpu_name(), "features": codegen._tm_features,
                           "kernels": {}}
    for dtype in dtypes:
        for name in kernels_:
            fn = getattr(kernels, name)
            sigs = _signatures(name, dtype)
            for k, sig in enumerate(sigs):
                fn.compile(sig)
                key = f"{name}[{dtype}]" + ("" if len(sigs) == 1 else f"[{k}]")
                asm = fn.inspect_asm(sig)
                out["kernels"][key] = hot_loops(asm) if loops else analyse(asm)
    return out


def inspect(cpu: str, policy: str = "llvm", dtypes: tuple[str, ...] = ("float64", "float32"),
            kernels: tuple[str, ...] = KERNELS, timeout: float = 900.0,
            child_mode: str = "--child") -> dict[str, Any]:
    """Compile the kernels for ``cpu`` (an LLVM CPU name, ``host``, or ``env``: whatever this process's
    environment gives) in a fresh interpreter and return the counts of :func:`analyse` per kernel, with the
    CPU name and feature string numba used."""
    env = dict(os.environ)
    if cpu == "env":
        pass  # this process's own settings (pdeflow.core.jit decides again in the child, as it did here)
    elif cpu == "host":
        env.pop("NUMBA_CPU_NAME", None)
        env.pop("NUMBA_CPU_FEATURES", None)
        if policy != "pdeflow":  # the host's own features plus the policy's flag; pdeflow.core.jit decides otherwise
            import llvmlite.binding as ll

            flag = POLICIES[policy]
            env["NUMBA_CPU_FEATURES"] = ll.get_host_cpu_features().flatten() + (f",{flag}" if flag else "")
            env["NUMBA_CPU_NAME"] = ll.get_host_cpu_name()
    else:
        env["NUMBA_CPU_NAME"] = cpu
        env["NUMBA_CPU_FEATURES"] = POLICIES[policy]
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="pdeflow-codegen-") as cache:
        env["NUMBA_CACHE_DIR"] = cache  # compile afresh, and leave no foreign machine code in the real cache
        cmd = [sys.executable, "-m", "pdeflow.benchmarks.codegen", child_mode, ",".join(kernels), *dtypes]
        proc = subprocess.run(cmd,
                              env=env, capture_output=True, text=True, timeout=timeout, cwd=root)
    if proc.returncode != 0:
        raise RuntimeError(f"compiling for {cpu}: {proc.stderr.strip().splitlines()[-1:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res.update({"cpu": cpu, "policy": policy})
    return res


def in_use(data=None, n_total: int = 1024) -> dict[str, Any]:
    """How this process's kernels were compiled, for ``pdeflow bench``: the LLVM CPU name and feature string
    numba compiled for, who chose the features (:data:`pdeflow.core.jit.VECTOR_WIDTH_CHOICE`), the state of
    ``prefer-256-bit``, and per compiled signature of the two core kernels the counts of :func:`analyse`
    (``vector_width``: the widest register of their fused multiply-add loops; float64 and float32, compiled
    in a child process with this environment). With ``data``
    (:class:`pdeflow.core.mean_field.AttentionData`) also the tiles pdeflow chooses for it, per dtype: heads per
    kernel work unit, heads and sequences per chunk, and the bytes of a work unit's scratch arrays."""
    import numpy as np
    from numba.core.registry import cpu_target

    import pdeflow.core.jit as jit
    from pdeflow.core import kernels, mean_field

    cg = cpu_target.target_context.codegen()
    features = cg._tm_features
    flags = [f for f in features.split(",") if f.endswith("prefer-256-bit")]
    rec: dict[str, Any] = {"llvm_cpu": cg._get_host_cpu_name(), "llvm_features": features,
                           "features_chosen_by": jit.VECTOR_WIDTH_CHOICE,
                           "prefer_256_bit": flags[-1] if flags else "the CPU's LLVM default",
                           "avx512f": "+avx512f" in features.split(","), "kernels": {}}
    # numba gives no machine code for functions loaded from its cache: compile them afresh in a child with
    # this process's environment (so the same LLVM target and features) and an empty cache directory
    child = inspect("env", "env")
    rec["same_target_in_child"] = (child["cpu_name"], child["features"]) == (rec["llvm_cpu"], features)
    widths = set()
    for key, a in child["kernels"].items():
        rec["kernels"][key] = {k: a[k] for k in ("vector_width", "fp_loops_by_width", "fma_in_innermost_loops",
                                                 "vexp_packed", "spills_in_innermost_loops",
                                                 "calls_in_innermost_loops")}
        widths.add(a["vector_width"])
    order = {w: i for i, w in enumerate(WIDTHS + ("none",))}
    rec["vector_width"] = min(widths, key=order.get) if widths else "not compiled"
    rec["vector_bits"] = {"zmm": 512, "ymm": 256, "xmm": 128}.get(rec["vector_width"])
    if data is not None:
        B, T, _ = data.shape
        rec["tiles"] = {}
        for dtype in (np.float64, np.float32, np.complex128):
            item = np.dtype(dtype).itemsize
            tile = mean_field._tile(dtype)
            heads, seqs = mean_field._blocks(data, item, n_total)
            fwd, bwd = kernels.scratch_bytes(T, data.head_dim, tile, item)
            rec["tiles"][np.dtype(dtype).name] = {"heads_per_work_unit": tile, "heads_per_chunk": heads,
                                                  "sequences_per_chunk": seqs, "scratch_forward_bytes": fwd,
                                                  "scratch_backward_bytes": bwd}
    return rec


def table(results: list[dict[str, Any]]) -> str:
    """A markdown table: one row per (target, policy, kernel)."""
    lines = ["| target | policy | kernel | width of the FMA loops | innermost FP loops zmm/ymm/xmm/scalar | "
             "FMAs in them zmm/ymm/xmm/scalar | vexp packed | calls in loops | vector spills (in loops) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        for name, k in r["kernels"].items():
            lw = "/".join(str(k["fp_loops_by_width"][w]) for w in WIDTHS)
            fm = "/".join(str(k["fma_in_innermost_loops"][w]) for w in WIDTHS)
            lines.append(f"| {r['cpu_name']} | {r['policy']} | {name} | {k['vector_width']} | {lw} | {fm} | "
                         f"{'yes' if k['vexp_packed'] else 'no'} | {k['calls_in_innermost_loops']} | "
                         f"{k['spills']} ({k['spills_in_innermost_loops']}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--child"], ["--child-loops"]):
        print(json.dumps(_child(argv[1].split(","), argv[2:] or ["float64"], argv[0] == "--child-loops")))
        return 0  # the exit code literal: importing pdeflow here would fix numba's target before the child sets it
    p = argparse.ArgumentParser(prog="python -m pdeflow.benchmarks.codegen", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="append",
                   help=f"LLVM CPU name or 'host' (repeatable; default: {', '.join(TARGETS)}, host)")
    p.add_argument("--policy", action="append", choices=sorted(POLICIES),
                   help="feature string (repeatable; default: llvm and pdeflow)")
    p.add_argument("--dtype", action="append", choices=("float64", "float32"), help="default: both")
    p.add_argument("--kernel", action="append", choices=(*KERNELS, "exp_array"),
                   help=f"default: {', '.join(KERNELS)}")
    p.add_argument("--json", help="also write the counts to this JSON file")
    p.add_argument("--mca", action="store_true",
                   help="instead: the hot loops with llvm-mca's cycles per iteration for each --cpu "
                        "(policy pdeflow, float64 unless --dtype)")
    p.add_argument("--mca-model", action="append",
                   help="with --mca: llvm-mca CPU model(s) to run the code on (default: the --cpu itself)")
    args = p.parse_args(argv)
    if args.mca:
        rows = []
        for cpu in args.cpu or ["sapphirerapids", "znver4"]:
            for dtype in args.dtype or ["float64"]:
                print(f"[codegen] {cpu}, llvm-mca, {dtype}", file=sys.stderr, flush=True)
                rows += static_model(cpu, (args.policy or ["pdeflow"])[0], dtype, tuple(args.kernel or KERNELS),
                                     tuple(args.mca_model or ()))
        print(model_table(rows))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
        return 0
    results = []
    for cpu in args.cpu or [*TARGETS, "host"]:
        for policy in args.policy or ["llvm", "pdeflow"]:
            print(f"[codegen] {cpu}, policy {policy}", file=sys.stderr, flush=True)
            results.append(inspect(cpu, policy, tuple(args.dtype or ("float64", "float32")),
                                   tuple(args.kernel or KERNELS)))
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
