#!/usr/bin/python3
"""Writes the golden files tests/models/golden/{resnet18,bert_tiny}.safetensors with PyTorch.

Run by hand with Debian's python3-torch 1.13 (apt install python3-torch):

    /usr/bin/python3 tools/make_golden.py

The models are written here in plain torch.nn with torchvision's ResNet-18 and Hugging Face
BertForPreTraining's module structure and parameter names (neither torchvision nor transformers is
packaged for Debian's torch), at full size: ResNet-18 with 1000 classes (11.7M parameters) and
BERT-tiny (2 layers, hidden 128, 2 heads, intermediate 512, vocabulary 30522). Their weights would
be 47 MB and 18 MB, so the files carry them in closed form instead: parameter `name` element i is

    offset + scale * (((((i + 1) * 2654435761 + fnv1a32(name)) mod 2^32) >> 20) - 2048) / 2048

with `scale` a power of two and (scale, offset) stored as `scale.<name>`: every value is exact in
float32 and chorus's test rebuilds the same weights bit for bit. The reference runs in float64.

Stored per model: the inputs; the outputs; the loss; for every parameter its gradient
(`grad.<name>`: whole when it has at most 2048 elements, else the 512 elements at
floor(k * numel / 512)) and its gradient's L1 and L2 norms over all elements (`gradnorm.<name>`);
ResNet's BatchNorm running statistics after the training-mode forward (`buffer.<name>`).

ResNet's batch is 4 images of 3x48x48: at batch 2, layer4's BatchNorm normalizes over 8 values per
channel and the gradients are ill-conditioned (PyTorch's own float32 is 3.3e-4 relative off its
float64); at 4x3x48x48 PyTorch float32 is within 2.1e-5 of float64, so a 1e-4 test is meaningful.
"""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models", "golden")
FULL_LIMIT = 2048
SAMPLES = 512


def fnv1a32(s):
    h = 2166136261
    for b in s.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def closed_form(name, numel, scale, offset):
    i = np.arange(numel, dtype=np.uint64) + np.uint64(1)
    code = (i * np.uint64(2654435761) + np.uint64(fnv1a32(name))) & np.uint64(0xFFFFFFFF)
    v = (code >> np.uint64(20)).astype(np.int64) - 2048
    return offset + scale * v.astype(np.float64) / 2048.0


def pow2(x):
    return 2.0 ** round(math.log2(x))


def fill_weights(model, rule):
    """Sets every parameter from the closed form; returns {name: (scale, offset)}."""
    params = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale, offset = rule(name, p)
            values = closed_form(name, p.numel(), scale, offset)
            p.copy_(torch.from_numpy(values).reshape(p.shape))
            params[name] = (scale, offset)
    return params


def sample_indices(numel):
    if numel <= FULL_LIMIT:
        return np.arange(numel)
    return (np.arange(SAMPLES) * numel) // SAMPLES


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}[array.dtype]
        data = array.tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def gradient_entries(model, scales):
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.detach().reshape(-1).numpy()
        out["scale." + name] = np.array(scales[name], dtype=np.float32)
        out["grad." + name] = g[sample_indices(g.size)].astype(np.float32)
        out["gradnorm." + name] = np.array([np.abs(g).sum(), np.sqrt((g * g).sum())], dtype=np.float32)
    return out


# ----------------------------------------------------------------------------- ResNet-18
class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = 64
        for i, planes in enumerate([64, 128, 256, 512]):
            stride = 1 if i == 0 else 2
            layer = nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes, 1))
            setattr(self, "layer%d" % (i + 1), layer)
            inplanes = planes
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet_rule(name, p):
    if ".bn" in name or "bn1" in name or "downsample.1" in name:
        return (2.0 ** -3, 1.0) if name.endswith("weight") else (2.0 ** -4, 0.0)
    if name.endswith("bias"):
        return (2.0 ** -4, 0.0)
    fan_in = p.numel() // p.shape[0]
    return (pow2(math.sqrt(6.0 / fan_in)), 0.0)


def make_resnet(gen):
    model = ResNet18().double().train()
    scales = fill_weights(model, resnet_rule)
    x = torch.randn(4, 3, 48, 48, generator=gen, dtype=torch.float32).double()
    target = torch.randint(0, 1000, (4,), generator=gen)
    logits = model(x)
    loss = F.cross_entropy(logits, target)
    loss.backward()
    out = {
        "input": x.float().numpy(),
        "target": target.numpy(),
        "logits": logits.detach().float().numpy(),
        "loss": np.array([loss.item()], dtype=np.float32),
    }
    out.update(gradient_entries(model, scales))
    for name, b in model.named_buffers():
        if "running" in name:
            out["buffer." + name] = b.float().numpy()
    return out, {"model": "resnet18", "input": "4x3x48x48", "mode": "train"}


