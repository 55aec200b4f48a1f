#!/usr/bin/env python3
"""bench_torch.py - the same GPT in a straightforward PyTorch implementation,
to compare training throughput with gpt.h on the CPU (MEASUREMENTS.md, "Speed on the CPU") and
with gpt_cuda.cu on a GPU (bench/gpt_gpu.sh, README.gpu.md).

Not part of the course's tools: it needs python3 and torch (Debian: python3-torch).
    python3 bench/bench_torch.py [--batch_size 8] [--steps 10] [--threads 2]
    python3 bench/bench_torch.py --ddp 2 [--threads 1]     (DistributedDataParallel, gloo)
    python3 bench/bench_torch.py --device cuda --precision bf16 [--compile] [--config large]
Same model as the C code: pre-LayerNorm blocks, causal attention, 4x GELU(tanh)
MLP, tied LM head; default config vocab 5000, block 128, 4 layers, 4 heads,
256 channels; large: GPT-2 small's shape (50257, 1024, 12, 12, 768). AdamW
(weight decay on matrices), gradient clipping at 1.0. On a GPU, bf16 is
autocast (fp32 master weights and AdamW, as gpt_cuda.cu's bf16 mode); the
attention is written out as the C code's reference path is (no fused
scaled_dot_product_attention), eager or torch.compile'd.
Timing: `--warmup` steps, then the median of `--steps` timed steps; on a GPU
each step ends with torch.cuda.synchronize().
`--ddp N` trains data parallel on the CPU as bench_gpt's ranks do: N
processes (torch.multiprocessing), process group gloo, the model wrapped in
DistributedDataParallel, --threads torch threads each, --batch_size
sequences per rank, each rank its own random tokens; the median step is the
slowest rank's, and tokens/s counts all ranks. OpenBLAS's threads follow
OPENBLAS_NUM_THREADS (set it to 1 for 1 thread per rank).
"""
import argparse
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.gelu = nn.GELU(approximate="tanh")

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, V, T, L, NH, C):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():  # GPT-2 initialisation, as gpt.h
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") or "mlp_proj" in name else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


CONFIGS = {"default": (5000, 128, 4, 4, 256), "large": (50257, 1024, 12, 12, 768)}


def train(a, rank=0, world=1):
    """Builds the model, trains --warmup + --steps steps, returns (median step, loss, params)."""
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)  # the same initial weights on every rank
    dev = torch.device(a.device)
    V, T, L, NH, C = CONFIGS[a.config]
    model = GPT(V, T, L, NH, C).to(dev)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95))
    step_fn = torch.compile(model) if a.compile else model
    if world > 1:
        step_fn = torch.nn.parallel.DistributedDataParallel(step_fn)
    if world > 1:
        torch.manual_seed(1 + rank)  # each rank its own tokens
    data = torch.randint(0, V, (a.batch_size * T + 1,), device=dev)
    x, y = data[:-1].view(a.batch_size, T), data[1:].view(a.batch_size, T)
    bf16 = a.precision == "bf16"
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    times = []
    for step in range(a.steps + a.warmup):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=bf16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), loss.item(), sum(p.numel() for p in model.parameters())


def report(a, med, loss, n, where):
    T = CONFIGS[a.config][1]
    mode = ("compiled" if a.compile else "eager") + (" bf16 autocast" if a.precision == "bf16" else " fp32")
    print(f"torch {torch.__version__}: {n} params, {a.config} B={a.batch_size} T={T}, {where}, {mode}")
    tokens = a.batch_size * T * max(a.ddp, 1)
    print(f"median step {med * 1e3:.1f} ms -> {tokens / med:.0f} tokens/s (last loss {loss:.4f})")


def ddp_rank(rank, a, port):
    import torch.distributed as dist
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=a.ddp)
    med, loss, n = train(a, rank, a.ddp)
    slowest = torch.tensor([med], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        threads = torch.get_num_threads()
        report(a, slowest.item(), loss, n, f"DDP gloo {a.ddp} ranks x {threads} thread{'s' if threads > 1 else ''}")
    dist.destroy_process_group()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ddp", type=int, default=0, help="ranks of DistributedDataParallel (gloo) on the CPU")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--config", choices=sorted(CONFIGS), default="default")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    a = p.parse_args()
    if a.compile and not hasattr(torch, "compile"):
        p.error(f"--compile needs torch.compile (PyTorch 2.0 or newer); this is torch {torch.__version__}")
    if a.precision == "bf16" and a.device == "cpu":
        p.error("--precision bf16 is for --device cuda (autocast on the GPU)")
    if a.ddp < 0 or (a.ddp > 0 and a.device != "cpu"):
        p.error("--ddp N needs N >= 1 and --device cpu")
    if min(a.batch_size, a.steps, a.threads) < 1 or a.warmup < 0:
        p.error("--batch_size, --steps and --threads must be at least 1, --warmup at least 0")
    if a.ddp > 0:
        torch.multiprocessing.spawn(ddp_rank, args=(a, free_port()), nprocs=a.ddp)
        return
    med, loss, n = train(a)
    where = torch.cuda.get_device_name() if a.device == "cuda" else f"{torch.get_num_threads()} threads"
    report(a, med, loss, n, where)
    if a.device == "cuda":
        print(f"peak memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
