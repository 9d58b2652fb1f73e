# torchvision ResNet-18 in fp16 autocast with GradScaler and channels_last.
import torch
import torch.nn.functional as F
import torchvision
from common import STEPS, Steps, torch_setup

dev = torch_setup()
model = torchvision.models.resnet18(num_classes=10).to(dev).to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.amp.GradScaler("cuda")
x = torch.randn(64, 3, 64, 64, device=dev).to(memory_format=torch.channels_last)
y = torch.randint(0, 10, (64,), device=dev)
s = Steps()
for step in range(STEPS):
    with torch.autocast("cuda", torch.float16):
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    s.tick(step, loss.item)
s.done(torch.cuda.synchronize)
