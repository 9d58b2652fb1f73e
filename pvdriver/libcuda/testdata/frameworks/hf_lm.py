# A Hugging Face causal LM (GPT-2 architecture, made from its config: no
# download) trained in bf16, then generate().
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from common import STEPS, Steps, torch_setup

dev = torch_setup()
cfg = GPT2Config(vocab_size=1000, n_positions=128, n_embd=256, n_layer=4, n_head=4)
model = GPT2LMHeadModel(cfg).to(dev, dtype=torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randint(0, 1000, (8, 128), device=dev)
s = Steps()
for step in range(STEPS):
    loss = model(data, labels=data).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    s.tick(step, loss.item)
s.done(torch.cuda.synchronize)
model.eval()
out = model.generate(data[:1, :8], max_new_tokens=16, do_sample=False, pad_token_id=0)
print("generated", out[0].tolist(), flush=True)
