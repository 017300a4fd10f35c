#!/usr/bin/env python3
"""Runs the qkv executable over the oracle cases in tests/oracle/cases and compares its outputs
with the expected ones.

usage: run_oracle.py QKV [--cases DIR] [--only SUBSTR] [--timeout S] [--keep] [-v]
                       [--ring LAUNCHER]

A case is a folder with `cmd` (the qkv arguments), `expect.json` (what must hold), its input
files and, for a case that succeeds, `expected/` (outputs computed in float64). Each case runs in
a fresh scratch folder holding only its input files, as `QKV <arguments of cmd>`.

  kind "ok":    exit status 0; every listed output present, of the listed dtype and shape (leading
                ones may differ where the case allows it), no NaN, -inf exactly where expected,
                no other infinity, and max|actual - expected| <= tol * max(1, max|expected|)
                (tol from the case, 2e-5 by default).
  kind "error": exit status 1..127 (no signal, no timeout), exactly one non-empty line on stderr
                naming one of the listed files (or flags), and no file created.

--ring "mpirun -np 2 ..." runs the `qkv attention` success cases whose flags the ring takes
(not --weights, --cu-seqlens-*, --check, a --dropout above 0; the gradients go round the ring
too) as `LAUNCHER QKV ... --ring`, attention across processes, against the same expected
outputs; the other cases are counted as not for the ring.

Cases of features that have not shipped are listed in PENDING: they run, and are reported and
counted as pending, never skipped in silence, and do not decide the exit status; one that passes
is reported as passing (an error case of a feature not shipped may pass already: qkv refuses the
flag it does not know, naming it), so that the list is taken down when the feature ships. The
last line is `N passed, M failed, P pending (why; K of them pass)`; the exit status is 0 only
when no case failed and at least one passed. Needs Python 3 and NumPy.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CASES = os.path.join(HERE, "cases")
DEFAULT_TOL = 2e-5

# Case-name prefixes of features that have not shipped, and why. A case here is still run.
PENDING = {}


def pending_reason(name):
    for prefix, reason in PENDING.items():
        if name.startswith(prefix):
            return reason
    return None


def case_dirs(root):
    """Every folder under root (at any depth) that holds an expect.json, sorted."""
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders.sort()
        if "expect.json" in files:
            found.append(folder)
            subfolders[:] = []  # a case's expected/ is not a case
    return sorted(found)


def check_output(path, spec, case):
    """(ok, note) for one output file against its expected array."""
    expected = np.load(os.path.join(case, spec["expected"]), allow_pickle=False)
    if not os.path.isfile(path):
        return False, "missing"
    try:
        actual = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        return False, "not a readable .npy (%s)" % str(e).splitlines()[0][:80]
    want_dtype = np.dtype(spec["dtype"])
    if actual.dtype != want_dtype:
        return False, "dtype %s, expected %s" % (actual.dtype.str, want_dtype.str)
    if actual.shape != expected.shape:
        def squeezed(shape):
            shape = list(shape)
            while shape and shape[0] == 1:
                shape.pop(0)
            return shape
        if not (spec.get("shape_leading_ones_ok") and
                squeezed(actual.shape) == squeezed(expected.shape)):
            return False, "shape %s, expected %s" % (actual.shape, expected.shape)
        actual = actual.reshape(expected.shape)
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    if np.isnan(a).any():
        return False, "%d NaN" % int(np.isnan(a).sum())
    minus_inf = np.isneginf(e)
    if not np.array_equal(np.isneginf(a), minus_inf):
        return False, "-inf at %d places, expected %d" % (int(np.isneginf(a).sum()),
                                                         int(minus_inf.sum()))
    finite = ~minus_inf
    if np.isinf(a[finite]).any():
        return False, "unexpected infinity"
    if not finite.any():
        return True, "all -inf as expected"
    scale = max(1.0, float(np.abs(e[finite]).max()))
    tol = float(spec.get("tol", DEFAULT_TOL)) * scale
    err = float(np.abs(a[finite] - e[finite]).max())
    return err <= tol, "max abs error %.2e (tolerance %.1e)" % (err, tol)


def names_one_of(line, names):
    # A name counts where it is not the tail of a longer word ("q.npy" is not in "xq.npy").
    return any(re.search(r"(?<![A-Za-z0-9_])" + re.escape(n), line) for n in names)


# The flags qkv attention --ring refuses (docs/interface.md, "Attention across processes").
RING_REFUSES = ("--weights", "--cu-seqlens-q", "--cu-seqlens-k", "--check")


def ring_command(args, expect, launcher):
    """The case's command under `launcher` with --ring, or None when it is not for the ring."""
    if expect["kind"] != "ok" or not args or args[0] != "attention":
        return None
    if any(a in RING_REFUSES for a in args):
        return None
    # --dropout P > 0 is refused too (the ranks draw no mask); --dropout 0 is the plain run.
    if any(a == "--dropout" and float(p) != 0.0 for a, p in zip(args, args[1:])):
        return None
    # The ring's backward computes in float32 or float64: it refuses bf16 gradients.
    bf16 = any(a == "--dtype" and b == "bf16" for a, b in zip(args, args[1:]))
    if bf16 and "--grad-out" in args:
        return None
    return shlex.split(launcher) + args + ["--ring"]


