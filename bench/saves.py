#!/usr/bin/env python3
"""Asynchronous against synchronous checkpoint saves on train_gpt's default model.

For each rank count, rounds of two runs each, interleaved (the order alternating): the
default model trained --steps steps with --save every --every steps, synchronously, and
the same with --async-save. A save's stall is the time the training loop spends on it: the
save call, plus, for an asynchronous save, the time the next optimizer update waits for its
shard (train_gpt's log, summary "save_stall_s"). The run's last save, which nothing runs
beside, is left out. Prints the medians per save and their ratio as METRIC lines, and the
bytes each mode's checkpoint holds (its manifest's shard files), which must be equal.

  saves.py --train-gpt build/bench/examples/train_gpt --mpiexec mpiexec.mpich \\
           --work build/bench/saves [--ranks 2,4] [--rounds 3]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys


def run(a, ranks, mode, folder):
    save = os.path.join(folder, "ckpt")
    log = os.path.join(folder, "log.json")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    cmd = [a.mpiexec, "-n", str(ranks), a.train_gpt, "--steps", str(a.steps), "--save", save,
           "--save-every", str(a.every), "--log", log, "--sample", "0", "--quiet"]
    if mode == "async":
        cmd.append("--async-save")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    if p.returncode != 0:
        sys.exit("saves.py: %s failed (%d):\n%s%s" % (" ".join(cmd), p.returncode, p.stdout,
                                                       p.stderr))
    with open(log) as f:
        stalls = json.load(f)["summary"]["save_stall_s"]
    with open(os.path.join(save, "manifest.json")) as f:
        manifest = json.load(f)
    data_bytes = sum(f["bytes"] for f in manifest["files"])
    return stalls[:-1], data_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-gpt", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=10)
    a = ap.parse_args()
    for ranks in (int(r) for r in a.ranks.split(",")):
        stalls = {"sync": [], "async": []}
        data = {}
        for k in range(a.rounds):
            order = ("sync", "async") if k % 2 == 0 else ("async", "sync")
            for mode in order:
                s, b = run(a, ranks, mode, os.path.join(a.work, "np%d_%s" % (ranks, mode)))
                stalls[mode] += s
                data.setdefault(mode, set()).add(b)
        sync = statistics.median(stalls["sync"])
        asyn = statistics.median(stalls["async"])
        print("%d ranks: stall per save, median of %d: sync %.2f ms, async %.2f ms (%.1f%%); "
              "checkpoint data %s / %s bytes" %
              (ranks, len(stalls["sync"]), 1e3 * sync, 1e3 * asyn, 100 * asyn / sync,
               sorted(data["sync"]), sorted(data["async"])))
        print("METRIC save_stall_ms_sync_np%d %.4f" % (ranks, 1e3 * sync))
        print("METRIC save_stall_ms_async_np%d %.4f" % (ranks, 1e3 * asyn))
        print("METRIC save_stall_ratio_async_vs_sync_np%d %.4f" % (ranks, asyn / sync))
        same = data["sync"] == data["async"] and len(data["sync"]) == 1
        print("METRIC save_bytes_np%d %d" % (ranks, min(data["sync"])))
        print("METRIC save_bytes_equal_np%d %d" % (ranks, 1 if same else 0))
        if not same:
            sys.exit("saves.py: the checkpoints' data differ: %r" % data)


if __name__ == "__main__":
    main()
