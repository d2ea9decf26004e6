"""compare.py - zest's train_gpt against PyTorch's DDP and FSDP2 on the same GPT (bench/run --peers).

    python3 bench/peers/compare.py --train-gpt build/bench/examples/train_gpt \
        --python build/peers-venv/bin/python --work build/bench/peers

For each size (small: train_gpt's defaults; large: --width 256 --context 128):
1. `train_gpt --steps 0 --save DIR` writes zest's initial weights, which torch_gpt.py loads;
2. rounds of four runs of --steps steps on 2 processes x 1 thread, the order turned each
   round so that the machine's load falls on every side alike: zest ZeRO-0 and ZeRO-3
   (mpiexec -n 2 train_gpt --zero 0|3) and torch_gpt.py under DDP and FSDP2 (torchrun, gloo);
3. a run's step time: the median of its steps after the first --skip (a step's time is
   rank 0's, forward to update, in both programs' logs); a round's ratio: the torch run's
   step time ÷ the zest run's, both of that round (minutes apart at most, so under about
   the same load).
Prints `METRIC tokens_per_s_ratio_vs_torch_{ddp,fsdp2}_{small,large}`: the median over the
rounds of the round's ratio (zest ZeRO-0 against DDP, ZeRO-3 against FSDP2; tokens/s are
tokens per step ÷ step time, so that is zest's tokens/s ÷ torch's), each side's tokens/s
over all its rounds' timed steps (`peers_tokens_per_s_<side>_<size>`, global tokens ÷ the
median step: for the record, the load varies between rounds), and
`torch_loss_match_rel`: the largest |torch - zest| / |zest| over the first --match-steps
losses of every torch run against the zest ZeRO-0 run of its round. Exits 1 when that is
above 1e-5 (the runs would not be the same computation).
This program needs no torch itself: only --python does.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [("small", []), ("large", ["--width", "256", "--context", "128"])]
SIDES = ["zest0", "ddp", "zest3", "fsdp2"]
MATCH_LIMIT = 1e-5


def run(command, env=None, tries=1):
    """Runs command; a failure is retried up to tries - 1 times (torch's runs: gloo's
    processes have died at exit now and then, "terminate called without an active
    exception", after a run whose steps were complete), then ends the comparison."""
    for attempt in range(1, tries + 1):
        result = subprocess.run(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        if result.returncode == 0:
            return
        if attempt < tries:
            print(f"compare.py: {' '.join(command)} exited with status {result.returncode}; "
                  f"running it again (try {attempt + 1} of {tries})", flush=True)
    sys.stdout.write(result.stdout)
    raise SystemExit(f"compare.py: {' '.join(command)} exited with status {result.returncode}")


def steps_of(log):
    with open(log) as f:
        return json.load(f)["steps"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train-gpt", required=True)
    p.add_argument("--python", required=True, help="a Python with torch")
    p.add_argument("--mpiexec", default="mpiexec.mpich")
    p.add_argument("--work", required=True, help="a folder for checkpoints and logs")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--skip", type=int, default=5, help="warmup steps left out of the timing")
    p.add_argument("--match-steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--sizes", default="small,large", help="which of small, large")
    a = p.parse_args()
    if a.steps <= a.skip or a.steps < a.match_steps:
        raise SystemExit("compare.py: --steps must exceed --skip and reach --match-steps")

    os.makedirs(a.work, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    common = ["--steps", str(a.steps), "--batch", str(a.batch)]
    worst = 0.0
    metrics = []
    print("load average %.2f %.2f %.2f at the start" % os.getloadavg(), flush=True)
    for size, flags in SIZES:
        if size not in a.sizes.split(","):
            continue
        init = os.path.join(a.work, f"init-{size}")
        run([a.train_gpt, "--steps", "0", "--save", init, "--sample", "0", "--quiet",
             "--batch", str(a.batch)] + flags, env)
        times = {side: [] for side in SIDES}
        ratios = {"ddp": [], "fsdp2": []}
        phases = {side: {"forward_s": [], "backward_s": [], "update_s": []} for side in SIDES}
        for r in range(a.rounds):
            order = SIDES if r % 2 == 0 else SIDES[1::-1] + SIDES[3:1:-1]
            logs = {}
            for side in order:
                log = os.path.join(a.work, f"{size}-{side}-{r}.json")
                if side.startswith("zest"):
                    command = [a.mpiexec, "-n", str(a.nprocs), a.train_gpt, "--zero", side[-1],
                               "--sample", "0", "--quiet", "--log", log] + common + flags
                else:
                    command = [a.python, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={a.nprocs}",
                               os.path.join(HERE, "torch_gpt.py"), "--init", init, "--wrap", side,
                               "--json", log] + common
                run(command, env, tries=1 if side.startswith("zest") else 2)
                logs[side] = steps_of(log)
                times[side] += [s["seconds"] for s in logs[side][a.skip:]]
                for phase, values in phases.get(side, {}).items():
                    values += [s[phase] for s in logs[side][a.skip:]]
            reference = [s["loss"] for s in logs["zest0"][:a.match_steps]]
            line = []
            for side in ("ddp", "fsdp2"):
                losses = [s["loss"] for s in logs[side][:a.match_steps]]
                rel = max(abs(t - z) / abs(z) for t, z in zip(losses, reference))
                worst = max(worst, rel)
                line.append(f"{side} loss vs zest {rel:.2e}")
            medians = {side: statistics.median(s["seconds"] for s in logs[side][a.skip:])
                       for side in SIDES}
            ratios["ddp"].append(medians["ddp"] / medians["zest0"])
            ratios["fsdp2"].append(medians["fsdp2"] / medians["zest3"])
            print(f"{size} round {r + 1}: median step " +
                  ", ".join(f"{side} {medians[side] * 1e3:.1f} ms" for side in SIDES) +
                  f"; ZeRO-0/DDP {medians['ddp'] / medians['zest0']:.3f}, "
                  f"ZeRO-3/FSDP2 {medians['fsdp2'] / medians['zest3']:.3f}; " + ", ".join(line),
                  flush=True)
        for side, parts in phases.items():
            print(f"{size} {side}: median " + ", ".join(
                f"{phase[:-2]} {statistics.median(v) * 1e3:.1f} ms" for phase, v in parts.items()))
        print(f"{size}: load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()),
              flush=True)
        with open(init + "/manifest.json") as f:
            context = json.load(f)["metadata"]["config"]["context"]
        tokens = a.batch * context
        rate = {side: tokens / statistics.median(times[side]) for side in SIDES}
        for side in SIDES:
            metrics.append((f"peers_tokens_per_s_{side}_{size}", rate[side]))
        for side in ("ddp", "fsdp2"):
            metrics.append((f"tokens_per_s_ratio_vs_torch_{side}_{size}",
                            statistics.median(ratios[side])))
    metrics.append(("torch_loss_match_rel", worst))
    for name, value in metrics:
        print(f"METRIC {name} {value:.4g}")
    if worst > MATCH_LIMIT:
        print(f"compare.py: torch's losses differ from zest's by {worst:.2e} (relative), more "
              f"than {MATCH_LIMIT:g}: the two runs are not the same computation", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
