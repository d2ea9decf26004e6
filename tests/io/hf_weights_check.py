#!/usr/bin/env python3
"""zest's weights against PyTorch and Hugging Face transformers, both ways.

For a GPT (Hugging Face GPT-2's names), a Llama-style decoder with grouped-query attention
and an untied head, and one with a tied head:

1. zest trains a few steps on 2 ranks (ZeRO-3) and exports a folder (model.safetensors and
   config.json); transformers' AutoModelForCausalLM.from_pretrained reads it, and its logits
   of zest's batch equal zest's (fp32, relative difference <= 1e-5 of the largest logit).
2. transformers makes a model of the same config with random weights (every tensor
   perturbed, so that no norm is 1 and no bias 0) and saves it with save_pretrained; zest
   imports it on 4 ranks under ZeRO-3 x tp 2, and its logits of PyTorch's batch equal
   PyTorch's.

PyTorch, transformers and safetensors come from a venv this script makes the first time
(ZEST_TORCH_VENV, default <work>/../torch-venv; ZEST_TORCH_PIP_ARGS adds pip arguments, an
index of CPU-only wheels, say). Where they cannot be installed (no network), the test is
skipped with a message: exit status 77.
"""

import argparse
import os
import pathlib
import shutil
import subprocess
import sys

SKIP = 77
PACKAGES = ["torch", "transformers", "safetensors", "numpy"]


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mpiexec", required=True)
    p.add_argument("--np-flag", default="-n")
    p.add_argument("--program", required=True, help="tests/io/hf_weights_program")
    p.add_argument("--work", required=True, help="a folder for the files (emptied first)")
    p.add_argument("--in-venv", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def has_packages(python):
    code = "import torch, transformers, safetensors, numpy"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def venv_python(work):
    venv = pathlib.Path(os.environ.get("ZEST_TORCH_VENV", pathlib.Path(work).parent / "torch-venv"))
    python = venv / "bin" / "python"
    if python.exists() and has_packages(str(python)):
        return str(python)
    print(f"hf_weights_check: installing {' '.join(PACKAGES)} into {venv}", flush=True)
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)])
    if made.returncode != 0:
        print("SKIPPED: python3 has no working venv module (Debian: python3-venv)")
        sys.exit(SKIP)
    pip = [str(venv / "bin" / "pip"), "install", "-q"]
    pip += os.environ.get("ZEST_TORCH_PIP_ARGS", "").split() + PACKAGES
    if subprocess.run(pip).returncode != 0 or not has_packages(str(python)):
        print(f"SKIPPED: could not install {' '.join(PACKAGES)} (no package index reachable?)")
        sys.exit(SKIP)
    return str(python)


MODELS = {
    "gpt": ["--arch", "gpt", "--vocab", "96", "--context", "16", "--width", "32",
            "--layers", "2", "--heads", "4"],
    "llama": ["--arch", "llama", "--vocab", "96", "--context", "16", "--width", "32",
              "--layers", "2", "--heads", "4", "--kv-heads", "2"],
    "llama_tied": ["--arch", "llama", "--vocab", "96", "--context", "16", "--width", "32",
                   "--layers", "2", "--heads", "4", "--kv-heads", "2", "--tied"],
}


def zest(args, ranks, flags):
    cmd = [args.mpiexec, args.np_flag, str(ranks), args.program] + flags
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        print(run.stdout, run.stderr)
        raise SystemExit(f"FAILED: {' '.join(cmd)} exited with {run.returncode}")


def relative_difference(a, b):
    import torch
    return (a - b).abs().max().item() / b.abs().max().item()


def check(args):
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    work = pathlib.Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    failures = 0
    for name, flags in MODELS.items():
        # 1. zest -> transformers.
        exported = work / f"{name}_zest"
        zest_logits = work / f"{name}_zest_logits.safetensors"
        zest(args, 2, flags + ["--steps", "3", "--export", f"{exported}/",
                               "--logits", str(zest_logits)])
        model = transformers.AutoModelForCausalLM.from_pretrained(str(exported))
        model.eval()
        got = load_file(str(zest_logits))
        with torch.no_grad():
            theirs = model(got["ids"]).logits
        d = relative_difference(got["logits"], theirs)
        ok = d <= 1e-5
        failures += not ok
        print(f"{name}: zest (2 ranks, ZeRO-3) -> {type(model).__name__}: logits differ by "
              f"{d:.2e} of the largest  {'ok' if ok else 'FAILED'}")

        # 2. transformers -> zest.
        config = transformers.AutoConfig.from_pretrained(str(exported))
        made = transformers.AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for p in made.parameters():
                p.add_(0.05 * torch.randn_like(p))
        made.eval()
        saved = work / f"{name}_torch"
        made.save_pretrained(str(saved), safe_serialization=True)
        ids = torch.randint(0, config.vocab_size, (4, 16), dtype=torch.int64)
        save_file({"ids": ids}, str(work / f"{name}_ids.safetensors"))
        with torch.no_grad():
            want = made(ids).logits
        imported_logits = work / f"{name}_imported_logits.safetensors"
        zest(args, 4, flags + ["--tp", "2", "--import", f"{saved}/", "--ids",
                               str(work / f"{name}_ids.safetensors"), "--logits",
                               str(imported_logits)])
        got = load_file(str(imported_logits))
        same_ids = torch.equal(got["ids"], ids)
        d = relative_difference(got["logits"], want)
        ok = d <= 1e-5 and same_ids
        failures += not ok
        print(f"{name}: {type(made).__name__} -> zest (4 ranks, ZeRO-3 x tp 2): logits differ "
              f"by {d:.2e} of the largest{'' if same_ids else ', other ids'}  "
              f"{'ok' if ok else 'FAILED'}")
    return failures


def main():
    args = parse()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not args.in_venv:
        python = venv_python(args.work)
        os.execv(python, [python, os.path.abspath(__file__), "--in-venv"] + sys.argv[1:])
    failures = check(args)
    print("all checks passed" if failures == 0 else f"{failures} checks FAILED")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
