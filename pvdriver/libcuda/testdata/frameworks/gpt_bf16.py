# A small GPT trained in bf16 autocast with one SDPA backend (argv[2]:
# flash, efficient, cudnn, math); fused AdamW, gradient clipping.
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from common import STEPS, Steps, torch_setup

backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
           "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[sys.argv[2] if len(sys.argv) > 2 else "flash"]
dev = torch_setup()
V, D, H, L, T, B = 512, 256, 4, 4, 128, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, H, D // H).transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel(backend):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        self.blocks = nn.Sequential(*[Block() for _ in range(L)])
        self.head = nn.Linear(D, V)

    def forward(self, idx):
        x = self.emb(idx) + self.pos(torch.arange(T, device=idx.device))
        return self.head(self.blocks(x))


model = GPT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
data = torch.randint(0, V, (B, T + 1), device=dev)
s = Steps()
for step in range(STEPS):
    with torch.autocast("cuda", torch.bfloat16):
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, V), data[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    s.tick(step, loss.item)
s.done(torch.cuda.synchronize)
