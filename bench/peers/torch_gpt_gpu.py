"""torch_gpt_gpu.py - bench_gpu_train's run in PyTorch on one GPU, for tokens/s and MFU side by side.

    python3 bench/peers/torch_gpt_gpu.py [--layers 8] [--width 1024] [--heads 16] [--context 512]
        [--batch 32] [--vocab 256] [--steps 12] [--compile] [--peak-tflops 989] [--json FILE]

The model is torch_gpt.py's GPT (the same GPT-2 as zest::gpt: pre-LN, tanh GELU, learned
positions, biases, untied head), with bench/gpu_train.cu's defaults. Precision as zest's bf16
policy: bf16 matrix products and activations (torch.autocast), fp32 master weights and Adam
moments; AdamW fused (betas 0.9, 0.95, weight decay 0.1 on the matrices), gradient-norm clipping
at 1.0. Tokens are drawn uniformly from the vocabulary, a new batch each step, made on the
device before the clock starts. A step runs from the forward to the optimizer's update, the
loss read back (which waits for the device), as bench_gpu_train times it; tokens/s is batch x
context over the median step after the first three. FLOPs per token and MFU are counted as
bench_gpu_train counts them: 6 N + 12 L d T over --peak-tflops. --compile wraps the model in
torch.compile (its compilation falls in the first steps, which the median leaves out).

Prints `METRIC torch_gpu_tokens_per_s <v>` and `METRIC torch_gpu_mfu <v>` (with a _compiled
suffix under --compile); --json writes {"metrics": {...}, "steps": [...]}.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import GPT  # noqa: E402  (the peer bench's model, one definition)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--json", default="")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("torch_gpt_gpu: no usable GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 77
    if a.steps < 4:
        sys.exit("torch_gpt_gpu: --steps must be at least 4 (the first three are not timed)")

    torch.manual_seed(1)
    device = torch.device("cuda")
    model = GPT(a.vocab, a.context, a.width, a.layers, a.heads).to(device)
    params = sum(q.numel() for q in model.parameters())
    tables = (a.vocab + a.context) * a.width
    flops_per_token = 6.0 * (params - tables) + 12.0 * a.layers * a.width * a.context
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    run = torch.compile(model) if a.compile else model

    steps = []
    for step in range(a.steps):
        ids = torch.randint(0, a.vocab, (a.batch, a.context + 1), device=device)
        x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # the model views them flat
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()
        seconds = time.perf_counter() - start
        steps.append({"step": step + 1, "loss": value, "seconds": seconds})
        print(f"step {step + 1}: loss {value:.4f}, {seconds:.3f} s, peak device memory "
              f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB", flush=True)

    median = statistics.median(s["seconds"] for s in steps[3:])
    rate = a.batch * a.context / median
    mfu = rate * flops_per_token / (a.peak_tflops * 1e12)
    suffix = "_compiled" if a.compile else ""
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: {params} parameters, "
          f"{a.layers} layers, width {a.width}, batch {a.batch} x {a.context}, bf16 autocast"
          f"{', torch.compile' if a.compile else ', eager'}: {rate:.0f} tokens/s (median step "
          f"{median:.4f} s), {rate * flops_per_token / 1e12:.1f} TFLOP/s, MFU {mfu:.4f}")
    print(f"METRIC torch_gpu_tokens_per_s{suffix} {rate:.1f}")
    print(f"METRIC torch_gpu_mfu{suffix} {mfu:.4f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"metrics": {f"torch_gpu_tokens_per_s{suffix}": rate,
                                   f"torch_gpu_mfu{suffix}": mfu,
                                   f"torch_gpu_median_step_s{suffix}": median},
                       "steps": steps}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
