"""torch_gpt.py - examples/train_gpt's GPT in PyTorch, for the peer bench (bench/run --peers).

    torchrun --nproc-per-node 2 bench/peers/torch_gpt.py --init DIR --wrap ddp --steps 35 \
        --json torch.json

The same run as `mpiexec -n 2 train_gpt --zero 0|3` with the same flags, step for step:

- weights: the parameters of zest's checkpoint DIR, written by `train_gpt --steps 0 --save DIR`
  with the same model flags (zest/io/checkpoint.hpp's folder: manifest.json lists each
  tensor's blocks in the shard files; read_zest_checkpoint assembles them). The model's sizes
  (padded vocabulary, context, width, layers, heads) are read from the tensors' extents;
- data: zest::text_dataset and zest::batch_sampler redone here (corpus_tokens, batch_rows):
  the corpus's files in name order, bytes numbered over the bytes that occur, the first 90 %
  for training; row r of step k starts at counter_hash(seed, k, r) mod (n - T). Rank i of W
  takes rows [i B / W, (i + 1) B / W) (zest's balanced blocks; B must be a multiple of W);
- model: GPT-2, pre-LN, LayerNorm eps 1e-5, tanh GELU, learned positions, biases, untied
  output head, dropout 0; the attention core is F.scaled_dot_product_attention (causal);
- loss: mean cross-entropy over the global batch (each rank's mean; DDP and FSDP2 average
  the gradients over the ranks);
- optimizer: AdamW (betas 0.9, 0.95, eps 1e-8, weight decay 0.1 on the matrices and
  embedding tables, none on biases and norms), learning rate warmup then cosine
  (zest/optim/schedule.hpp) set before each step, global gradient-norm clipping (1.0).

--wrap ddp: DistributedDataParallel; --wrap fsdp2: fully_shard on each block and then on the
whole model (ZeRO-3's placement: parameters sharded, gathered per block). gloo, one thread
per process. --json writes {"run": {...}, "steps": [{"step", "loss", "seconds", ...}, ...]}:
a step's time is rank 0's, from the forward to the optimizer's update and the loss's
all-reduce, as train_gpt's log (the batch is drawn before the clock starts, as there), and
its parts: forward_s, backward_s (with DDP's all-reduce or FSDP2's reduce-scatter) and
update_s (clipping, AdamW, the loss's all-reduce).
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def counter_hash(seed, step, row):
    return splitmix64(splitmix64(splitmix64(seed) ^ step) ^ row)


def corpus_tokens(path, validation_fraction=0.1):
    """The training token ids of zest::text_dataset::from_path(path)."""
    if os.path.isdir(path):
        names = sorted(
            n for n in os.listdir(path)
            if not os.path.islink(os.path.join(path, n)) and os.path.isfile(os.path.join(path, n)))
        files = [os.path.join(path, n) for n in names]
    else:
        files = [path]
    text = b"".join(open(f, "rb").read() for f in files)
    vocabulary = sorted(set(text))
    id_of = {b: i for i, b in enumerate(vocabulary)}
    tokens = [id_of[b] for b in text]
    validation = math.floor(len(tokens) * validation_fraction + 0.5)  # llround, positive
    return tokens[:len(tokens) - min(validation, len(tokens))], len(vocabulary)


def batch_rows(tokens, seed, step, rows, length):
    """Inputs and targets of rows `rows` of step `step`'s global batch (zest::batch_sampler)."""
    windows = len(tokens) - length
    inputs, targets = [], []
    for r in rows:
        s = counter_hash(seed, step, r) % windows
        inputs.append(tokens[s:s + length])
        targets.append(tokens[s + 1:s + 1 + length])
    return torch.tensor(inputs, dtype=torch.long), torch.tensor(targets, dtype=torch.long)


