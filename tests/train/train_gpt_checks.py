#!/usr/bin/env python3
"""End-to-end checks of examples/train_gpt that read its JSON log (tests/train/CMakeLists.txt).

  train_gpt_checks.py refuse --expect REGEX [--max-seconds S] -- COMMAND...
      COMMAND fails (exit status > 0, not a signal) within S seconds, and its output
      matches REGEX. "@EMPTY@" in COMMAND stands for an empty argument.
  train_gpt_checks.py fp16-skip --run PREFIX... --dir D
      an fp16 run whose first loss scale overflows: the log shows skipped steps, the
      scale halving at each, and then applied steps with a finite, decreasing loss.
  train_gpt_checks.py diverge --run PREFIX... --dir D
      an fp32 run at an absurd learning rate stops with a message about divergence (step
      and loss), exit status non-zero, and its log holds the non-finite step as null.
  train_gpt_checks.py steps0 --run PREFIX... --dir D
      --steps 0 --log F: exit status 0, a log with no steps and no final loss.
  train_gpt_checks.py resume --mpiexec MPIEXEC --np-flag FLAG --train-gpt EXE --dir D -- ARGS...
      --schedule-steps 20 --steps 10 --save on 2 ranks (ZeRO-3), then --steps 20 --load on
      4 ranks (ZeRO-1), against the uninterrupted 20-step run on 2 ranks: every step's loss
      to 1e-5 relative, and the learning rates exactly.

  train_gpt_checks.py ranks --mpiexec MPIEXEC --np-flag FLAG --train-gpt EXE --dir D
                      [--ranks 2,4] [--stages 0,1,2,3] -- ARGS...
      for every stage, 20 steps on each number of ranks against 20 steps on 1 rank: every
      step's loss to 1e-5 relative, and every tensor of the final checkpoint (parameters,
      master weights, Adam moments) to 1e-5 relative (absolute below 1); the loss decreases;
      the log names the model (--arch and its config). An entry N/tpK/spJ/hsdpH of --ranks
      runs N ranks with --tp K, --sp J and --hsdp H (any may be left out; the data axis
      takes the rest); the log's mesh must say so (hsdp H: node=H). Every run's peak bytes stay within the memory estimated
      before it, and the activations estimated per rank are less than the 1-rank run's
      and at least 1/N of them.
  train_gpt_checks.py recompute --dir D -- PREFIX...
      PREFIX --recompute none, selective and full (20 steps, --log, --save): the same
      losses and every checkpoint tensor bit for bit, the same bytes sent per step, a lower
      peak under selective than none and under full than selective, as the memory estimated
      before each run says, and each peak within that estimate; the log names the mode.
  train_gpt_checks.py zeropp --dir D -- PREFIX...
      PREFIX --zero 3 and PREFIX --zeropp hpz,qwz,qgz --nodes 2, 300 steps each: the
      ZeRO++ run's final loss (the last 10 steps' mean) within 2 % of ZeRO-3's, under a
      third of its bytes sent per step; the log names the parts; each peak within the
      memory estimated before the run.
  train_gpt_checks.py inventory --mpiexec MPIEXEC --np-flag FLAG --train-gpt EXE --dir D
                      --np N -- ARGS...
      for every parallel shape train_gpt runs on N ranks (data parallel under ZeRO 0-3,
      hybrid sharding, ZeRO++, tensor and sequence parallel, Ulysses, experts with capacity
      and dropless, alone and with tp or sp, recomputation), 2 steps with --log: each step's recorded collectives
      (rank 0's, per mesh axis and kind: calls and bytes) equal the inventory the planner
      derived before the run (zest::inventory_step, in the log), exactly; dropless experts'
      all-to-alls in calls, their bytes at most the inventory's; an axis of one rank sends
      nothing. --explain prints the same inventory without training.
  train_gpt_checks.py trains --dir D -- COMMAND...
      COMMAND (a run with --steps) trains: its applied steps' losses are finite and the last
      ones lower than the first ones.

PREFIX is the command that runs train_gpt (mpiexec -n 2 .../train_gpt --small-model-flags).
"""
import argparse
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import time


