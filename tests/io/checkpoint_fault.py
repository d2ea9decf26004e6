#!/usr/bin/env python3
"""Fault injection into checkpoint saves: every file operation, every rank, EIO and crash.

Runs the worker (checkpoint_fault.cpp) at N ranks: first once to count each rank's file
operations in a save, then, for every rank R and every operation K of that rank,

  eio:  the K-th operation on rank R fails with EIO. The worker checks that every rank
        threw checkpoint_error (or, for an ignored cleanup step, that none did), that the
        folder then holds the old or the new checkpoint bit for bit, and that a clean save
        afterwards leaves only its own files;
  kill: rank R is killed (SIGKILL) at its K-th operation, which ends the job; a second run
        of the worker (`verify`) checks the folder the same way.

Never neither, never a mix, never a hang (each run has a deadline). The old checkpoint and
the new one are the same step: the case in which a save could destroy both.

  checkpoint_fault.py --mpiexec mpiexec.mpich --worker build/tests/io/checkpoint_fault \
                      --dir /tmp/ckpt-fault [--ranks 2]
"""
import argparse
import re
import shutil
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--np-flag", default="-n")
    ap.add_argument("--worker", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--deadline", type=float, default=60.0, help="seconds per worker run")
    a = ap.parse_args()

    def launch(*args):
        cmd = [a.mpiexec, a.np_flag, str(a.ranks), a.worker, *args]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.deadline)
        except subprocess.TimeoutExpired:
            return None, "", f"no answer after {a.deadline} s (a hang): {' '.join(cmd)}"
        return p.returncode, p.stdout, p.stderr

    start = time.monotonic()
    shutil.rmtree(a.dir, ignore_errors=True)
    rc, out, err = launch("count", a.dir)
    if rc != 0:
        sys.exit(f"checkpoint_fault.py: the clean save failed (exit {rc}):\n{out}{err}")
    ops = {int(r): int(n) for r, n in re.findall(r"^ops (\d+) (\d+)$", out, re.M)}
    if sorted(ops) != list(range(a.ranks)) or min(ops.values()) < 1:
        sys.exit(f"checkpoint_fault.py: cannot read the operation counts from:\n{out}{err}")
    print("file operations of one save, per rank:", ", ".join(f"rank {r}: {ops[r]}" for r in sorted(ops)))

    failures = []
    outcomes = {}  # (mode, rank) -> list of "old"/"new" by K
    for mode in ("eio", "kill"):
        for rank in sorted(ops):
            seen = outcomes.setdefault((mode, rank), [])
            for k in range(1, ops[rank] + 1):
                where = f"{mode} at operation {k} on rank {rank}"
                rc, out, err = launch("fault", a.dir, str(rank), str(k), mode)
                if mode == "eio":
                    m = re.search(r"^(threw|saved), verified (old|new)", out, re.M)
                    if rc != 0 or not m:
                        failures.append(f"{where}: exit {rc}\n{out}{err}")
                        seen.append("FAILED")
                        continue
                    seen.append(m.group(2) + ("" if m.group(1) == "threw" else "*"))
                else:
                    if rc == 0 or f"fault at operation {k}:" not in err:
                        failures.append(f"{where}: the worker was not killed there (exit {rc})\n{out}{err}")
                        seen.append("FAILED")
                        continue
                    rc, out, err = launch("verify", a.dir)
                    m = re.search(r"^verified (old|new)$", out, re.M)
                    if rc != 0 or not m:
                        failures.append(f"{where}, then loading: exit {rc}\n{out}{err}")
                        seen.append("FAILED")
                        continue
                    seen.append(m.group(1))
    # The enumeration spans the commit point: a fault at the first operation keeps the old
    # checkpoint, a crash at rank 0's last one (cleanup, after the commit) keeps the new.
    for mode in ("eio", "kill"):
        if outcomes[(mode, 0)][0] != "old":
            failures.append(f"{mode} at rank 0's first operation: {outcomes[(mode, 0)][0]}, expected old")
    if outcomes[("kill", 0)][-1] != "new":
        failures.append(f"kill at rank 0's last operation: {outcomes[('kill', 0)][-1]}, expected new")

    for (mode, rank), seen in sorted(outcomes.items()):
        print(f"{mode:4} rank {rank}: " + " ".join(f"{k + 1}:{s}" for k, s in enumerate(seen)))
    print("(old/new: what loads afterwards; * the save succeeded: an ignored cleanup error)")
    shutil.rmtree(a.dir, ignore_errors=True)
    runs = sum(len(s) for s in outcomes.values())
    print(f"{runs} faulty saves in {time.monotonic() - start:.1f} s")
    if failures:
        print(f"\n{len(failures)} FAILED:", file=sys.stderr)
        for f in failures:
            print("---\n" + f, file=sys.stderr)
        sys.exit(1)
    print("every fault left the old or the new checkpoint, intact")


if __name__ == "__main__":
    main()
