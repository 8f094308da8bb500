"""PyTorch's side of tests/bench:gpu_bench: the same sections, models, shapes and case names, timed the
same way (median of CUDA-event-timed runs after warm-up, peak memory from torch.cuda's caching
allocator statistics reset before each case), printed as a Markdown table per section and one JSON
line per row in gpu_bench's format, for tools/gpu/compare_bench.py.

    python3 tools/torch_peer.py [--only resnet50,bert,gpt2,gemm,memory,conv,layers,blocks] [--json FILE]
    python3 tools/torch_peer.py --device cpu --tiny      # checks the script's logic without a GPU

Settings (the same as gpu_bench gives chorus, which always searches cuDNN's algorithms):
torch.backends.cudnn.benchmark = True; TF32 allowed for matmul and cuDNN in resnet50, bert and conv;
in gemm per case (fp32: matmul TF32 off, tf32: on, bf16: bfloat16 tensors). ResNet-50 runs
channels-last (the "torch" rows, PyTorch's fastest layout) and NCHW ("torch_nchw", chorus's layout).
The models are written here (no torchvision or transformers needed) with chorus's architectures:
torchvision's ResNet-50 v1.5, BERT post-norm with explicit attention (as chorus's
examples/models/bert), the masked-LM head on the labelled positions only, and GPT-2 (as chorus's
examples/models/gpt: pre-LayerNorm, causal F.scaled_dot_product_attention (explicit attention where
this torch has none), tanh GELU, LM head tied to the token embedding).
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SECTIONS = ("resnet50", "bert", "gpt2", "gemm", "memory", "conv", "layers", "blocks")
MIB = 1024.0 * 1024.0


# ---- models ------------------------------------------------------------------------------------

class Bottleneck(nn.Module):
    def __init__(self, inplanes, planes, stride, downsample):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.downsample = downsample

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet50(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, inplanes = [], 64
        for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            down = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False), nn.BatchNorm2d(planes * 4))
            stage = [Bottleneck(inplanes, planes, stride, down)]
            inplanes = planes * 4
            stage += [Bottleneck(inplanes, planes, 1, None) for _ in range(blocks - 1)]
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(2048, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm run in float32, as CUDA autocast runs it (the explicit cast is the one autocast
    would make); torch 1.13's CPU autocast leaves bfloat16 input with float32 weights, an error."""

    def forward(self, x):
        return F.layer_norm(x.float(), self.normalized_shape, self.weight, self.bias, self.eps)


BERT_CONFIGS = {"tiny": (2, 128), "mini": (4, 256), "small": (4, 512), "base": (12, 768)}  # layers, hidden


class BertLayer(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attn_dense = nn.Linear(hidden, hidden)
        self.attn_norm = LayerNorm(hidden, eps=1e-12)
        self.inter = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)
        self.out_norm = LayerNorm(hidden, eps=1e-12)

    def forward(self, x, additive_mask):
        b, t, h = x.shape
        d = h // self.heads

        def split(y):
            return y.reshape(b, t, self.heads, d).permute(0, 2, 1, 3)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d)) + additive_mask
        probs = F.dropout(torch.softmax(scores, -1), 0.1, self.training)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, t, h)
        a = self.attn_norm(x + F.dropout(self.attn_dense(ctx), 0.1, self.training))
        return self.out_norm(a + F.dropout(self.out(F.gelu(self.inter(a))), 0.1, self.training))


