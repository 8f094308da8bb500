# PyTorch's figures for the work chorus's GPU benchmarks time, run in the same call on the same GPU
# (tools/gpu/run.sh): CUDA-event medians after warm-up, on random inputs.
import statistics

import torch


def time_ms(fn, warmup=10, iters=50):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    dev = torch.device("cuda:0")
    print(f"peer: PyTorch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print(f"{'work':40s} {'median ms':>10s}")
    n = 1 << 26
    a, b = torch.randn(n, device=dev), torch.randn(n, device=dev)
    ms = time_ms(lambda: a + b)
    print(f"{'add 2^26 float32':40s} {ms:10.4f}  ({3 * 4 * n / ms / 1e6:.0f} GB/s)")
    x = torch.randn(4096, 4096, device=dev)
    for name, tf32 in (("float32", False), ("tf32", True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        ms = time_ms(lambda: x @ x)
        print(f"{'matmul 4096^3 ' + name:40s} {ms:10.4f}  ({2 * 4096**3 / ms / 1e9:.1f} TFLOP/s)")
    xb = x.to(torch.bfloat16)
    ms = time_ms(lambda: xb @ xb)
    print(f"{'matmul 4096^3 bfloat16':40s} {ms:10.4f}  ({2 * 4096**3 / ms / 1e9:.1f} TFLOP/s)")
    s = torch.randn(8192, 4096, device=dev)
    ms = time_ms(lambda: torch.softmax(s, dim=-1))
    print(f"{'softmax 8192x4096 float32':40s} {ms:10.4f}")
    ms = time_ms(lambda: s.sum(dim=0))
    print(f"{'sum over dim 0 of 8192x4096':40s} {ms:10.4f}")


def ddp_overhead():
    """PyTorch's DDP overhead at world size 1 over NCCL, as tests/bench:ddp_gpu_bench measures chorus's:
    the same models, losses and training step with and without DDP, medians of 20 interleaved steps
    after 5 warm-up. At world size 1 NCCL's allreduce moves no data: the figure is the cost of DDP's
    hooks, buckets and stream ordering, not of communication."""
    import os
    import sys
    import tempfile
    import time

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = torch.device("cuda:0")
    store = tempfile.mktemp()
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)

    # The same models and losses as tests/bench:ddp_gpu_bench gives chorus: tools/torch_peer.py's
    # twins of chorus's ResNet-50, BERT-base (vocabulary logits at every position plus next-sentence)
    # and GPT-2 124M (beside this file in the bundle; tools/ in the repository).
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.dirname(here)]
    import torch_peer

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    images, labels = torch.randn(32, 3, 224, 224, device=dev), torch.randint(0, 1000, (32,), device=dev)
    ids, nxt = torch.randint(1000, 30000, (16, 128), device=dev), torch.randint(0, 2, (16,), device=dev)
    gpt_ids = torch.randint(0, 50257, (8, 1024), device=dev)

    def bert_loss(m):
        logits, seq = m(ids)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 30522), ids.reshape(-1)) + \
            torch.nn.functional.cross_entropy(seq, nxt)

    class Forward(torch.nn.Module):
        """A model whose forward() is one of its methods, so DDP wraps the call the loss makes."""

        def __init__(self, model, method):
            super().__init__()
            self.model, self.method = model, method

        def forward(self, *args):
            return getattr(self.model, self.method)(*args)

    cases = [
        ("ResNet-50, batch 32 x 3x224x224", torch_peer.ResNet50,
         lambda m: torch.nn.functional.cross_entropy(m(images), labels)),
        ("BERT-base pretraining, batch 16 x 128",
         lambda: Forward(torch_peer.BertForPreTraining("base"), "pretraining_logits"), bert_loss),
        ("GPT-2 124M, batch 8 x 1024", lambda: Forward(torch_peer.GPT2LMHeadModel("gpt2"), "loss"),
         lambda m: m(gpt_ids[:, :-1], gpt_ids[:, 1:])),
    ]
    print("\npeer: DDP overhead at world size 1 (NCCL)\n| model | without DDP ms | with DDP ms | overhead |")
    print("|---|---|---|---|")
    for name, make, loss in cases:
        torch.manual_seed(7)
        plain = make().to(dev)
        torch.manual_seed(7)
        wrapped = DDP(make().to(dev), device_ids=[0])
        opts = [torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9) for m in (plain, wrapped)]

        def step(m, opt):
            torch.cuda.synchronize()
            t = time.perf_counter()
            opt.zero_grad()
            loss(m).backward()
            opt.step()
            torch.cuda.synchronize()
            return (time.perf_counter() - t) * 1e3

        a, b = [], []
        for i in range(25):
            x, y = step(plain, opts[0]), step(wrapped, opts[1])
            if i >= 5:
                a.append(x)
                b.append(y)
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"| {name} | {ma:.2f} | {mb:.2f} | {100 * (mb - ma) / ma:+.1f}% |")
    dist.destroy_process_group()
    os.remove(store) if os.path.exists(store) else None


if __name__ == "__main__":
    main()
    ddp_overhead()
