#!/usr/bin/env python3
"""Runs tests/comm/fault_program.cpp many times and checks that no error is lost or hangs.

  fault_driver.py --mpiexec M --np-flag -n --program P --ranks N --case CASE [--runs K]

Cases (see fault_program.cpp):
  fail-all  every rank fails: every rank's whole message (from "[rank r of N] zest: ..." to
            "END r", byte for byte as the program builds it) must be in the output of every
            run, and the exit status 1, report_and_abort's, in every run: never the launcher's
            9 (a rank killed) nor its "BAD TERMINATION" banner.
  stop      the last rank stops before an all_reduce; with ZEST_WATCHDOG_MS=1000 every other
            rank must report a collective_timeout naming the op, the axis, the count and the
            silent rank, and the run must end (non-zero) well before the stopped rank would.
  exit      the same, with the last rank leaving main() instead of stopping.
  mismatch  rank 0 reduces with another op (same size) and every rank returns 0: the end of
            the run's schedule check must end every rank with status 1 and name the axis.
  skip      the last rank skips an all_reduce, the next one pairs with it; the others then
            wait in that next call, the last rank in check_schedule: every rank's timeout
            must name call #0, made from two lines, as the first call that did not match.
  agree     the same calls everywhere: status 0 and no message.
Passes only if all K runs pass; prints each failing run's output.
"""
import argparse
import os
import re
import subprocess
import sys
import time


def expected_failure(rank, ranks):
    filler = "".join(
        f"\n  detail line {line} of rank {rank}: " + "x" * 64 for line in range(24))
    return (f"[rank {rank} of {ranks}] zest: fault_program: deliberate failure on rank {rank}"
            f"{filler}\nEND {rank}\n")


def check(case, ranks, status, output, elapsed, watchdog_s):
    problems = []
    if case == "agree":
        if status != 0:
            problems.append(f"exit status {status}, expected 0")
        if "zest:" in output:
            problems.append("a zest message in a run whose ranks agree")
        return problems
    if status == 0:
        problems.append("exit status 0, expected a failure")
    if case == "mismatch":
        if status != 1:
            problems.append(f"exit status {status}, expected 1")
        if "BAD TERMINATION" in output:
            problems.append("the launcher reports a bad termination: a rank was killed")
        for r in range(ranks):
            pattern = (rf"\[rank {r} of {ranks}\] zest: collective mismatch on axis 'world' found "
                       rf"at the end of the run \(mpi_environment\): the ranks of the axis did "
                       rf"not issue the same collectives since it was made or last checked: rank 0: "
                       rf"1 call, sequence A; ranks? 1(-{ranks - 1})?: 1 call, sequence B "
                       rf"\(as many calls, not the same ones\)")
            if not re.search(pattern, output):
                problems.append(f"rank {r}: no end-of-run mismatch message as expected")
        if "axis 'freed'" in output:
            problems.append("the freed communicator, whose ranks agree, is named")
        return problems
    if case == "skip":
        last = ranks - 1
        blame = (r"the first call made from other lines is #0: this rank's all_reduce<double>\[64\] "
                 r"#0 at comm/fault_program\.cpp:(\d+), rank \d+'s all_reduce<double>\[64\] #0 at "
                 r"comm/fault_program\.cpp:(\d+) \(alike calls: unless a branch")
        for r in range(ranks):
            if r < last:
                head = (rf"\[rank {r} of {ranks}\] zest: collective timeout on axis 'world': "
                        rf"all_reduce<double>\[64\] #1 on rank {r} of {ranks} not complete[^\n]*"
                        rf"rank {last} waits in a check of the axis[^\n]*after its 1 call;")
            else:
                head = (rf"\[rank {r} of {ranks}\] zest: collective timeout on axis 'world': "
                        rf"check_schedule at the step's end on rank {r} of {ranks} not complete"
                        rf"[^\n]*waits in call #1 instead")
            found = re.search(head + r"[^\n]*" + blame, output)
            if not found:
                problems.append(f"rank {r}: no timeout naming call #0 as the first unmatched")
            elif found.group(1) == found.group(2):
                problems.append(f"rank {r}: the two calls are named at the same line")
        if elapsed > watchdog_s + 30:
            problems.append(f"took {elapsed:.1f} s: the watchdog did not end the run")
        return problems
    if case == "fail-all":
        if status not in (0, 1):
            problems.append(f"exit status {status}, expected 1 (every rank exits with 1)")
        if "BAD TERMINATION" in output:
            problems.append("the launcher reports a bad termination: a rank was killed")
        for r in range(ranks):
            if expected_failure(r, ranks) not in output:
                problems.append(f"rank {r}'s message is missing or not whole")
    else:
        last = ranks - 1
        for r in range(last):
            pattern = (rf"\[rank {r} of {ranks}\] zest: collective timeout on axis 'world': "
                       rf"all_reduce<double>\[64\] #0 on rank {r} of {ranks} not complete after "
                       rf"[0-9.]+ s; called at comm/fault_program\.cpp:\d+; the axis spans world "
                       rf"ranks 0-{last}[^\n]*no word from ranks {last} of the axis")
            if not re.search(pattern, output):
                problems.append(f"rank {r}: no collective_timeout message as expected")
        if elapsed > watchdog_s + 30:
            problems.append(f"took {elapsed:.1f} s: the watchdog did not end the run")
    return problems


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mpiexec", required=True)
    p.add_argument("--np-flag", default="-n")
    p.add_argument("--program", required=True)
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--case", choices=["fail-all", "stop", "exit", "skip", "mismatch", "agree"], required=True)
    p.add_argument("--runs", type=int, default=1)
    args = p.parse_args()

    env = dict(os.environ)
    watchdog_s = 1.0
    env["ZEST_WATCHDOG_MS"] = str(int(watchdog_s * 1000))
    failed = 0
    start_all = time.monotonic()
    for run in range(args.runs):
        start = time.monotonic()
        try:
            done = subprocess.run(
                [args.mpiexec, args.np_flag, str(args.ranks), args.program, args.case],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=120)
            status, output = done.returncode, done.stdout.decode(errors="replace")
        except subprocess.TimeoutExpired as e:
            status, output = -1, (e.stdout or b"").decode(errors="replace") + "\n(timed out)"
        elapsed = time.monotonic() - start
        problems = check(args.case, args.ranks, status, output, elapsed, watchdog_s)
        if problems:
            failed += 1
            print(f"--- run {run + 1}: FAILED ({elapsed:.1f} s, status {status}): "
                  + "; ".join(problems))
            print(output)
    total = time.monotonic() - start_all
    print(f"fault_driver: {args.case} at {args.ranks} ranks: "
          f"{args.runs - failed} of {args.runs} runs as expected ({total:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