class BertForPreTraining(nn.Module):
    def __init__(self, config, vocab=30522):
        super().__init__()
        layers, hidden = BERT_CONFIGS[config]
        self.word = nn.Embedding(vocab, hidden, padding_idx=0)
        self.position = nn.Embedding(512, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.emb_norm = LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, hidden // 64) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)  # unused by the masked-LM loss, as in chorus's model
        self.transform = nn.Linear(hidden, hidden)
        self.transform_norm = LayerNorm(hidden, eps=1e-12)
        self.decoder_bias = nn.Parameter(torch.zeros(vocab))
        self.seq_relationship = nn.Linear(hidden, 2)
        for name, p in self.named_parameters():
            if "norm" in name:
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def encode(self, ids, attention_mask):
        b, t = ids.shape
        positions = torch.arange(t, device=ids.device).unsqueeze(0)
        h = self.word(ids) + self.position(positions) + self.token_type(torch.zeros_like(ids))
        h = F.dropout(self.emb_norm(h), 0.1, self.training)
        additive = ((1.0 - attention_mask.to(h.dtype)) * -1e9).reshape(b, 1, 1, t)
        for layer in self.layers:
            h = layer(h, additive)
        return h

    def pretraining_logits(self, ids):
        """chorus's BertForPreTraining::forward: the vocabulary's logits at every position and the
        next-sentence logits from the pooled first token (tools/gpu/peer.py's DDP step)."""
        h = self.encode(ids, torch.ones_like(ids))
        x = self.transform_norm(F.gelu(self.transform(h)))
        logits = torch.matmul(x, self.word.weight.t()) + self.decoder_bias
        return logits, self.seq_relationship(torch.tanh(self.pooler(h[:, 0])))

    def masked_lm_loss(self, ids, attention_mask, labels):
        h = self.encode(ids, attention_mask)
        flat = labels.reshape(-1)
        picked_positions = (flat != -100).nonzero().squeeze(1)  # a host sync, as chorus's label read
        picked = h.reshape(-1, h.shape[-1]).index_select(0, picked_positions)
        x = self.transform_norm(F.gelu(self.transform(picked)))
        logits = torch.matmul(x, self.word.weight.t()) + self.decoder_bias
        return F.cross_entropy(logits, flat.index_select(0, picked_positions))


# layers, width, heads, vocabulary, positions, dropout: examples/models/gpt's presets.
GPT_CONFIGS = {"tiny": (2, 64, 4, 256, 128, 0.0), "mini": (4, 256, 4, 256, 256, 0.0),
               "gpt2": (12, 768, 12, 50257, 1024, 0.1)}


def causal_attention(q, k, v, p, training):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p if training else 0.0, is_causal=True)
    t = q.shape[-2]
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.matmul(F.dropout(torch.softmax(scores, -1), p, training), v)


class GPTBlock(nn.Module):
    def __init__(self, width, heads, p):
        super().__init__()
        self.heads, self.p = heads, p
        self.ln_1, self.ln_2 = LayerNorm(width, eps=1e-5), LayerNorm(width, eps=1e-5)
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.c_fc, self.mlp_proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.c_attn(self.ln_1(x)).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = causal_attention(qkv[0], qkv[1], qkv[2], self.p, self.training)
        x = x + F.dropout(self.c_proj(y.permute(0, 2, 1, 3).reshape(b, t, c)), self.p, self.training)
        h = self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x + F.dropout(h, self.p, self.training)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        layers, width, heads, vocab, positions, p = GPT_CONFIGS[config]
        self.p, self.vocab, self.positions = p, vocab, positions
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(positions, width)
        self.h = nn.ModuleList(GPTBlock(width, heads, p) for _ in range(layers))
        self.ln_f = LayerNorm(width, eps=1e-5)
        for name, param in self.named_parameters():
            if ".ln_" in name or name.startswith("ln_"):
                nn.init.ones_(param) if name.endswith("weight") else nn.init.zeros_(param)
            elif name.endswith("bias"):
                nn.init.zeros_(param)
            else:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") or "mlp_proj" in name else 0.02
                nn.init.normal_(param, 0.0, std)

    def loss(self, ids, targets):
        t = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(t, device=ids.device).unsqueeze(0))
        x = F.dropout(x, self.p, self.training)
        for block in self.h:
            x = block(x)
        logits = torch.matmul(self.ln_f(x), self.wte.weight.t())  # the tied LM head
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))


# ---- timing and rows ---------------------------------------------------------------------------

