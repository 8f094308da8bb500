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


if __name__ == "__main__":
    main()