def fail(why, output=""):
    if output:
        print(output)
    print("FAILED: " + why)
    sys.exit(1)


def run(cmd, expect_ok=True, timeout=240):
    print("$ " + " ".join(cmd), flush=True)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    start = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env)
    seconds = time.monotonic() - start
    if expect_ok and p.returncode != 0:
        fail("exit status %d" % p.returncode, p.stdout)
    return p, seconds


def number(record, key):
    """A number of the log: null named in "nonfinite" is the NaN or infinity it names."""
    v = record.get(key)
    if v is None:
        spelt = record.get("nonfinite", {}).get(key)
        if spelt is None:
            fail("%r is null and not named in \"nonfinite\": %r" % (key, record))
        return float(spelt)
    return float(v)


def read_log(path):
    with open(path) as f:
        return json.load(f)  # strict enough: Python's json would accept NaN, so check below


def check_strict_json(path):
    with open(path) as f:
        text = f.read()
    if re.search(r"\b(NaN|Infinity)\b", text):
        fail(path + " spells a non-finite number, which is not JSON")


def cmd_refuse(a):
    cmd = ["" if c == "@EMPTY@" else c for c in a.command]
    p, seconds = run(cmd, expect_ok=False, timeout=max(60, a.max_seconds * 4))
    print(p.stdout)
    if p.returncode == 0:
        fail("the command succeeded")
    if p.returncode < 0:
        fail("the command died of signal %d" % -p.returncode)
    if not re.search(a.expect, p.stdout):
        fail("the output does not match %r" % a.expect)
    if seconds > a.max_seconds:
        fail("the refusal took %.2f s, more than %.2f s" % (seconds, a.max_seconds))
    print("refused in %.2f s, as expected" % seconds)


def fresh(d):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)


def cmd_fp16_skip(a):
    fresh(a.dir)
    log = os.path.join(a.dir, "fp16.json")
    p, _ = run(a.run + ["--log", log])
    print(p.stdout)
    if "skipped: inf/nan gradients at loss scale" not in p.stdout:
        fail("the progress lines show no skipped step")
    check_strict_json(log)
    steps = read_log(log)["steps"]
    skipped = [s for s in steps if not s["applied"]]
    applied = [s for s in steps if s["applied"]]
    if not skipped or steps[0]["applied"]:
        fail("the first step, at the overflowing scale, was not skipped")
    for s in skipped:
        if s["grad_norm"] is not None or s["nonfinite"]["grad_norm"] != "inf":
            fail("a skipped step's gradient norm is not logged as null + \"inf\": %r" % s)
        if not math.isfinite(s["loss"]):
            fail("a skipped step's loss is not finite: %r" % s)
    # The scale halves at every skipped step and holds while steps are applied.
    for prev, cur in zip(steps, steps[1:]):
        want = prev["loss_scale"] / 2 if not prev["applied"] else prev["loss_scale"]
        if cur["loss_scale"] != want:
            fail("step %d: loss scale %r after %r (applied %r), expected %r" %
                 (cur["step"], cur["loss_scale"], prev["loss_scale"], prev["applied"], want))
    if steps[-1]["applied"] is not True or len(applied) < 6:
        fail("training did not go on after the skipped steps (%d applied)" % len(applied))
    if any(s["applied"] for s in steps[:len(skipped)]):
        fail("the skipped steps are not the first ones")
    losses = [s["loss"] for s in applied]
    if not all(math.isfinite(x) for x in losses):
        fail("an applied step's loss is not finite: %r" % losses)
    first, last = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
    if not last < first - 0.05:
        fail("the loss did not decrease after the skipped steps: %r" % losses)
    print("%d steps skipped (scale %g -> %g), %d applied, loss %.4f -> %.4f" %
          (len(skipped), steps[0]["loss_scale"], applied[0]["loss_scale"], len(applied), first,
           last))