class Bench:
    def __init__(self, args):
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.tiny = args.tiny or not self.cuda
        self.json_path = args.json
        if self.tiny:
            self.warmup, self.iters, self.step_warmup, self.step_iters = 1, 3, 1, 2
            self.conv_warmup, self.conv_iters = 1, 2
            self.resnet_batch, self.resnet_image = 2, 32
            self.bert_config, self.bert_batch, self.bert_seq = "tiny", 2, 16
            self.gpt_config, self.gpt_batch, self.gpt_seq = "tiny", 2, 16
            self.conv_batch = 2
        else:
            self.warmup, self.iters, self.step_warmup, self.step_iters = 10, 50, 5, 20
            self.conv_warmup, self.conv_iters = 5, 20
            self.resnet_batch, self.resnet_image = 128, 224
            self.bert_config, self.bert_batch, self.bert_seq = "base", 32, 128
            self.gpt_config, self.gpt_batch, self.gpt_seq = "gpt2", 8, 1024
            self.conv_batch = 128
        if args.warmup is not None:
            self.warmup = self.conv_warmup = args.warmup
        if args.iters is not None:
            self.iters = self.conv_iters = args.iters
        if args.step_warmup is not None:
            self.step_warmup = args.step_warmup
        if args.step_iters is not None:
            self.step_iters = args.step_iters
        self.rows = []

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def median_ms(self, fn, warmup, iters):
        """Median of `iters` runs after `warmup`; each run between two CUDA events (wall clock on the CPU)."""
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(iters):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        return times[len(times) // 2]

    def fresh_peak(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def allocated(self):
        """Bytes held by the caching allocator now (after the queued work: synchronizes)."""
        if not self.cuda:
            return 0
        torch.cuda.synchronize(self.device)
        return torch.cuda.memory_allocated(self.device)

    def row(self, section, impl, case, ms, value, unit, peaks=False, note="", activations=None):
        r = {"gpu_bench": "row", "impl": impl, "section": section, "case": case, "ms": ms, "value": value,
             "unit": unit, "device": str(self.device)}
        if peaks and self.cuda:
            r["peak_allocated_mib"] = torch.cuda.max_memory_allocated(self.device) / MIB
            r["peak_reserved_mib"] = torch.cuda.max_memory_reserved(self.device) / MIB
        if activations is not None and self.cuda:
            # What the forward pass left allocated (saved activations, the loss): gpu_bench's figure
            r["activations_mib"] = activations / MIB
        if note:
            r["note"] = note
        self.rows.append(r)

    def print_section(self, section):
        rows = [r for r in self.rows if r["section"] == section]
        print("\n| case | impl | ms | throughput | peak allocated MiB | peak reserved MiB |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            alloc = f"{r['peak_allocated_mib']:.0f}" if "peak_allocated_mib" in r else ""
            reserved = f"{r['peak_reserved_mib']:.0f}" if "peak_reserved_mib" in r else ""
            print(f"| {r['case']} | {r['impl']} | {r['ms']:.3f} | {r['value']:.4g} {r['unit']} | {alloc} | {reserved} |")
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        print("\n" + lines, end="")
        if self.json_path:
            with open(self.json_path, "a", encoding="utf-8") as f:
                f.write(lines)
        sys.stdout.flush()

    def randn(self, *shape, dtype=torch.float32):
        return torch.randn(*shape, device=self.device).to(dtype)

    def autocast(self, enabled):
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=enabled)


def set_tf32(matmul, cudnn=True):
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn


# ---- sections ----------------------------------------------------------------------------------

def resnet_step(b, layout):
    """The resnet50 and blocks sections' step: ResNet-50, SGD with momentum, one batch of random images
    in `layout`, after a fresh peak."""
    b.fresh_peak()
    torch.manual_seed(1)
    model = ResNet50().to(b.device).to(memory_format=layout).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    images = b.randn(b.resnet_batch, 3, b.resnet_image, b.resnet_image).contiguous(memory_format=layout)
    labels = torch.randint(0, 1000, (b.resnet_batch,), device=b.device)
    return model, opt, images, labels


def resnet50(b):
    set_tf32(True)
    for mode in ("tf32", "bf16"):
        for impl, layout in (("torch", torch.channels_last), ("torch_nchw", torch.contiguous_format)):
            model, opt, images, labels = resnet_step(b, layout)

            held = []

            def step():
                opt.zero_grad()
                before = b.allocated()
                with b.autocast(mode == "bf16"):
                    loss = F.cross_entropy(model(images), labels)
                held.append(b.allocated() - before)
                loss.backward()
                opt.step()

            ms = b.median_ms(step, b.step_warmup, b.step_iters)
            case = f"batch {b.resnet_batch} x 3x{b.resnet_image}² {mode}"
            note = "channels_last" if layout is torch.channels_last else "nchw"
            b.row("resnet50", impl, case, ms, b.resnet_batch / (ms / 1e3), "images/s", peaks=True, note=note,
                  activations=held[-1])
            del model, opt, images, labels


def blocks(b):
    """gpu_bench's blocks section: the resnet50 section's step cut into its 18 blocks (stem, the 16
    bottlenecks, head with the loss), each block's forward + backward between marks on the stream
    (CUDA events; wall clock on the CPU): before each block's forward and after the last, in gradient
    hooks on the blocks' outputs, and after backward() returns."""
    set_tf32(True)
    for mode in ("tf32", "bf16"):
        for impl, layout in (("torch", torch.channels_last), ("torch_nchw", torch.contiguous_format)):
            model, opt, images, labels = resnet_step(b, layout)
            bottlenecks, names = [], ["stem"]
            for stage in ("layer1", "layer2", "layer3", "layer4"):
                for i, block in enumerate(getattr(model, stage)):
                    bottlenecks.append(block)
                    names.append(f"{stage}.{i}")
            names.append("head")
            n = len(names)
            times = [[] for _ in range(n)]

            def mark():
                if b.cuda:
                    e = torch.cuda.Event(enable_timing=True)
                    e.record()
                    return e
                return time.perf_counter()

            def span(a, z):
                return a.elapsed_time(z) if b.cuda else (z - a) * 1e3

            def step(timed):
                fwd, bwd = [None] * (n + 1), [None] * (n + 1)
                opt.zero_grad()

                def hook(k):
                    def record(_):
                        bwd[k] = mark()
                    return record

                with b.autocast(mode == "bf16"):
                    fwd[0] = mark()
                    h = model.maxpool(F.relu(model.bn1(model.conv1(images))))
                    h.register_hook(hook(1))
                    fwd[1] = mark()
                    for k, block in enumerate(bottlenecks):
                        h = block(h)
                        h.register_hook(hook(k + 2))
                        fwd[k + 2] = mark()
                    loss = F.cross_entropy(model.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1)), labels)
                    fwd[n] = mark()
                bwd[n] = mark()
                loss.backward()
                bwd[0] = mark()
                opt.step()
                if timed:
                    b.sync()
                    for k in range(n):
                        times[k].append(span(fwd[k], fwd[k + 1]) + span(bwd[k + 1], bwd[k]))

            for _ in range(b.step_warmup):
                step(False)
            b.sync()
            for _ in range(b.step_iters):
                step(True)
            note = "channels-last" if layout is torch.channels_last else "nchw"
            for k in range(n):
                ms = statistics.median(times[k])
                b.row("blocks", impl, f"{mode} {names[k]}", ms, 1e3 / ms, "runs/s", note=note)
            del model, opt, images, labels


