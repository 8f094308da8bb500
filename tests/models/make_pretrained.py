#!/usr/bin/env python3
"""Writes pretrained-format files with random weights, and PyTorch's outputs on them, for
tests/models/pretrained_test (issue 34 item 3). Nothing is downloaded: the models are PyTorch's own
modules (Debian's python3-torch 1.13, torchvision 0.14) with Hugging Face's module names, as
transformers' GPT2LMHeadModel and BertForMaskedLM define them, written here from those models'
published structure.

    make_pretrained.py OUT_DIR [--only gpt2,bert,resnet] [--gpt2-vocab N] [--bert-vocab N]

OUT_DIR/gpt2/{config.json,model.safetensors}: GPT2LMHeadModel as save_pretrained writes it (names
  "transformer.*", the tied lm_head.weight left out);
OUT_DIR/gpt2_base/{config.json,model.safetensors}: the same weights as the bare GPT2Model with
  the old causal-mask buffers (h.N.attn.bias, h.N.attn.masked_bias, in float32), as the hub's gpt2
  file has them;
OUT_DIR/bert/{config.json,model.safetensors}: BertForMaskedLM (no pooler, no next-sentence head;
  the position_ids buffer kept; the decoder's tied weight and bias left out);
OUT_DIR/resnet18.safetensors, resnet50.safetensors: torchvision state dicts (eval-mode statistics
  drawn at random so that batch norm is not an identity);
OUT_DIR/expected.safetensors: the inputs and PyTorch's float32 outputs (eval mode, no dropout).
Exit status 3 when python3-torch or python3-torchvision is missing.
"""
import json
import math
import os
import struct
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torchvision
except ImportError as e:  # tools/setup.sh installs them
    print(f"make_pretrained.py: {e} (install python3-torch and python3-torchvision: bash tools/setup.sh)", file=sys.stderr)
    sys.exit(3)

DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16"}


