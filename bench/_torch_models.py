"""The PyTorch side of the benches: models/resnet.py's networks in PyTorch.

Peers are for comparison only: nothing outside ``bench/`` imports this, and
torch is imported inside the functions, so the benches still run (without
their PyTorch columns) where it is missing.
"""
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def torch_resnet(arch='resnet50', stem='imagenet', n_classes=1000):
    """The network of models/resnet.py in PyTorch (same layers and shapes)."""
    import torch
    from torch import nn
    sys.path.insert(0, ROOT)
    from models.resnet import ARCHS
    kind, counts = ARCHS[arch]
    expansion = 4 if kind == 'bottleneck' else 1

    def conv_bn(cin, cout, k, s=1, p=0):
        return [nn.Conv2d(cin, cout, k, s, p, bias=False),
                nn.BatchNorm2d(cout)]

    class Block(nn.Module):
        def __init__(self, cin, mid, s):
            super().__init__()
            out = mid * expansion
            if kind == 'bottleneck':
                body = (conv_bn(cin, mid, 1) + [nn.ReLU(inplace=True)]
                        + conv_bn(mid, mid, 3, s, 1) + [nn.ReLU(inplace=True)]
                        + conv_bn(mid, out, 1))
            else:
                body = (conv_bn(cin, mid, 3, s, 1) + [nn.ReLU(inplace=True)]
                        + conv_bn(mid, out, 3, 1, 1))
            self.body = nn.Sequential(*body)
            self.proj = (nn.Sequential(*conv_bn(cin, out, 1, s))
                         if s != 1 or cin != out else None)

        def forward(self, x):
            sc = x if self.proj is None else self.proj(x)
            return torch.relu(self.body(x) + sc)

    if stem == 'imagenet':
        layers = conv_bn(3, 64, 7, 2, 3) + [nn.ReLU(inplace=True),
                                            nn.MaxPool2d(3, 2, 1)]
    else:
        layers = conv_bn(3, 64, 3, 1 if stem == 'small' else 2, 1) + [
            nn.ReLU(inplace=True)]
    cin = 64
    for i, (n, mid) in enumerate(zip(counts, (64, 128, 256, 512))):
        for j in range(n):
            layers.append(Block(cin, mid, 2 if (i > 0 and j == 0) else 1))
            cin = mid * expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, n_classes)]
    return nn.Sequential(*layers)


def torch_step(arch, stem, batch, size, threads, device='cpu',
               dtype='float32', autocast=False):
    """A function running one PyTorch step (forward, loss, backward, SGD);
    returns its seconds. ``dtype`` float16: the model and the data in half
    precision throughout, as minichain's float16 step (no autocast).
    ``autocast``: forward and loss under ``torch.autocast(device,
    dtype=torch.bfloat16)`` (PyTorch's mixed precision: bfloat16 products
    and activations, float32 parameters)."""
    import contextlib
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    kind = getattr(torch, dtype)
    model = torch_resnet(arch, stem).to(device=device, dtype=kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, size, size, device=device, dtype=kind)
    t = torch.randint(0, 1000, (batch,), device=device)
    lossf = torch.nn.CrossEntropyLoss()

    def step():
        start = time.perf_counter()
        opt.zero_grad()
        with (torch.autocast(device, dtype=torch.bfloat16) if autocast
              else contextlib.nullcontext()):
            loss = lossf(model(x), t)
        loss.backward()
        opt.step()
        if device != 'cpu':
            torch.cuda.synchronize()
        return time.perf_counter() - start
    return step


def time_torch(arch, stem, batch, size, steps, warmup, threads, device='cpu',
               dtype='float32'):
    """Median seconds per PyTorch step over ``steps`` after ``warmup``."""
    step = torch_step(arch, stem, batch, size, threads, device, dtype)
    times = [step() for _ in range(warmup + steps)]
    return statistics.median(times[warmup:])