def language_model_row(b, section, model, lr, weight_decay, loss_of, case, items, unit):
    """The bert and gpt2 sections' step: AdamW under bf16 autocast, timed, with the peaks and what
    forward left allocated."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    held = []

    def step():
        opt.zero_grad()
        before = b.allocated()
        with b.autocast(True):
            loss = loss_of()
        held.append(b.allocated() - before)
        loss.backward()
        opt.step()

    ms = b.median_ms(step, b.step_warmup, b.step_iters)
    b.row(section, "torch", case, ms, items / (ms / 1e3), unit, peaks=True, activations=held[-1])


def bert(b):
    set_tf32(True)
    b.fresh_peak()
    torch.manual_seed(2)
    model = BertForPreTraining(b.bert_config).to(b.device).train()
    n_batch, t = b.bert_batch, b.bert_seq
    n = n_batch * t
    ids = torch.randint(999, 30522, (n_batch, t))
    labels = torch.full((n_batch, t), -100, dtype=torch.int64)
    masked = max(1, math.floor(0.15 * n + 0.5))
    flat_ids, flat_labels = ids.view(-1), labels.view(-1)
    for j in range(masked):
        flat_labels[j * n // masked] = flat_ids[j * n // masked]
    ids, labels = ids.to(b.device), labels.to(b.device)
    attention = torch.ones(n_batch, t, dtype=torch.int64, device=b.device)
    language_model_row(b, "bert", model, 1e-4, 0.01, lambda: model.masked_lm_loss(ids, attention, labels),
                       f"BERT-{b.bert_config} batch {n_batch} x seq {t} bf16", n_batch, "sequences/s")


def gpt2(b):
    set_tf32(True)
    b.fresh_peak()
    torch.manual_seed(3)
    model = GPT2LMHeadModel(b.gpt_config).to(b.device).train()
    n_batch, t = b.gpt_batch, min(b.gpt_seq, model.positions)
    ids = torch.randint(0, model.vocab, (n_batch, t), device=b.device)
    targets = torch.randint(0, model.vocab, (n_batch, t), device=b.device)
    language_model_row(b, "gpt2", model, 3e-4, 0.1, lambda: model.loss(ids, targets),
                       f"GPT-2 {b.gpt_config} batch {n_batch} x seq {t} bf16", n_batch * t, "tokens/s")


def gemm_shapes(b):
    layers, h = BERT_CONFIGS[b.bert_config]
    heads, tokens, t = h // 64, b.bert_batch * b.bert_seq, b.bert_seq
    masked = max(1, math.floor(0.15 * tokens + 0.5))
    square = 64 if b.tiny else 4096
    return [("square", 0, square, square, square),
            ("BERT QKV / attention output", 0, tokens, h, h),
            ("BERT FFN up", 0, tokens, 4 * h, h),
            ("BERT FFN down", 0, tokens, h, 4 * h),
            ("BERT MLM decoder (masked positions)", 0, masked, 30522, h),
            ("BERT attention scores (bmm)", b.bert_batch * heads, t, t, 64),
            ("BERT attention context (bmm)", b.bert_batch * heads, t, 64, t)]


def gemm(b):
    with torch.no_grad():
        for what, batch, m, n, k in gemm_shapes(b):
            for mode in ("fp32", "tf32", "bf16"):
                set_tf32(mode == "tf32")
                dtype = torch.bfloat16 if mode == "bf16" else torch.float32
                a_shape, b_shape = ((batch, m, k), (batch, k, n)) if batch else ((m, k), (k, n))
                case = f"{what} {batch}x[{m}x{n}x{k}] {mode}" if batch else f"{what} {m}x{n}x{k} {mode}"
                flop = 2.0 * max(batch, 1) * m * n * k
                b.fresh_peak()
                x, y = b.randn(*a_shape, dtype=dtype), b.randn(*b_shape, dtype=dtype)
                ms = b.median_ms(lambda: torch.matmul(x, y), b.warmup, b.iters)
                b.row("gemm", "torch", case, ms, flop / ms / 1e9, "TFLOP/s", peaks=True)
    set_tf32(True)


def memory(b):
    layers, h = BERT_CONFIGS[b.bert_config]
    heads, tokens = h // 64, b.bert_batch * b.bert_seq
    rows, cols = (64, 128) if b.tiny else (65536, 1024)
    add_n = 4096 if b.tiny else 1 << 26

    def add_case():
        x, y = b.randn(add_n), b.randn(add_n)
        return lambda: torch.add(x, y)

    def ln_case(r, c):
        def make():
            x, w, bias = b.randn(r, c), b.randn(c), b.randn(c)
            return lambda: F.layer_norm(x, (c,), w, bias, 1e-12)
        return (f"layer_norm [{r}, {c}] fp32", make, r * c, 4.0 * (2.0 * r * c + 2.0 * c))

    def sm_case(r, c):
        def make():
            x = b.randn(r, c)
            return lambda: torch.softmax(x, -1)
        return (f"softmax [{r}, {c}] fp32", make, r * c, 4.0 * 2.0 * r * c)

    cases = [(f"add [{add_n}] fp32", add_case, add_n, 4.0 * 3.0 * add_n),
             ln_case(rows, cols), ln_case(tokens, h), sm_case(rows, cols),
             sm_case(b.bert_batch * heads * b.bert_seq, b.bert_seq)]
    with torch.no_grad():
        for case, make, elements, nbytes in cases:
            b.fresh_peak()
            op = make()
            ms = b.median_ms(op, b.warmup, b.iters)
            b.row("memory", "torch", case, ms, nbytes / ms / 1e6, "GB/s", peaks=True)
            del op
            # PyTorch's own device-to-device copy of the output's size (a cudaMemcpyAsync).
            src = torch.zeros(4 * elements, dtype=torch.uint8, device=b.device)
            dst = torch.empty_like(src)
            ms = b.median_ms(lambda: dst.copy_(src), b.warmup, b.iters)
            b.row("memory", "torch_copy", case, ms, 2.0 * 4 * elements / ms / 1e6, "GB/s")
            del src, dst


def resnet50_convs():
    """Every distinct convolution of ResNet-50 at a 224² input, in gpu_bench's order and names."""
    v = [("conv1", 3, 64, 7, 2, 3, 224)]
    inplanes = 64
    for stage, (p, size) in enumerate(((64, 56), (128, 56), (256, 28), (512, 14))):
        stride = 1 if stage == 0 else 2
        out = size // stride
        name = f"layer{stage + 1}"
        v.append((name + ".0.conv1", inplanes, p, 1, 1, 0, size))
        v.append((name + ".0.conv2", p, p, 3, stride, 1, size))
        v.append((name + ".*.conv3", p, 4 * p, 1, 1, 0, out))
        if stage > 0:
            v.append((name + ".0.downsample", inplanes, 4 * p, 1, 2, 0, size))
        v.append((name + ".1.conv1", 4 * p, p, 1, 1, 0, out))
        if stage > 0:
            v.append((name + ".1.conv2", p, p, 3, 1, 1, out))
        inplanes = 4 * p
    return v


