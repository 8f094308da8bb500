#!/usr/bin/env python3
"""PyTorch's layout conversions in a channels-last ResNet-50 training step: every copy at PyTorch's
dispatcher (copy_, clone, _to_copy, contiguous) whose source and result are 4-D and dense in different
memory formats, counted as chorus's kernels/layout_conversions.h counts its own. The oracle of
tests/nn/layout_conversions_test.cpp. Conversions a kernel makes below the dispatcher (oneDNN's own
reorders on the CPU) are not seen, as chorus's kernels' internal copies are not counted either.

  /usr/bin/python3 tools/torch_layout_conversions.py [--batch N] [--bf16] [--control] [--count-only]

--bf16: the forward under CPU bfloat16 autocast; --control: the channels-last batch made NCHW inside
the step (counts that one conversion). Prints each step's conversions; --count-only prints the
second step's count alone. Needs python3-torch and python3-torchvision (Debian's 1.13 here)."""
import argparse
import collections
import sys

try:
    import torch
    import torchvision
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
except ImportError as e:  # exit 3: the oracle is not installed (any other failure is an error)
    print(f"torch_layout_conversions.py: {e}", file=sys.stderr)
    sys.exit(3)

# contiguous() decomposes into clone() above the dispatcher, so clone covers it.
COPIES = ("aten.copy_", "aten.clone", "aten._to_copy")


def only_layout(t):
    """The one layout t is dense in, None when it is dense in both or neither."""
    if not isinstance(t, torch.Tensor) or t.dim() != 4:
        return None
    nchw, nhwc = t.is_contiguous(), t.is_contiguous(memory_format=torch.channels_last)
    if nchw == nhwc:
        return None
    return "contiguous" if nchw else "channels_last"


class CountConversions(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.kinds = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func.overloadpacket)
        if name in COPIES:
            ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            src, dst = (ins[1] if name == "aten.copy_" else ins[0]), outs[0]
            a, b = only_layout(src), only_layout(dst)
            if a and b and a != b and src.shape == dst.shape:
                self.kinds[(name, a, b, tuple(dst.shape), str(dst.dtype))] += 1
        return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--control", action="store_true")
    p.add_argument("--count-only", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = torchvision.models.resnet50(num_classes=1000).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(a.batch, 3, 224, 224).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch,))
    counts = []
    for step in range(2):  # the first step makes the momentum buffers; the second is the steady one
        mode = CountConversions()
        with mode:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                loss = torch.nn.functional.cross_entropy(net(x.contiguous() if a.control else x), y)
            loss.backward()
            opt.step()
        counts.append(sum(mode.kinds.values()))
        if not a.count_only:
            print(f"step {step}: {counts[-1]} layout conversions")
            for kind, n in mode.kinds.items():
                print(f"  {n} x {kind}")
    if a.count_only:
        print(counts[-1])


if __name__ == "__main__":
    main()