def read_zest_checkpoint(folder):
    """{name: float32 tensor} of every tensor in zest checkpoint `folder`, assembled from its
    blocks, and the manifest."""
    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest.get("format") != "zest checkpoint" or manifest.get("byte_order") != "little":
        raise ValueError(f"torch_gpt: {folder}: not a little-endian zest checkpoint")
    files = {}
    out = {}
    for t in manifest["tensors"]:
        if t["dtype"] != "float" or t["element_bytes"] != 4:
            raise ValueError(f"torch_gpt: {folder}: tensor {t['name']} is {t['dtype']}, not float")
        whole = torch.empty(t["extents"], dtype=torch.float32)
        for b in t["blocks"]:
            if b["file"] not in files:
                with open(os.path.join(folder, b["file"]), "rb") as f:
                    files[b["file"]] = bytearray(f.read())
            data = files[b["file"]][b["offset"]:b["offset"] + b["bytes"]]
            block = torch.frombuffer(data, dtype=torch.float32).view(b["box_extents"])
            box = tuple(slice(o, o + e) for o, e in zip(b["box_offsets"], b["box_extents"]))
            whole[box] = block
        out[t["name"]] = whole
    return out, manifest


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width, eps=1e-5)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width, eps=1e-5)
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, m = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(m, dim=2)
        q, k, v = (z.view(b, t, self.heads, m // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(a.transpose(1, 2).reshape(b, t, m))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, context, width, layers, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, eps=1e-5)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids, targets):
        t = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(t, device=ids.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def gpt_from_zest(w):
    """The GPT holding zest's parameters `w` (zest's names and dims: q, k, v "mnd", proj
    "ndm", fc "mh", lm_head "mv")."""
    vocab, width = w["wte"].shape
    context = w["wpe"].shape[0]
    layers = sum(1 for n in w if n.endswith(".attn.q.weight"))
    heads = w["h0.attn.q.weight"].shape[1]
    model = GPT(vocab, context, width, layers, heads)
    with torch.no_grad():
        model.wte.weight.copy_(w["wte"])
        model.wpe.weight.copy_(w["wpe"])
        for l, block in enumerate(model.h):
            z = lambda name: w[f"h{l}.{name}"]  # noqa: E731
            block.ln_1.weight.copy_(z("ln_1.weight"))
            block.ln_1.bias.copy_(z("ln_1.bias"))
            block.ln_2.weight.copy_(z("ln_2.weight"))
            block.ln_2.bias.copy_(z("ln_2.bias"))
            qkv = [z(f"attn.{p}.weight").reshape(width, width).t() for p in "qkv"]
            block.c_attn.weight.copy_(torch.cat(qkv, 0))
            block.c_attn.bias.copy_(torch.cat([z(f"attn.{p}.bias").reshape(width) for p in "qkv"]))
            block.c_proj.weight.copy_(z("attn.proj.weight").reshape(width, width).t())
            block.c_proj.bias.copy_(z("attn.proj.bias"))
            block.fc.weight.copy_(z("mlp.fc.weight").t())
            block.fc.bias.copy_(z("mlp.fc.bias"))
            block.proj.weight.copy_(z("mlp.proj.weight").t())
            block.proj.bias.copy_(z("mlp.proj.bias"))
        model.ln_f.weight.copy_(w["ln_f.weight"])
        model.ln_f.bias.copy_(w["ln_f.bias"])
        model.lm_head.weight.copy_(w["lm_head.weight"].t())
    return model, dict(vocab=vocab, context=context, width=width, layers=layers, heads=heads)


def warmup_cosine(step, peak, low, warmup, total):
    """zest::warmup_cosine for a 0-based step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if step >= total:
        return low
    progress = (step - warmup) / (total - warmup)
    return low + (peak - low) * 0.5 * (1.0 + math.cos(math.pi * progress))


def wrap(model, how, world):
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model)
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    for block in model.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--init", required=True, help="zest checkpoint of the initial weights")
    p.add_argument("--wrap", choices=["ddp", "fsdp2"], required=True)
    p.add_argument("--corpus", default="/usr/share/common-licenses")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--schedule-steps", type=int, default=0, help="default --steps")
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--json", default="", help="the run as JSON")
    p.add_argument("--adamw", choices=["default", "foreach", "fused"], default="default",
                   help="AdamW's implementation (default: torch's choice, a loop on the CPU)")
    a = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.batch % world != 0:
        sys.exit(f"torch_gpt: --batch {a.batch} is not a multiple of the {world} ranks")

    weights, _ = read_zest_checkpoint(a.init)
    model, shape = gpt_from_zest(weights)
    tokens, corpus_vocab = corpus_tokens(a.corpus)
    if (corpus_vocab + 31) // 32 * 32 != shape["vocab"]:
        sys.exit(f"torch_gpt: {a.init} has vocabulary {shape['vocab']}, the corpus {corpus_vocab}")
    model = wrap(model, a.wrap, world)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({} if a.adamw == "default" else {a.adamw: True}))
    total = a.schedule_steps or max(a.steps, 1)
    warmup = min(a.warmup, total)
    share = a.batch // world
    rows = range(rank * share, (rank + 1) * share)
    context = shape["context"]
    steps = []
    for step in range(a.steps):
        x, y = batch_rows(tokens, a.seed, step, rows, context)
        lr = warmup_cosine(step, a.lr, a.min_lr, warmup, total)
        for g in opt.param_groups:
            g["lr"] = lr
        start = time.perf_counter()
        loss = model(x, y)
        forward = time.perf_counter()
        loss.backward()
        backward = time.perf_counter()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        summed = loss.detach().clone()
        dist.all_reduce(summed)
        value = summed.item() / world
        end = time.perf_counter()
        steps.append({"step": step + 1, "loss": value, "lr": lr, "seconds": end - start,
                      "forward_s": forward - start, "backward_s": backward - forward,
                      "update_s": end - backward})
    if rank == 0 and a.json:
        run = dict(shape, batch=a.batch, wrap=a.wrap, world=world, torch=torch.__version__,
                   threads=torch.get_num_threads(), schedule_steps=total, warmup=warmup)
        with open(a.json, "w") as f:
            json.dump({"run": run, "steps": steps}, f, indent=1)
    # Every rank done before the group goes: torch 2.15's gloo backend aborted one rank at
    # exit now and then ("terminate called without an active exception", 1 run in 6 with
    # FSDP2) when the other tore the group down first.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
