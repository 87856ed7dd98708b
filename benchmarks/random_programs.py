"""Random-program differential test of tracegrad, at scale, in every mode.

    python benchmarks/random_programs.py --count 10000 [--seed N] [--out DIR]
                                         [--backend numpy|native] [--no-torch] ...

Program ``k`` of a run is two programs: a NumPy program and a torch-dialect
program, both from seed ``(N, k)``.

The NumPy programs (views such as one-operand einsum, reshape, transpose,
slicing and astype; fan-out; broadcasting; reductions; matmul; elementwise
ops on domain-safe values; constants; in-place updates; a weighted scalar
loss; see ``tests/_random_programs.py``) are checked in float64:

* ``tg.compile(f)(x)`` equals ``f(x)`` (NumPy), twice, inputs untouched;
* ``tg.grad(f)(x)`` against central finite differences;
* ``tg.value_and_grad(f)(x)`` equals NumPy's value and the compiled gradient;
* ``compile=False``: ``tg.value_and_grad(f, compile=False)`` and
  ``tg.vjp(f, x, compile=False)`` (NumPy code run eagerly on values that
  record the tape) give NumPy's value and the compiled gradient;
* eager mode: the same body on NumPy-face tensors, three fresh forward
  passes each with ``backward()`` (the third runs the replayed, generated
  backward), the compiled gradient each time, the third bit-equal to the
  first.

The torch-dialect programs (Tensor methods, top-level functions and
``torch.nn.functional`` with torch's meanings; see
``tests/_random_torch_programs.py``) carry a NumPy reference written with
torch's meaning, and are checked in float64:

* eagerly on ``tracegrad.tensor(x, requires_grad=True)`` with ``backward()``,
  three passes (the third replayed): the reference's value, finite
  differences;
* ``tracegrad.func.grad``, ``grad_and_value``, ``vjp`` and ``jvp``
  (compiled): the reference's value and the eager gradient (``jvp``: its
  inner product with the tangent);
* where ``import torch`` works (a side environment with torch; never a
  dependency of tracegrad): the same source on torch itself, float64, whose
  value must equal the reference's and whose gradient tracegrad's.  Where
  torch refuses a backward through a saved value changed in place since,
  which tracegrad computes (it keeps what it saved), that is counted, not
  failed.

Updates through a view, and item assignments, are refused by the compiled
modes with a TraceError (compiled code has no shared memory): counted as
``refused`` / ``func_refused``, not failed.

``--imperative N`` runs N random *imperative* NumPy programs instead (see
``tests/_random_imperative_programs.py``): arrays the function creates and
writes into through indices, masks, views, np.add.at, loops, x.sort() and
branches on conversions, each run as plain NumPy, compiled (``tg.compile``
twice, ``tg.value_and_grad``) and with ``compile=False``
(``tg.value_and_grad(f, compile=False)``): values equal to NumPy's,
gradients to central finite differences, every refusal a TraceError /
TypeError naming the line, classified (by design, pending, known).  Exits 1
on a wrong value or an unexpected crash or refusal (and, with
``--strict-known``, on the known crashes).  The CI part is
``tests/test_random_imperative_programs.py``.

``--branchy N`` runs N random programs with control flow on traced values
instead (issue 25; see ``tests/_random_branchy_programs.py``): if/elif/else,
early returns, while loops with value-dependent trip counts, for loops with
break/continue, conditional expressions, and/or/not, chained comparisons,
min/max, item writes into arrays made in branches and loops; each run on
several inputs taking different paths through one compiled function, as
NumPy, compiled and with compile=False; fallbacks to eager counted by
reason.  The CI part is ``tests/test_random_branchy_programs.py``.

``--seed N --start k --count 1`` reruns program ``k``.  Prints progress and
a summary (programs run, failures by kind and by op); each failure's
reproducer (the program as a runnable script) goes to
``DIR/failure_<k>_<kind>.py``.  Exits 1 on any wrong number or crash (and,
with ``--strict-bits``, on the known bit-level differences of the replay,
``BIT_LEVEL``).  The CI part of this check is ``tests/test_random_programs.py`` and
``tests/test_random_torch_programs.py``.

The compiled modes use the NumPy target unless ``--backend native`` (or
TRACEGRAD_BACKEND) says otherwise: building each program's C costs
0.1-0.2 s, ten times what the rest of the checks cost; the native target is
checked against the NumPy target by ``tests/test_native.py``.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


# Failure kinds where the replayed eager backward equals the interpreter's
# in value but not bit for bit: a zero of the other sign, or the last bit of
# a sum reduced in another memory order.  Known (the strict xfails of
# tests/test_random_programs.py); reported apart from the wrong numbers.
BIT_LEVEL = frozenset({"numpy:eager-replay-signed-zero", "numpy:eager-replay-not-bit-equal"})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first program number")
    ap.add_argument("--out", default="random_program_failures",
                    help="folder for the reproducers (default: %(default)s)")
    ap.add_argument("--backend", choices=("numpy", "native"), default=None,
                    help="target of the compiled modes (default: TRACEGRAD_BACKEND, else numpy)")
    ap.add_argument("--include-known-crashes", action="store_true",
                    help="also generate ops known to crash or give wrong numbers today (EXCLUDE)")
    ap.add_argument("--no-fd", action="store_true", help="skip the finite differences")
    ap.add_argument("--no-eager", action="store_true", help="skip the eager checks")
    ap.add_argument("--no-uncompiled", action="store_true",
                    help="skip compile=False on the NumPy programs")
    ap.add_argument("--no-numpy-programs", action="store_true", help="skip the NumPy programs")
    ap.add_argument("--no-torch-programs", action="store_true",
                    help="skip the torch-dialect programs")
    ap.add_argument("--no-func", action="store_true",
                    help="skip tracegrad.func on the torch-dialect programs")
    ap.add_argument("--no-torch", action="store_true",
                    help="do not compare with torch itself even where it can be imported")
    ap.add_argument("--strict-bits", action="store_true",
                    help="exit 1 on the known bit-level replay differences too (BIT_LEVEL)")
    ap.add_argument("--progress", type=int, default=250, help="print progress every N programs")
    ap.add_argument("--imperative", type=int, default=None, metavar="N",
                    help="run N random imperative programs (writes into arrays) instead")
    ap.add_argument("--strict-known", action="store_true",
                    help="--imperative: exit 1 on the known crashes too")
    ap.add_argument("--branchy", type=int, default=None, metavar="N",
                    help="run N random programs with control flow on traced values (if/while/"
                         "break/and/or/min/max: issue 25) instead")
    args = ap.parse_args(argv)
    if args.imperative is not None:
        return imperative(args)
    if args.branchy is not None:
        return branchy(args)

    # an isolated compile cache, unless the caller chose one
    tmp = None
    if "TRACEGRAD_CACHE_DIR" not in os.environ:
        tmp = tempfile.TemporaryDirectory(prefix="tracegrad-random-programs-")
        os.environ["TRACEGRAD_CACHE_DIR"] = os.path.join(tmp.name, "cache")
    backend = args.backend or os.environ.get("TRACEGRAD_BACKEND") or "numpy"
    os.environ["TRACEGRAD_BACKEND"] = backend

    import tracegrad as tg
    import _random_programs as rp
    import _random_torch_programs as rtp

    torch = None
    if not args.no_torch and not args.no_torch_programs:
        try:
            import torch
            torch.set_default_dtype(torch.float64)
        except ImportError:
            torch = None

    modes = []
    if not args.no_numpy_programs:
        modes.append("NumPy programs: compile, grad, value_and_grad"
                     + ("" if args.no_uncompiled else ", compile=False (value_and_grad, vjp)")
                     + ("" if args.no_eager else ", eager + replay")
                     + ("" if args.no_fd else ", finite differences"))
    if not args.no_torch_programs:
        modes.append("torch-dialect programs: NumPy reference"
                     + ("" if args.no_eager else ", eager tracegrad.tensor + replay")
                     + ("" if args.no_func else ", tracegrad.func (grad, grad_and_value, vjp, jvp)")
                     + ("" if args.no_fd else ", finite differences")
                     + (f", torch {torch.__version__}" if torch is not None else
                        ", torch itself: not importable here, not compared"))
    print(f"tracegrad {tg.__version__}, compiled target: {backend}")
    for m in modes:
        print("  " + m)

    exclude = () if args.include_known_crashes else rp.EXCLUDE
    t_exclude = () if args.include_known_crashes else rtp.EXCLUDE
    by_kind = collections.Counter()
    by_tag = collections.Counter()
    by_message = collections.Counter()
    facts_count = collections.Counter()
    replay_missed = collections.Counter()
    failures = []
    run_counts = collections.Counter()
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    end = args.start + args.count

    def record(k, which, prog, e):
        kind = f"{which}:{e.kind}"
        by_kind[kind] += 1
        by_tag.update(f"{which}:{t}" for t in set(prog.tags))
        first_line = str(e.detail).splitlines()[0][:100] if "crash" in e.kind else ""
        by_message[(kind, first_line)] += 1
        path = os.path.join(args.out, f"failure_{k}_{which}_{e.kind}.py")
        with open(path, "w") as fh:
            fh.write(f"# {which} program {k} of --seed {args.seed}: [{e.kind}]\n")
            fh.write("".join(f"# {line}\n" for line in str(e.detail).splitlines()))
            fh.write(f"# ops: {' '.join(prog.tags)}\n\n")
            fh.write(prog.reproducer())
        failures.append((k, kind, path))
        print(f"  FAIL program {k}: [{kind}] -> {path}", flush=True)

    for k in range(args.start, end):
        if not args.no_numpy_programs:
            prog = rp.generate(rp.RngChooser([args.seed, k]), seed=(args.seed, k), exclude=exclude)
            try:
                facts = rp.check_program(prog, fd=not args.no_fd, eager=not args.no_eager,
                                         uncompiled=not args.no_uncompiled)
                run_counts["numpy"] += 1
                facts_count.update(f"numpy:{f}" for f, v in facts.items()
                                   if v is True and f != "replayed")
                if not args.no_eager and not facts.get("replayed") and not facts.get("refused") \
                        and not facts.get("eager_skipped"):
                    replay_missed["numpy"] += 1
            except rp.Failure as e:
                record(k, "numpy", prog, e)
        if not args.no_torch_programs:
            prog = rtp.generate(rtp.RngChooser([args.seed, k, 1]), seed=(args.seed, k),
                                exclude=t_exclude)
            try:
                facts = rtp.check_program(prog, fd=not args.no_fd, eager=not args.no_eager,
                                          func=not args.no_func, torch_module=torch)
                run_counts["torch"] += 1
                facts_count.update(f"torch-dialect:{f}" for f, v in facts.items()
                                   if v is True and f != "replayed")
                if not args.no_eager and not facts.get("replayed"):
                    replay_missed["torch"] += 1
            except rtp.Failure as e:
                record(k, "torch-dialect", prog, e)
        done = k - args.start + 1
        if done % args.progress == 0 or k == end - 1:
            dt = time.time() - t0
            print(f"{done}/{args.count} programs, {len(failures)} failures, {dt:.0f} s "
                  f"({1000 * dt / done:.0f} ms/program)", flush=True)
        if done % 1000 == 0:
            tg.clear_cache(disk=False)   # bound the in-memory cache of a long run

    dt = time.time() - t0
    print()
    print(f"programs run: {args.count} (seed {args.seed}, programs {args.start}..{end - 1}) "
          f"in {dt:.0f} s, target {backend}")
    if not args.no_numpy_programs:
        print(f"  NumPy programs: {args.count}, passed {run_counts['numpy']}")
    if not args.no_torch_programs:
        print(f"  torch-dialect programs: {args.count}, passed {run_counts['torch']}"
              + (f" (also on torch {torch.__version__})" if torch is not None else ""))
    wrong = [f for f in failures if f[1] not in BIT_LEVEL]
    print(f"failed: {len(failures)}: wrong (a value, gradient or dtype off, or a crash): "
          f"{len(wrong)}; bit-level replay differences (equal values; known): "
          f"{len(failures) - len(wrong)}")
    for fact, n in sorted(facts_count.items()):
        print(f"  (not a failure) {fact}: {n}")
    if not args.no_eager:
        for which, n in sorted(replay_missed.items()):
            print(f"  (not a failure) {which}: eager third backward not replayed (the replay "
                  f"declined): {n}")
    if by_kind:
        print("failures by kind:")
        for kind, n in by_kind.most_common():
            print(f"  {n:6d}  {kind}")
        crashes = [(km, n) for km, n in by_message.most_common() if km[1]]
        if crashes:
            print("crashes by message:")
            for (kind, msg), n in crashes:
                print(f"  {n:6d}  {kind}: {msg}")
        print("ops in failing programs (count of programs):")
        for tag, n in by_tag.most_common(12):
            print(f"  {n:6d}  {tag}")
        print(f"reproducers in {os.path.abspath(args.out)}/")
    if tmp is not None:
        tmp.cleanup()
    return 1 if wrong or (failures and args.strict_bits) else 0


def imperative(args):
    """``--imperative N``: the random imperative programs, every mode."""
    tmp = None
    if "TRACEGRAD_CACHE_DIR" not in os.environ:
        tmp = tempfile.TemporaryDirectory(prefix="tracegrad-random-imperative-")
        os.environ["TRACEGRAD_CACHE_DIR"] = os.path.join(tmp.name, "cache")
    backend = args.backend or os.environ.get("TRACEGRAD_BACKEND") or "numpy"
    os.environ["TRACEGRAD_BACKEND"] = backend

    import tracegrad as tg
    import _random_imperative_programs as rip

    print(f"tracegrad {tg.__version__}, compiled target: {backend}")
    print("  imperative NumPy programs: NumPy, compiled (compile twice, value_and_grad), "
          "compile=False (value_and_grad)" + ("" if args.no_fd else ", finite differences"))
    exclude = () if args.include_known_crashes else rip.KNOWN_WRONG
    by_kind, refusals, known, tags = (collections.Counter() for _ in range(4))
    checked = collections.Counter()
    failures = []
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    end = args.start + args.imperative
    for k in range(args.start, end):
        prog = rip.generate(rip.RngChooser([args.seed, k, 2]), seed=(args.seed, k), exclude=exclude)
        tags.update(set(prog.tags))
        try:
            out = rip.check_program(prog, fd=not args.no_fd)
            refusals.update(f"{m}: {r}" for m, r in out.refusals.items())
            known.update(f"{m}: {r}" for m, r in out.known.items())
            checked.update(out.checked)
            checked["programs passed"] += 1
            checked["finite differences did not converge"] += out.fd_unreliable
        except rip.Failure as e:
            by_kind[e.kind] += 1
            path = os.path.join(args.out, f"imperative_failure_{k}_{e.kind}.py")
            with open(path, "w") as fh:
                fh.write(f"# imperative program {k} of --seed {args.seed}: [{e.kind}]\n")
                fh.write("".join(f"# {line}\n" for line in str(e.detail).splitlines()))
                fh.write(f"# statements: {' '.join(prog.tags)}\n\n")
                fh.write(prog.reproducer())
            failures.append((k, e.kind, path))
            print(f"  FAIL program {k}: [{e.kind}] -> {path}", flush=True)
        done = k - args.start + 1
        if done % args.progress == 0 or k == end - 1:
            dt = time.time() - t0
            print(f"{done}/{args.imperative} programs, {len(failures)} failures, {dt:.0f} s "
                  f"({1000 * dt / done:.0f} ms/program)", flush=True)
        if done % 1000 == 0:
            tg.clear_cache(disk=False)
    dt = time.time() - t0
    print()
    print(f"imperative programs run: {args.imperative} (seed {args.seed}, programs "
          f"{args.start}..{end - 1}) in {dt:.0f} s, target {backend}")
    print(f"  passed: {checked['programs passed']}; numbers compared: compiled "
          f"{checked['compiled']}, compile=False {checked['eager']}; finite differences did "
          f"not converge (stiff programs: the modes compared with each other only): "
          f"{checked['finite differences did not converge']}")
    print(f"failed (a wrong value or gradient, an unexpected crash or refusal): {len(failures)}")
    for kind, n in by_kind.most_common():
        print(f"  {n:6d}  {kind}")
    print("refusals (clear TraceError/TypeError naming the line), by mode and reason:")
    for r, n in refusals.most_common():
        print(f"  {n:6d}  {r}")
    print("known crashes (tests/_random_imperative_programs.py KNOWN_CRASHES), by mode:")
    for r, n in known.most_common():
        print(f"  {n:6d}  {r}")
    print("statements generated (count of programs):")
    print("  " + ", ".join(f"{t} {n}" for t, n in sorted(tags.items())))
    if failures:
        print(f"reproducers in {os.path.abspath(args.out)}/")
    if tmp is not None:
        tmp.cleanup()
    return 1 if failures or (known and args.strict_known) else 0


def branchy(args):
    """``--branchy N``: random programs with control flow on traced values
    (``tests/_random_branchy_programs.py``): each run on several inputs that
    take different paths through one compiled function, as NumPy, compiled
    (``tg.value_and_grad``, NumPy target; the native target too for every
    fifth program, or every program with ``--backend native``) and with
    compile=False; every third program also ``tg.jacfwd`` and ``tg.hessian``.
    Values equal NumPy's, gradients compile=False's and finite differences.
    A fallback (the function runs eagerly for the signature) is counted with
    its reason, not failed; ``fallback=False`` must then raise a TraceError
    naming the line."""
    tmp = None
    if "TRACEGRAD_CACHE_DIR" not in os.environ:
        tmp = tempfile.TemporaryDirectory(prefix="tracegrad-random-branchy-")
        os.environ["TRACEGRAD_CACHE_DIR"] = os.path.join(tmp.name, "cache")

    import tracegrad as tg
    import _random_branchy_programs as rbp

    every_native = 1 if args.backend == "native" else 5
    print(f"tracegrad {tg.__version__}: programs with control flow on traced values; NumPy, "
          f"compiled (numpy target; native every {every_native} programs), compile=False"
          + ("" if args.no_fd else ", finite differences") + "; jacfwd/hessian every 3")
    exclude = () if args.include_known_crashes else rbp.KNOWN_WRONG
    by_kind, fallbacks, tags, checked = (collections.Counter() for _ in range(4))
    failures = []
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    end = args.start + args.branchy
    for k in range(args.start, end):
        prog = rbp.generate(rbp.RngChooser([args.seed, k, 3]), seed=(args.seed, k),
                            exclude=exclude)
        tags.update(set(prog.tags))
        backends = ("numpy", "native") if k % every_native == 0 else ("numpy",)
        try:
            out = rbp.check_program(prog, backends=backends, fd=not args.no_fd,
                                    higher=k % 3 == 0)
            checked["programs passed"] += 1
            checked["inputs"] += out.inputs
            checked["programs whose inputs take >= 2 paths"] += out.paths >= 2
            checked.update(out.checked)
            checked["jacfwd/hessian"] += bool(out.higher)
            checked["finite differences did not converge"] += out.fd_unreliable
            if out.fallbacks:
                checked["programs that fell back"] += 1
                reasons = set(out.fallbacks.values())
                expected = "by design" if all(rbp.fallback_expected(prog, r) for r in reasons) \
                    else "NOT by design"
                checked[f"programs that fell back, {expected}"] += 1
                for reason in reasons:
                    fallbacks[(expected, rbp._short_reason(reason))] += 1
        except rbp.Failure as e:
            by_kind[e.kind] += 1
            path = os.path.join(args.out, f"branchy_failure_{k}_{e.kind}.py")
            with open(path, "w") as fh:
                fh.write(f"# branchy program {k} of --seed {args.seed}: [{e.kind}]\n")
                fh.write("".join(f"# {line}\n" for line in str(e.detail).splitlines()))
                fh.write(f"# statements: {' '.join(sorted(set(prog.tags)))}\n\n")
                fh.write(prog.reproducer())
            failures.append((k, e.kind, path))
            print(f"  FAIL program {k}: [{e.kind}] -> {path}", flush=True)
        done = k - args.start + 1
        if done % args.progress == 0 or k == end - 1:
            dt = time.time() - t0
            print(f"{done}/{args.branchy} programs, {len(failures)} failures, {dt:.0f} s "
                  f"({1000 * dt / done:.0f} ms/program)", flush=True)
        if done % 500 == 0:
            tg.clear_cache(disk=False)
    dt = time.time() - t0
    n = args.branchy
    print()
    print(f"branchy programs run: {n} (seed {args.seed}, programs {args.start}..{end - 1}) "
          f"in {dt:.0f} s")
    for what, c in sorted(checked.items()):
        print(f"  {what}: {c}")
    print(f"fell back (ran eagerly for the signature; right numbers): "
          f"{checked['programs that fell back']} of {n} "
          f"({100 * checked['programs that fell back'] / max(n, 1):.1f}%); by reason:")
    for (expected, reason), c in fallbacks.most_common():
        print(f"  {c:6d}  [{expected}] {reason}")
    print(f"failed (a wrong value or gradient, a crash, a retrace, an unclear error): "
          f"{len(failures)}")
    for kind, c in by_kind.most_common():
        print(f"  {c:6d}  {kind}")
    print("statements generated (count of programs):")
    print("  " + ", ".join(f"{t} {c}" for t, c in sorted(tags.items())))
    if failures:
        print(f"reproducers in {os.path.abspath(args.out)}/")
    rbp.cleanup()
    if tmp is not None:
        tmp.cleanup()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