def run_case(qkv, case, timeout, keep, ring=None):
    """(ok, note) for one case; (None, note) when --ring does not apply to it."""
    with open(os.path.join(case, "expect.json")) as f:
        expect = json.load(f)
    with open(os.path.join(case, "cmd")) as f:
        args = shlex.split(f.read())
    command = [qkv] + args
    if ring is not None:
        ringed = ring_command(args, expect, ring)
        if ringed is None:
            return None, "not for --ring"
        command = ringed[:len(ringed) - len(args) - 1] + [qkv] + args + ["--ring"]
    work = tempfile.mkdtemp(prefix="qkv_oracle_")
    try:
        for name in os.listdir(case):
            source = os.path.join(case, name)
            if os.path.isfile(source) and name not in ("cmd", "expect.json"):
                shutil.copyfile(source, os.path.join(work, name))
        before = set(os.listdir(work))
        try:
            run = subprocess.run(command, cwd=work, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, "no answer after %g s" % timeout
        stderr = run.stderr.decode("utf-8", "replace")
        if expect["kind"] == "ok":
            if run.returncode != 0:
                return False, "exit status %d: %s" % (run.returncode,
                                                      stderr.strip().replace("\n", " | ")[:200])
            ok, notes = True, []
            for output, spec in sorted(expect["outputs"].items()):
                good, note = check_output(os.path.join(work, output), spec, case)
                ok = ok and good
                notes.append("%s: %s" % (output, note))
            return ok, "; ".join(notes)
        if expect["kind"] != "error":
            return False, "unknown kind %r in expect.json" % expect["kind"]
        problems = []
        if run.returncode == 0:
            problems.append("exit status 0")
        elif not 1 <= run.returncode <= 127:
            problems.append("ended by a signal or crashed (status %d)" % run.returncode)
        message = stderr.rstrip("\r\n")
        if not message.strip():
            problems.append("nothing on stderr")
        elif "\n" in message:
            problems.append("%d lines on stderr" % (message.count("\n") + 1))
        elif expect.get("stderr_mentions_any") and not names_one_of(
                message, expect["stderr_mentions_any"]):
            problems.append("stderr names none of %s" % ", ".join(expect["stderr_mentions_any"]))
        created = sorted(set(os.listdir(work)) - before)
        if created:
            problems.append("created %s" % ", ".join(created))
        shown = message.strip().replace("\n", " | ")[:160]
        if problems:
            return False, "; ".join(problems) + " (stderr: %s)" % shown
        return True, "refused: %s" % shown
    finally:
        if keep:
            print("    scratch folder kept: %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("qkv", help="the qkv executable")
    parser.add_argument("--cases", default=DEFAULT_CASES,
                        help="a folder of cases, or one case (default: %(default)s)")
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folders")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each case's desc")
    parser.add_argument("--ring", default=None, metavar="LAUNCHER",
                        help="run the attention cases the ring takes as LAUNCHER QKV ... --ring")
    a = parser.parse_args()

    qkv = os.path.abspath(a.qkv)
    if not (os.path.isfile(qkv) and os.access(qkv, os.X_OK)):
        print("run_oracle: %s is not an executable (build it first: cmake --build build "
              "--target qkv_cli)" % a.qkv)
        return 1
    cases = [c for c in case_dirs(os.path.abspath(a.cases))
             if a.only in os.path.basename(c)]
    if not cases:
        print("run_oracle: no case under %s%s" % (a.cases, " matches %r" % a.only if a.only else ""))
        return 1

    root = os.path.abspath(a.cases)
    passed = failed = not_ring = 0
    pending = {}  # reason -> [cases, of which passing]
    for case in cases:
        name = os.path.basename(case)
        shown = os.path.relpath(case, root) if case != root else name
        ok, note = run_case(qkv, case, a.timeout, a.keep, a.ring)
        if ok is None:
            not_ring += 1
            continue
        reason = pending_reason(name)
        if reason is None:
            status = "PASS" if ok else "FAIL"
            passed += ok
            failed += not ok
        else:
            counts = pending.setdefault(reason, [0, 0])
            counts[0] += 1
            counts[1] += ok
            status = "pending (%s), %s" % (reason, "passes" if ok else "fails")
        print("%s %s: %s" % (status, shown, note), flush=True)
        if a.verbose:
            with open(os.path.join(case, "expect.json")) as f:
                print("    %s" % json.load(f).get("desc", ""))
    summary = "%d passed, %d failed" % (passed, failed)
    if a.ring is not None:
        summary += ", %d not for --ring" % not_ring
    for reason, (count, passing) in sorted(pending.items()):
        summary += ", %d pending (%s; %d of them pass)" % (count, reason, passing)
    print(summary)
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