def save_safetensors(path, tensors, metadata=None):
    """The safetensors format, written without the safetensors package (not in Debian bookworm)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        data = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()  # little-endian here
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- GPT-2 (transformers' modeling_gpt2)
class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight).view(x.shape[:-1] + (self.weight.size(1),))


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        n = c["n_positions"]
        self.register_buffer("bias", torch.tril(torch.ones((n, n), dtype=torch.bool)).view(1, 1, n, n))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.heads, self.width = c["n_head"], c["n_embd"]
        self.c_attn = Conv1D(3 * self.width, self.width)
        self.c_proj = Conv1D(self.width, self.width)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.c_attn(x).split(self.width, dim=2)
        split = lambda y: y.view(b, t, self.heads, -1).permute(0, 2, 1, 3)
        q, k, v = split(q), split(k), split(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(v.size(-1))
        w = torch.where(self.bias[:, :, :t, :t], w, torch.tensor(torch.finfo(w.dtype).min))
        y = torch.matmul(w.softmax(-1), v).permute(0, 2, 1, 3).reshape(b, t, self.width)
        return self.c_proj(y)


class GPT2MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = Conv1D(4 * c["n_embd"], c["n_embd"])
        self.c_proj = Conv1D(c["n_embd"], 4 * c["n_embd"])

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])
        self.attn = GPT2Attention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])
        self.mlp = GPT2MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["n_positions"], c["n_embd"])
        self.h = nn.ModuleList([GPT2Block(c) for _ in range(c["n_layer"])])
        self.ln_f = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.size(1)).unsqueeze(0))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = GPT2Model(c)
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as GPT-2's

    def forward(self, ids):
        return self.lm_head(self.transformer(ids))


# ---------------------------------------------------------------- BERT (transformers' modeling_bert)
class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)

    def forward(self, x, mask):
        b, t, h = x.shape
        split = lambda y: y.view(b, t, self.heads, -1).permute(0, 2, 1, 3)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(h // self.heads) + mask
        return torch.matmul(scores.softmax(-1), v).permute(0, 2, 1, 3).reshape(b, t, h)


class DenseNorm(nn.Module):  # BertSelfOutput / BertOutput / BertPredictionHeadTransform's pieces
    def __init__(self, n_in, h, eps):
        super().__init__()
        self.dense = nn.Linear(n_in, h)
        self.LayerNorm = nn.LayerNorm(h, eps=eps)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = DenseNorm(c["hidden_size"], c["hidden_size"], c["layer_norm_eps"])

    def forward(self, x, mask):
        return self.output.LayerNorm(self.output.dense(self.self(x, mask)) + x)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["intermediate_size"])


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = DenseNorm(c["intermediate_size"], c["hidden_size"], c["layer_norm_eps"])

    def forward(self, x, mask):
        a = self.attention(x, mask)
        return self.output.LayerNorm(self.output.dense(F.gelu(self.intermediate.dense(a))) + a)


class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.word_embeddings = nn.Embedding(c["vocab_size"], h, padding_idx=0)
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], h)
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], h)
        self.LayerNorm = nn.LayerNorm(h, eps=c["layer_norm_eps"])
        self.register_buffer("position_ids", torch.arange(c["max_position_embeddings"]).expand((1, -1)))

    def forward(self, ids, types):
        pos = self.position_ids[:, : ids.size(1)]
        return self.LayerNorm(self.word_embeddings(ids) + self.position_embeddings(pos) + self.token_type_embeddings(types))


class BertEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(c) for _ in range(c["num_hidden_layers"])])


class BertModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)

    def forward(self, ids, types, attention_mask):
        mask = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        x = self.embeddings(ids, types)
        for layer in self.encoder.layer:
            x = layer(x, mask)
        return x


class BertLMPredictionHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transform = DenseNorm(c["hidden_size"], c["hidden_size"], c["layer_norm_eps"])
        self.decoder = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.bias = nn.Parameter(torch.zeros(c["vocab_size"]))
        self.decoder.bias = self.bias

    def forward(self, x):
        return self.decoder(self.transform.LayerNorm(F.gelu(self.transform.dense(x))))


class BertOnlyMLMHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.predictions = BertLMPredictionHead(c)


class BertForMaskedLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c)
        self.cls = BertOnlyMLMHead(c)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight  # tied

    def forward(self, ids, types, attention_mask):
        return self.cls.predictions(self.bert(ids, types, attention_mask))


def randomize(model, scale):
    """Every float tensor drawn afresh (weights N(0, scale), norms around 1; scale None keeps the
    module's own initialization of weights that are not norms) so that a misplaced, transposed or
    skipped tensor moves the outputs by far more than round-off."""
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or ".ln_" in name or name.startswith("bn1.") or ".bn" in name or ".downsample.1." in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif scale is None:
                continue
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
            elif name.endswith("num_batches_tracked"):
                b.fill_(17)


def main():
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--only", default="gpt2,bert,resnet", help="which families to write")
    parser.add_argument("--gpt2-vocab", type=int, default=97, help="GPT-2's vocabulary (a tokenizer's size)")
    parser.add_argument("--bert-vocab", type=int, default=101, help="BERT's vocabulary (a vocab.txt's size)")
    args = parser.parse_args()
    out, only = args.out, set(args.only.split(","))
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    expected = {}
    g = torch.Generator().manual_seed(99)

    if "gpt2" in only:
        gpt_config = {"model_type": "gpt2", "vocab_size": args.gpt2_vocab, "n_positions": 32, "n_embd": 48, "n_layer": 3, "n_head": 4,
                      "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "n_inner": None,
                      "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "initializer_range": 0.02,
                      "architectures": ["GPT2LMHeadModel"]}
        gpt = GPT2LMHeadModel(gpt_config).eval()
        randomize(gpt, 0.15)
        ids = torch.randint(0, gpt_config["vocab_size"], (2, 11), generator=g)
        with torch.no_grad():
            expected["gpt2.input_ids"] = ids
            expected["gpt2.logits"] = gpt(ids)
        state = {k: v for k, v in gpt.state_dict().items() if k != "lm_head.weight" and not k.endswith((".attn.bias", ".attn.masked_bias"))}
        for sub, tensors in (("gpt2", state),
                             ("gpt2_base", {k[len("transformer."):]: v.float() for k, v in gpt.state_dict().items() if k.startswith("transformer.")})):
            os.makedirs(os.path.join(out, sub), exist_ok=True)
            save_safetensors(os.path.join(out, sub, "model.safetensors"), tensors, {"format": "pt"})
            with open(os.path.join(out, sub, "config.json"), "w") as f:
                json.dump(gpt_config, f, indent=2)

    if "bert" in only:
        bert_config = {"model_type": "bert", "vocab_size": args.bert_vocab, "hidden_size": 32, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 40,
                       "type_vocab_size": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                       "attention_probs_dropout_prob": 0.1, "layer_norm_eps": 1e-12, "initializer_range": 0.02,
                       "position_embedding_type": "absolute", "architectures": ["BertForMaskedLM"]}
        bert = BertForMaskedLM(bert_config).eval()
        randomize(bert, 0.15)
        ids = torch.randint(1, bert_config["vocab_size"], (2, 13), generator=g)
        types = torch.zeros_like(ids)
        types[:, 7:] = 1
        attention = torch.ones_like(ids)
        attention[1, 10:] = 0  # padding at the end of the second sequence
        with torch.no_grad():
            expected["bert.input_ids"] = ids
            expected["bert.token_type_ids"] = types
            expected["bert.attention_mask"] = attention
            expected["bert.logits"] = bert(ids, types, attention)
        state = {k: v for k, v in bert.state_dict().items() if not k.startswith("cls.predictions.decoder.")}
        os.makedirs(os.path.join(out, "bert"), exist_ok=True)
        save_safetensors(os.path.join(out, "bert", "model.safetensors"), state, {"format": "pt"})
        with open(os.path.join(out, "bert", "config.json"), "w") as f:
            json.dump(bert_config, f, indent=2)

    if "resnet" in only:
        x = torch.randn(2, 3, 64, 64, generator=g)
        expected["resnet.input"] = x
        for name in ("resnet18", "resnet50"):
            model = getattr(torchvision.models, name)().eval()
            randomize(model, None)
            with torch.no_grad():
                expected[name + ".logits"] = model(x)
            save_safetensors(os.path.join(out, name + ".safetensors"), model.state_dict(), {"format": "pt"})
    save_safetensors(os.path.join(out, "expected.safetensors"), expected)


if __name__ == "__main__":
    main()