# ----------------------------------------------------------------------------- BERT-tiny
V, H, L, HEADS, I, P = 30522, 128, 2, 2, 512, 512


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x, additive_mask):
        b, t, _ = x.shape
        d = H // HEADS

        def split(y):
            return y.view(b, t, HEADS, d).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d) + additive_mask
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, H)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = SelfAttention()
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(H, H)
        self.attention.output.LayerNorm = nn.LayerNorm(H, eps=1e-12)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(H, I)
        self.output = nn.Module()
        self.output.dense = nn.Linear(I, H)
        self.output.LayerNorm = nn.LayerNorm(H, eps=1e-12)

    def forward(self, x, mask):
        a = self.attention.output.LayerNorm(x + self.attention.output.dense(self.attention.self(x, mask)))
        return self.output.LayerNorm(a + self.output.dense(F.gelu(self.intermediate.dense(a))))


class BertForPreTraining(nn.Module):
    def __init__(self):
        super().__init__()
        self.bert = nn.Module()
        e = self.bert.embeddings = nn.Module()
        e.word_embeddings = nn.Embedding(V, H)
        e.position_embeddings = nn.Embedding(P, H)
        e.token_type_embeddings = nn.Embedding(2, H)
        e.LayerNorm = nn.LayerNorm(H, eps=1e-12)
        self.bert.encoder = nn.Module()
        self.bert.encoder.layer = nn.ModuleList([Layer() for _ in range(L)])
        self.bert.pooler = nn.Module()
        self.bert.pooler.dense = nn.Linear(H, H)
        self.cls = nn.Module()
        self.cls.predictions = nn.Module()
        self.cls.predictions.transform = nn.Module()
        self.cls.predictions.transform.dense = nn.Linear(H, H)
        self.cls.predictions.transform.LayerNorm = nn.LayerNorm(H, eps=1e-12)
        self.cls.predictions.bias = nn.Parameter(torch.zeros(V))  # the decoder's weight is word_embeddings
        self.cls.seq_relationship = nn.Linear(H, 2)

    def forward(self, ids, types, attention_mask):
        e = self.bert.embeddings
        t = ids.shape[1]
        h = e.word_embeddings(ids) + e.position_embeddings(torch.arange(t)).unsqueeze(0) + e.token_type_embeddings(types)
        h = e.LayerNorm(h)
        mask = ((1.0 - attention_mask.to(h.dtype)) * -1e9).view(ids.shape[0], 1, 1, t)
        for layer in self.bert.encoder.layer:
            h = layer(h, mask)
        pooled = torch.tanh(self.bert.pooler.dense(h[:, 0]))
        tr = self.cls.predictions.transform
        z = tr.LayerNorm(F.gelu(tr.dense(h)))
        logits = z @ e.word_embeddings.weight.t() + self.cls.predictions.bias
        return logits, self.cls.seq_relationship(pooled)


def bert_rule(name, p):
    if "LayerNorm" in name:
        return (2.0 ** -3, 1.0) if name.endswith("weight") else (2.0 ** -4, 0.0)
    if name.endswith("bias"):
        return (2.0 ** -4, 0.0)
    if "embeddings" in name:
        return (2.0 ** -3, 0.0)
    return (pow2(math.sqrt(3.0 / p.shape[1])), 0.0)


def make_bert(gen):
    model = BertForPreTraining().double()
    scales = fill_weights(model, bert_rule)
    b, t = 2, 12
    ids = torch.randint(1000, V, (b, t), generator=gen)
    ids[:, 0] = 101
    types = torch.zeros(b, t, dtype=torch.int64)
    types[:, 7:] = 1
    attention = torch.ones(b, t, dtype=torch.int64)
    attention[1, 9:] = 0  # the second sequence ends in three padding positions
    ids[1, 9:] = 0
    labels = torch.full((b, t), -100, dtype=torch.int64)
    for (i, j) in [(0, 2), (0, 5), (0, 10), (1, 3), (1, 8)]:
        labels[i, j] = ids[i, j]
        ids[i, j] = 103  # [MASK]
    nsp = torch.tensor([0, 1])
    logits, nsp_logits = model(ids, types, attention)
    mlm_loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)
    nsp_loss = F.cross_entropy(nsp_logits, nsp)
    loss = mlm_loss + nsp_loss
    loss.backward()
    vocab_sample = (np.arange(64) * V) // 64
    out = {
        "input_ids": ids.numpy(),
        "token_type_ids": types.numpy(),
        "attention_mask": attention.numpy(),
        "mlm_labels": labels.numpy(),
        "nsp_labels": nsp.numpy(),
        "vocab_sample": vocab_sample.astype(np.int64),
        "prediction_logits_sample": logits.detach()[:, :, vocab_sample].float().numpy(),
        "seq_relationship_logits": nsp_logits.detach().float().numpy(),
        "mlm_loss": np.array([mlm_loss.item()], dtype=np.float32),
        "loss": np.array([loss.item()], dtype=np.float32),
    }
    out.update(gradient_entries(model, scales))
    return out, {"model": "bert-tiny", "input": "2x12", "mode": "train, dropout 0"}


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(20261123)
    for filename, make in [("resnet18.safetensors", make_resnet), ("bert_tiny.safetensors", make_bert)]:
        tensors, meta = make(gen)
        meta.update({"torch": torch.__version__, "script": "tools/make_golden.py", "weights": "closed form, see the script"})
        path = os.path.join(OUT, filename)
        write_safetensors(path, tensors, meta)
        print("%s: %d tensors, %d bytes" % (os.path.normpath(path), len(tensors), os.path.getsize(path)))


if __name__ == "__main__":
    main()