def cmd_diverge(a):
    fresh(a.dir)
    log = os.path.join(a.dir, "diverge.json")
    p, _ = run(a.run + ["--log", log], expect_ok=False)
    print(p.stdout)
    if p.returncode == 0:
        fail("a diverged run exited with status 0")
    m = re.search(r"training diverged at step (\d+): loss (\S+)", p.stdout)
    if not m:
        fail("no message about divergence (step, loss)")
    if "JSON" in p.stdout:
        fail("the message speaks of JSON")
    check_strict_json(log)
    j = read_log(log)
    last = j["steps"][-1]
    if last["step"] != int(m.group(1)) or j["summary"]["diverged_at_step"] != last["step"]:
        fail("the log's last step %r is not the one reported (%s)" % (last, m.group(1)))
    bad = [k for k in ("loss", "grad_norm") if not math.isfinite(number(last, k))]
    if not bad:
        fail("the last step of the log has only finite numbers: %r" % last)
    for k in bad:
        if last[k] is not None or k not in last["nonfinite"]:
            fail("%r of the diverged step is not null + named in \"nonfinite\": %r" % (k, last))
    print("diverged at step %s, reported and logged (%s non-finite)" % (m.group(1), bad))


def cmd_steps0(a):
    fresh(a.dir)
    log = os.path.join(a.dir, "steps0.json")
    p, _ = run(a.run + ["--steps", "0", "--log", log])
    print(p.stdout)
    check_strict_json(log)
    j = read_log(log)
    if j["steps"] != [] or "final_loss" in j["summary"] or j["summary"]["steps_trained"] != 0:
        fail("the log of --steps 0 is not empty of steps: %r" % j)
    if "no steps trained" not in p.stdout:
        fail("the summary line does not say that no step was trained")
    print("--steps 0 --log: a log without steps")


def cmd_resume(a):
    fresh(a.dir)
    mpi = lambda n: [a.mpiexec, a.np_flag, str(n), a.train_gpt] + a.args
    whole, part1, part2 = (os.path.join(a.dir, n) for n in ("whole.json", "a.json", "b.json"))
    ckpt = os.path.join(a.dir, "ckpt")
    run(mpi(2) + ["--zero", "3", "--steps", "20", "--log", whole])
    # --save-args: how the first part saves (--async-save --save-every 3: saves at steps 3, 6
    # and 9 written while training goes on, each committed by the next, then step 10's).
    p, _ = run(mpi(2) + ["--zero", "3", "--schedule-steps", "20", "--steps", "10", "--save", ckpt,
                         "--log", part1] + a.save_args.split())
    if a.save_args and not re.search(r"saved \S+ at step 10 \(4 saves, async; stall per save",
                                     p.stdout):
        fail("the run with %s did not report its 4 saves" % a.save_args, p.stdout)
    # Another --schedule-steps on resume is refused, naming the checkpoint's.
    p, _ = run(mpi(4) + ["--zero", "1", "--steps", "20", "--schedule-steps", "30", "--load",
                         ckpt], expect_ok=False)
    if p.returncode == 0 or not re.search(
            r"--schedule-steps 30 differs from the learning-rate schedule of checkpoint \S+ "
            r"\(--schedule-steps 20\)", p.stdout):
        fail("a different --schedule-steps on resume was not refused", p.stdout)
    # The refusal names this run's value and the checkpoint's, each as short as it reads back.
    p, _ = run(mpi(2) + ["--steps", "20", "--lr", "0.001", "--load", ckpt], expect_ok=False)
    if p.returncode == 0 or not re.search(
            r"--lr 0\.001 differs from the learning-rate schedule of checkpoint \S+ \(--lr 0\.003\)",
            p.stdout):
        fail("another --lr on resume was not refused with both values", p.stdout)
    # A --log that is not a training log: refused up front, naming the file's role.
    not_a_log = os.path.join(a.dir, "not_a_log.txt")
    with open(not_a_log, "w") as f:
        f.write("some notes, not a log\n")
    p, _ = run(mpi(2) + ["--steps", "20", "--load", ckpt, "--log", not_a_log], expect_ok=False)
    if p.returncode != 1 or "--log %s: the file exists and is not a training log" % not_a_log \
            not in p.stdout:
        fail("a --log that is not a training log was not refused as such", p.stdout)
    # An output inside the checkpoint that the run saves: refused before any work, and the
    # checkpoint is intact (the resumed run below loads it).
    p, _ = run(mpi(2) + ["--steps", "20", "--load", ckpt, "--save", ckpt, "--plot",
                         os.path.join(ckpt, "manifest.json")], expect_ok=False)
    if p.returncode != 1 or "is inside the --save folder" not in p.stdout:
        fail("--plot into the --save folder was not refused", p.stdout)
    # Another data stream (here another --seed: another order of batches) is refused, naming
    # both; with --new-data it is taken, with a note naming each other setting.
    p, _ = run(mpi(2) + ["--steps", "10", "--load", ckpt, "--seed", "7"], expect_ok=False)
    if p.returncode != 1 or not re.search(
            r"the checkpoint's data stream differs from this run's \(identity: saved "
            r"\"batch_sampler seed=1234 tokens=\d+ xxh64:[0-9a-f]+\", this run \"batch_sampler "
            r"seed=7 ", p.stdout):
        fail("a resume with another --seed was not refused as another data stream", p.stdout)
    p, _ = run(mpi(2) + ["--steps", "10", "--load", ckpt, "--seed", "7", "--new-data"])
    if "note: the checkpoint was trained with other settings: --seed 1234 (this run: 7)" \
            not in p.stdout or "note: --new-data: identity: saved" not in p.stdout:
        fail("--new-data did not report the other settings and the other stream", p.stdout)
    run(mpi(4) + ["--zero", "1", "--steps", "20", "--load", ckpt, "--log", part2])
    a_steps = read_log(whole)["steps"]
    b_steps = read_log(part1)["steps"] + read_log(part2)["steps"]
    if [s["step"] for s in a_steps] != list(range(1, 21)) or \
            [s["step"] for s in b_steps] != list(range(1, 21)):
        fail("the logs do not hold steps 1..20: %r, %r" %
             ([s["step"] for s in a_steps], [s["step"] for s in b_steps]))
    worst = 0.0
    for x, y in zip(a_steps, b_steps):
        if x["lr"] != y["lr"]:
            fail("step %d: lr %r uninterrupted, %r resumed" % (x["step"], x["lr"], y["lr"]))
        rel = abs(x["loss"] - y["loss"]) / abs(x["loss"])
        worst = max(worst, rel)
        if rel > 1e-5:
            fail("step %d: loss %r uninterrupted, %r resumed (%.2e relative)" %
                 (x["step"], x["loss"], y["loss"], rel))
    print("20 steps: resumed equals uninterrupted, worst relative loss difference %.2e" % worst)