def conv(b):
    set_tf32(True)
    for mode in ("tf32", "bf16"):
        dtype = torch.bfloat16 if mode == "bf16" else torch.float32
        for where, cin, cout, k, stride, pad, size in resnet50_convs():
            if b.tiny:
                size = max(2, size // 8)
                cin = cin if cin <= 3 else max(1, cin // 16)
                cout = max(1, cout // 16)
            n = b.conv_batch
            o = (size + 2 * pad - k) // stride + 1
            case = f"{where} {n}x{cin}x{size}² -> {cout}x{o}² k{k} s{stride} {mode}"
            flop = 3.0 * 2.0 * n * cout * o * o * cin * k * k
            b.fresh_peak()
            x = b.randn(n, cin, size, size, dtype=dtype).requires_grad_()
            w = b.randn(cout, cin, k, k, dtype=dtype).requires_grad_()
            dy = b.randn(n, cout, o, o, dtype=dtype)

            def step():
                F.conv2d(x, w, None, stride, pad).backward(dy)
                x.grad = None
                w.grad = None

            ms = b.median_ms(step, b.conv_warmup, b.conv_iters)
            b.row("conv", "torch", case, ms, flop / ms / 1e9, "TFLOP/s", peaks=True, note="nchw")
            del x, w, dy



def layers(b):
    """ResNet-50's ops one by one, forward + backward, channels-last ("torch") and NCHW ("torch_nchw"):
    gpu_bench's layers section, the same names and shapes."""
    set_tf32(True)
    n = b.conv_batch
    scale, side = (16, 8) if b.tiny else (1, 1)
    for mode in ("tf32", "bf16"):
        dtype = torch.bfloat16 if mode == "bf16" else torch.float32
        for channels_last in (True, False):
            fmt_ = torch.channels_last if channels_last else torch.contiguous_format
            c256, c64, c2048 = 256 // scale, 64 // scale, 2048 // scale

            def weight(cout, cin, k):
                return b.randn(cout, cin, k, k, dtype=dtype).contiguous(memory_format=fmt_).requires_grad_()

            w1, w3, w7 = weight(c64, c256, 1), weight(c64, c64, 3), weight(c64, 3, 7)
            gamma, beta = b.randn(c256).requires_grad_(), b.randn(c256).requires_grad_()
            mean, var = torch.zeros(c256, device=b.device), torch.ones(c256, device=b.device)
            cases = [
                ("conv1 7x7 s2", 3, 224 // side, lambda x: F.conv2d(x, w7, None, 2, 3)),
                ("conv 1x1", c256, 56 // side, lambda x: F.conv2d(x, w1)),
                ("conv 3x3", c64, 56 // side, lambda x: F.conv2d(x, w3, None, 1, 1)),
                ("batch_norm (training)", c256, 56 // side,
                 lambda x: F.batch_norm(x, mean, var, gamma, beta, training=True)),
                ("relu", c256, 56 // side, F.relu),
                ("add (residual)", c256, 56 // side, lambda x: x + x * 0.5),
                ("max_pool2d 3x3 s2", c64, 112 // side, lambda x: F.max_pool2d(x, 3, 2, 1)),
                ("adaptive_avg_pool2d", c2048, 7, lambda x: F.adaptive_avg_pool2d(x, 1)),
            ]
            for name, c, size, op in cases:
                b.fresh_peak()
                x = b.randn(n, c, size, size, dtype=dtype).contiguous(memory_format=fmt_).requires_grad_()
                with torch.no_grad():
                    dy = b.randn(*op(x).shape, dtype=dtype).contiguous(memory_format=fmt_)

                def step():
                    op(x).backward(dy)
                    x.grad = None

                ms = b.median_ms(step, b.conv_warmup, b.conv_iters)
                b.row("layers", "torch" if channels_last else "torch_nchw", f"{name} {n}x{c}x{size}² {mode}", ms,
                      1e3 / ms, "runs/s", peaks=True, note="channels-last" if channels_last else "nchw")
                del x, dy

TITLES = {
    "resnet50": ("ResNet-50 training step (SGD momentum; TF32 / bf16 autocast; channels-last and NCHW)", resnet50),
    "bert": ("BERT masked-LM training step (AdamW, bf16 autocast)", bert),
    "gpt2": ("GPT-2 language-model training step (AdamW, bf16 autocast)", gpt2),
    "gemm": ("GEMM (torch.matmul)", gemm),
    "memory": ("memory-bound kernels, and a device-to-device copy of the output's size", memory),
    "conv": ("conv2d forward + backward (input and weight gradients)", conv),
    "layers": ("ResNet-50's layers forward + backward, channels-last and NCHW", layers),
    "blocks": ("ResNet-50's training step block by block, forward + backward, channels-last and NCHW", blocks),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections: " + ",".join(SECTIONS))
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (implies --tiny: checks the logic)")
    p.add_argument("--tiny", action="store_true", help="gpu_bench's tiny shapes and few iterations")
    p.add_argument("--warmup", type=int)
    p.add_argument("--iters", type=int)
    p.add_argument("--step-warmup", type=int)
    p.add_argument("--step-iters", type=int)
    p.add_argument("--json", help="also append the JSON lines to this file")
    args = p.parse_args(argv)
    sections = [s for s in args.only.split(",") if s]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        p.error(f"unknown section(s) {','.join(unknown)} (expected {','.join(SECTIONS)})")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("torch_peer.py: no CUDA device (run it on a GPU, or with --device cpu)", file=sys.stderr)
        return 2
    b = Bench(args)
    if args.json:
        open(args.json, "w").close()
    if b.cuda:
        torch.backends.cudnn.benchmark = True
        name = torch.cuda.get_device_name(b.device)
    else:
        name = "CPU (wall-clock timing, no memory statistics: a check of the script, not a peer figure)"
    print(f"torch_peer.py: PyTorch {torch.__version__} on {b.device} ({name}){' (tiny shapes)' if b.tiny else ''}: "
          f"medians of {b.iters} runs after {b.warmup} (ops), {b.step_iters} training steps after {b.step_warmup}")
    for s in SECTIONS:
        if s not in sections:
            continue
        title, fn = TITLES[s]
        print(f"\n## {s}: {title}")
        sys.stdout.flush()
        fn(b)
        b.print_section(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