def read_checkpoint(folder):
    """Every tensor of a checkpoint, whole: {name: [float, ...]} in row-major order."""
    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest.get("byte_order") not in (None, "little"):
        fail("%s: byte order %r" % (folder, manifest.get("byte_order")))
    formats = {"float": "f", "double": "d"}
    out = {}
    for t in manifest["tensors"]:
        if t["dtype"] not in formats:
            continue
        extents = t["extents"]
        total = 1
        for e in extents:
            total *= e
        values = [None] * total
        for b in t["blocks"]:
            with open(os.path.join(folder, b["file"]), "rb") as f:
                f.seek(b["offset"])
                raw = f.read(b["bytes"])
            box = struct.unpack("<%d%s" % (len(raw) // t["element_bytes"], formats[t["dtype"]]),
                                raw)
            lo, ext = b["box_offsets"], b["box_extents"]
            # Walk the box in row-major order, placing each element at its global index.
            index = [0] * len(ext)
            for v in box:
                flat = 0
                for d, e in enumerate(extents):
                    flat = flat * e + lo[d] + index[d]
                values[flat] = v
                for d in reversed(range(len(ext))):
                    index[d] += 1
                    if index[d] < ext[d]:
                        break
                    index[d] = 0
        if any(v is None for v in values):
            fail("%s: tensor %s is not covered by its blocks" % (folder, t["name"]))
        out[t["name"]] = values
    return out


def compare_runs(what, ref_log, ref_ckpt, log, ckpt):
    ref_steps, steps = read_log(ref_log)["steps"], read_log(log)["steps"]
    if [s["step"] for s in steps] != [s["step"] for s in ref_steps] or not steps:
        fail("%s: the logs hold other steps" % what)
    worst_loss = 0.0
    for x, y in zip(ref_steps, steps):
        rel = abs(x["loss"] - y["loss"]) / abs(x["loss"])
        worst_loss = max(worst_loss, rel)
        if rel > 1e-5:
            fail("%s: step %d: loss %r on 1 rank, %r here (%.2e relative)" %
                 (what, x["step"], x["loss"], y["loss"], rel))
        # The experts' figures, summed over the ranks that hold distinct tokens.
        for key in ("nll", "aux_loss"):
            if key in x and abs(x[key] - y.get(key, float("nan"))) > 1e-5 * max(1.0, abs(x[key])):
                fail("%s: step %d: %s %r on 1 rank, %r here" % (what, x["step"], key, x[key],
                                                                y.get(key)))
        for key in ("tokens_per_expert", "load_per_expert", "dropped_per_expert"):
            if key in x and x[key] != y.get(key):
                fail("%s: step %d: %s %r on 1 rank, %r here" % (what, x["step"], key, x[key],
                                                                y.get(key)))
    ref, got = read_checkpoint(ref_ckpt), read_checkpoint(ckpt)
    if sorted(ref) != sorted(got):
        fail("%s: the checkpoints hold other tensors: %r vs %r" % (what, sorted(ref), sorted(got)))
    worst_value = 0.0
    for name, values in ref.items():
        if len(values) != len(got[name]):
            fail("%s: tensor %s has %d elements here, %d on 1 rank" %
                 (what, name, len(got[name]), len(values)))
        for i, (a, b) in enumerate(zip(values, got[name])):
            diff = abs(a - b) / max(1.0, abs(a))
            worst_value = max(worst_value, diff)
            if not diff <= 1e-5:
                fail("%s: tensor %s element %d: %r on 1 rank, %r here" % (what, name, i, a, b))
    return worst_loss, worst_value, len(ref)


def estimate_holds(what, j):
    """The memory estimated before the run bounds the model states and the peak of every
    step; the estimate."""
    need = j["run"].get("memory_estimate_per_rank")
    if not isinstance(need, dict) or not all(
            isinstance(need.get(k), (int, float)) and need[k] > 0
            for k in ("model_states", "activations", "bookkeeping", "total")):
        fail("%s: the log has no memory estimate: %r" % (what, need))
    states = j["run"]["model_state_bytes_per_rank"]
    if not states <= need["model_states"]:
        fail("%s: the model states take %d bytes, more than the %d estimated before the run"
             % (what, states, need["model_states"]))
    peak = max(s["peak_bytes"] for s in j["steps"])
    if not peak <= need["total"]:
        fail("%s: a step's peak of %d bytes exceeds the %d bytes estimated before the run (%r)"
             % (what, peak, need["total"], need))
    return need


# The mesh axis of each --ranks option: --tp, --sp, --hsdp (the replica groups, "dp_rep").
MESH_AXIS = {"tp": "tp", "sp": "sp", "hsdp": "node"}


def cmd_ranks(a):
    fresh(a.dir)
    ranks = []
    for r in a.ranks.split(","):
        n, *axes = r.split("/")
        sizes = {a.rstrip("0123456789"): int(a[len(a.rstrip("0123456789")):] or 0)
                 for a in axes}  # tpK, spK, hsdpK
        if set(sizes) - set(MESH_AXIS) or 0 in sizes.values():
            fail("--ranks entry %r: expected N[/tpK][/spK][/hsdpK]" % r)
        ranks.append((int(n), sizes))
    stages = [int(s) for s in a.stages.split(",")]
    mpi = lambda n: [a.mpiexec, a.np_flag, str(n), a.train_gpt] + a.args
    for stage in stages:
        base = ["--zero", str(stage), "--steps", "20"]
        ref_log = os.path.join(a.dir, "zero%d_np1.json" % stage)
        ref_ckpt = os.path.join(a.dir, "zero%d_np1" % stage)
        run(mpi(1) + base + ["--log", ref_log, "--save", ref_ckpt])
        j = read_log(ref_log)
        ref_need = estimate_holds("ZeRO-%d on 1 rank" % stage, j)
        losses = [s["loss"] for s in j["steps"]]
        if not losses[-1] < losses[0] - 0.3:
            fail("ZeRO-%d: the loss does not decrease: %r" % (stage, losses))
        arch, config = j["run"].get("arch"), j["run"]["config"]
        if arch != (a.args[a.args.index("--arch") + 1] if "--arch" in a.args else "gpt"):
            fail("the log's arch is %r" % arch)
        if arch == "llama" and (config.get("arch") != arch or
                                config.get("tied_head") != ("--tie-head" in a.args)):
            fail("the log's config does not name the model: %r" % config)
        for n, sizes in ranks:
            name = "zero%d_np%d" % (stage, n) + "".join("_%s%d" % kv for kv in sizes.items())
            log = os.path.join(a.dir, name + ".json")
            ckpt = os.path.join(a.dir, name)
            extra = [w for axis, k in sizes.items() for w in ("--" + axis, str(k))]
            run(mpi(n) + base + extra + ["--log", log, "--save", ckpt])
            j = read_log(log)
            mesh = j["run"].get("mesh", "")
            for flag, k in sizes.items():
                axis = MESH_AXIS[flag]
                if ("%s=%d" % (axis, k)) not in mesh:
                    fail("%s: the log's mesh %r has no %s=%d" % (name, mesh, axis, k))
            what = "ZeRO-%d on %d ranks%s" % (
                stage, n, "".join(", %s %d" % kv for kv in sizes.items()))
            need = estimate_holds(what, j)
            if not ref_need["activations"] / n <= need["activations"] < ref_need["activations"]:
                fail("%s: %g activation bytes estimated per rank, against %g on 1 rank: not "
                     "between 1/%d of it and all of it" %
                     (what, need["activations"], ref_need["activations"], n))
            worst_loss, worst_value, count = compare_runs(what, ref_log, ref_ckpt, log, ckpt)
            print("%s: 20 losses within %.2e, %d tensors within %.2e of 1 rank"
                  % (what, worst_loss, count, worst_value), flush=True)


def cmd_recompute(a):
    fresh(a.dir)
    runs, needs = {}, {}
    for mode in ("none", "selective", "full"):
        log, ckpt = os.path.join(a.dir, mode + ".json"), os.path.join(a.dir, mode)
        run(a.run + ["--steps", "20", "--recompute", mode, "--log", log, "--save", ckpt])
        j = read_log(log)
        if j["run"].get("recompute") != mode:
            fail("the log of --recompute %s says %r" % (mode, j["run"].get("recompute")))
        runs[mode] = (j["steps"], read_checkpoint(ckpt))
        needs[mode] = estimate_holds("--recompute " + mode, j)
    ref_steps, ref_ckpt = runs["none"]
    for mode in ("selective", "full"):
        steps, ckpt = runs[mode]
        for x, y in zip(ref_steps, steps):
            if x["loss"] != y["loss"] or x["bytes_sent"] != y["bytes_sent"]:
                fail("--recompute %s, step %d: loss %r, bytes %r; without: %r, %r" %
                     (mode, y["step"], y["loss"], y["bytes_sent"], x["loss"], x["bytes_sent"]))
        if len(steps) != len(ref_steps) or ckpt != ref_ckpt:
            fail("--recompute %s: other steps or other checkpoint tensors than without" % mode)
    peaks = [max(s["peak_bytes"] for s in runs[m][0]) for m in ("none", "selective", "full")]
    if not peaks[0] > peaks[1] > peaks[2]:
        fail("peak bytes none, selective, full: %r (expected decreasing)" % peaks)
    estimated = [needs[m]["activations"] for m in ("none", "selective", "full")]
    if not estimated[0] > estimated[1] > estimated[2]:
        fail("estimated activation bytes none, selective, full: %r (expected decreasing)"
             % estimated)
    print("20 steps: selective and full equal none bit for bit (%d tensors); peak bytes %r"
          % (len(ref_ckpt), peaks))


def cmd_zeropp(a):
    fresh(a.dir)
    runs = {}
    for name, extra in (("zero3", ["--zero", "3"]),
                        ("zeropp", ["--zeropp", "hpz,qwz,qgz", "--nodes", "2"])):
        log = os.path.join(a.dir, name + ".json")
        run(a.run + ["--steps", "300", "--log", log] + extra)
        j = read_log(log)
        estimate_holds(name, j)
        runs[name] = j
    if runs["zeropp"]["run"].get("zeropp") != "hpz,qwz,qgz":
        fail("the log of --zeropp says %r" % runs["zeropp"]["run"].get("zeropp"))
    tail = {n: sum(s["loss"] for s in j["steps"][-10:]) / 10 for n, j in runs.items()}
    sent = {n: j["steps"][-1]["bytes_sent"] for n, j in runs.items()}
    if abs(tail["zeropp"] - tail["zero3"]) > 0.02 * tail["zero3"]:
        fail("final loss: ZeRO++ %.4f, ZeRO-3 %.4f (more than 2 %% apart)"
             % (tail["zeropp"], tail["zero3"]))
    if not sent["zeropp"] < sent["zero3"] / 3:
        fail("bytes sent per step: ZeRO++ %r, ZeRO-3 %r (expected under a third)"
             % (sent["zeropp"], sent["zero3"]))
    print("300 steps: final loss ZeRO++ %.4f, ZeRO-3 %.4f; bytes per step %d, %d (%.3f)"
          % (tail["zeropp"], tail["zero3"], sent["zeropp"], sent["zero3"],
             sent["zeropp"] / sent["zero3"]))


# The shapes of the inventory check per number of ranks: train_gpt's flags.
INVENTORY_SHAPES = {
    1: [[], ["--moe"]],
    2: [["--zero", "0"], ["--zero", "1"], ["--zero", "2"], ["--zero", "3"], ["--tp", "2"],
        ["--sp", "2"], ["--hsdp", "2"], ["--moe", "--ep", "2"], ["--moe", "--tp", "2"],
        ["--moe", "--sp", "2"],
        ["--moe", "--ep", "2", "--moe-dropless"], ["--tp", "2", "--recompute", "full"],
        ["--sp", "2", "--recompute", "selective"]],
    4: [["--zero", "0"], ["--zero", "3"], ["--zero", "1", "--hsdp", "2"],
        ["--zero", "2", "--tp", "2"], ["--zero", "3", "--tp", "4"], ["--zero", "3", "--sp", "4"],
        ["--zero", "3", "--sp", "2", "--tp", "2"], ["--zero", "1", "--sp", "2"],
        ["--moe", "--ep", "4"], ["--moe", "--ep", "2", "--zero", "2"], ["--moe", "--tp", "2"],
        ["--moe", "--ep", "4", "--moe-dropless"], ["--zeropp", "hpz,qwz,qgz", "--nodes", "2"],
        ["--moe", "--sp", "2"], ["--moe", "--sp", "2", "--moe-dropless"],
        ["--moe", "--tp", "2", "--sp", "2"], ["--zero", "3", "--tp", "2", "--recompute", "full"],
        ["--zero", "3", "--sp", "2", "--recompute", "full"]],
}


def inventory_differences(j):
    """Each step's recorded traffic against the log's inventory: a list of differences."""
    sizes = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", j["run"]["mesh"])}
    inv = {}
    for line in j["run"]["inventory"]["lines"]:
        t = inv.setdefault((line["axis"], line["kind"]), [0, 0, False])
        t[0] += line["calls"]
        t[1] += line["bytes"]
        t[2] = t[2] or line.get("data_dependent", False)
    bad = []
    for step in j["steps"]:
        recorded = {}
        for axis, kinds in step["traffic"].items():
            for kind, (calls, sent) in kinds.items():
                if sizes[axis] > 1:
                    recorded[(axis, kind)] = (calls, sent)
                elif sent != 0:
                    bad.append("step %d: %s %s sent %d bytes over one rank"
                               % (step["step"], axis, kind, sent))
        for key in sorted(set(recorded) | set(inv)):
            r = recorded.get(key, (0, 0))
            calls, most, varies = inv.get(key, [0, 0, False])
            if r[0] != calls or (r[1] > most if varies else r[1] != most):
                bad.append("step %d: %s %s recorded %d calls, %d bytes; inventory %d calls, "
                           "%s%d bytes" % (step["step"], key[0], key[1], r[0], r[1], calls,
                                           "at most " if varies else "", most))
    return bad


def cmd_inventory(a):
    fresh(a.dir)
    prefix = [a.mpiexec, a.np_flag, str(a.np), a.train_gpt] + a.args
    for k, shape in enumerate(INVENTORY_SHAPES[a.np]):
        log = os.path.join(a.dir, "run%d.json" % k)
        run(prefix + shape + ["--steps", "2", "--log", log, "--quiet"])
        j = read_log(log)
        if j["run"]["inventory"].get("not_exact"):
            fail("%s: the inventory is not exact: %s" % (shape, j["run"]["inventory"]["not_exact"]))
        bad = inventory_differences(j)
        if bad:
            fail("%s (%s): the recorded collectives differ from the inventory:\n  %s"
                 % (" ".join(shape), j["run"]["mesh"], "\n  ".join(bad[:12])))
        lines = len(j["run"]["inventory"]["lines"])
        print("%-40s %-36s %2d lines, recorded = inventory"
              % (" ".join(shape) or "(defaults)", j["run"]["mesh"], lines))
    # --explain: the same lines, printed without training.
    p, _ = run(prefix + INVENTORY_SHAPES[a.np][-1] + ["--explain"])
    if "collectives of one training step" not in p.stdout:
        fail("--explain printed no inventory:\n" + p.stdout)
    for line in j["run"]["inventory"]["lines"]:
        if line["what"] not in p.stdout:
            fail("--explain does not print the line %r:\n%s" % (line, p.stdout))
    print(p.stdout)


def cmd_trains(a):
    fresh(a.dir)
    log = os.path.join(a.dir, "run.json")
    p, _ = run(a.run + ["--log", log])
    print(p.stdout)
    check_strict_json(log)
    steps = read_log(log)["steps"]
    applied = [s["loss"] for s in steps if s["applied"]]
    if len(applied) < 8 or not all(math.isfinite(x) for x in applied):
        fail("too few applied steps, or a loss not finite: %r" % applied)
    first, last = sum(applied[:3]) / 3, sum(applied[-3:]) / 3
    if not last < first - 0.1:
        fail("the loss did not decrease: %r" % applied)
    print("%d steps applied, loss %.4f -> %.4f" % (len(applied), first, last))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("refuse")
    r.add_argument("--expect", required=True)
    r.add_argument("--max-seconds", type=float, default=10)
    r.add_argument("command", nargs=argparse.REMAINDER)
    for name in ("fp16-skip", "diverge", "steps0", "trains", "recompute", "zeropp"):
        s = sub.add_parser(name)
        s.add_argument("--dir", required=True)
        s.add_argument("run", nargs=argparse.REMAINDER)
    s = sub.add_parser("resume")
    for o in ("--mpiexec", "--np-flag", "--train-gpt", "--dir"):
        s.add_argument(o, required=True)
    s.add_argument("--save-args", default="")
    s.add_argument("args", nargs=argparse.REMAINDER)
    s = sub.add_parser("inventory")
    for o in ("--mpiexec", "--np-flag", "--train-gpt", "--dir"):
        s.add_argument(o, required=True)
    s.add_argument("--np", type=int, required=True, choices=sorted(INVENTORY_SHAPES))
    s.add_argument("args", nargs=argparse.REMAINDER)
    s = sub.add_parser("ranks")
    for o in ("--mpiexec", "--np-flag", "--train-gpt", "--dir"):
        s.add_argument(o, required=True)
    s.add_argument("--ranks", default="2,4")
    s.add_argument("--stages", default="0,1,2,3")
    s.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    for k in ("command", "run", "args"):
        if hasattr(a, k) and getattr(a, k)[:1] == ["--"]:
            setattr(a, k, getattr(a, k)[1:])
    {"refuse": cmd_refuse, "fp16-skip": cmd_fp16_skip, "diverge": cmd_diverge,
     "steps0": cmd_steps0, "resume": cmd_resume, "ranks": cmd_ranks,
     "trains": cmd_trains, "recompute": cmd_recompute, "zeropp": cmd_zeropp,
     "inventory": cmd_inventory}[a.mode](a)


if __name__ == "__main__":
    main()
