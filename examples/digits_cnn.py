"""A small CNN on scikit-learn's 8x8 digits, written exactly as a PyTorch
user writes it: nn.Module, DataLoader, optim.Adam, a training loop.

    python examples/digits_cnn.py [--small] [--epochs N] [--compile] [--torch]

By default it runs on tracegrad (``import tracegrad as torch``); ``--torch``
imports real PyTorch instead and runs the very same code, so the accuracy
and the time can be compared.  ``--compile`` wraps the model in
``torch.compile`` (tracegrad: generated NumPy code for the forward and its
backward, one tape node per call).

The digits (1797 images) ship inside scikit-learn, so nothing is downloaded.
Without scikit-learn a seeded synthetic digits-like set is used (ten noisy,
shifted 8x8 prototypes), and the program says so.
"""
import argparse
import time

import numpy as np

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--torch", action="store_true", help="run on real PyTorch")
parser.add_argument("--compile", action="store_true", help="torch.compile(model)")
parser.add_argument("--small", action="store_true", help="a few batches (for the tests)")
parser.add_argument("--epochs", type=int, default=8)
args = parser.parse_args()

if args.torch:
    import torch
else:
    import tracegrad as torch

nn = torch.nn
F = torch.nn.functional
from_data = torch.utils.data


def load():
    """(images (N, 1, 8, 8) in [0, 1], labels, where the data came from)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        rng = np.random.default_rng(0)
        protos = rng.random((10, 8, 8)) > 0.6
        labels = rng.integers(0, 10, 1797)
        images = protos[labels].astype(np.float64)
        for i in range(len(images)):    # a random shift and pixel noise
            images[i] = np.roll(images[i], rng.integers(-1, 2, 2), axis=(0, 1))
        images = np.clip(images + rng.normal(0, 0.3, images.shape), 0, 1)
        return images[:, None], labels, "a synthetic digits-like set (no scikit-learn)"
    d = load_digits()
    return (d.images / 16.0)[:, None], d.target, "scikit-learn's digits"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.dropout = nn.Dropout(0.1)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))     # (N, 16, 4, 4)
        x = self.pool(F.relu(self.conv2(x)))     # (N, 32, 2, 2)
        x = torch.flatten(x, 1)
        x = self.dropout(F.relu(self.fc1(x)))
        return self.fc2(x)


def main():
    torch.manual_seed(0)
    images, labels, source = load()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(images))
    n_test = len(images) // 4
    test, train = order[:n_test], order[n_test:]
    x_train = torch.tensor(images[train], dtype=torch.float32)
    y_train = torch.tensor(labels[train], dtype=torch.int64)
    x_test = torch.tensor(images[test], dtype=torch.float32)
    y_test = torch.tensor(labels[test], dtype=torch.int64)
    loader = from_data.DataLoader(from_data.TensorDataset(x_train, y_train), batch_size=64,
                                  shuffle=True, generator=torch.Generator().manual_seed(0))

    model = Net()
    net = torch.compile(model) if args.compile else model
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss()
    print(f"{'torch ' + torch.__version__ if args.torch else 'tracegrad'} on {source}: "
          f"{len(train)} train, {len(test)} test images")

    epochs = 2 if args.small else args.epochs
    start = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        total, batches = 0.0, 0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = loss_fn(net(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
            if args.small and batches == 4:
                break
        print(f"epoch {epoch}  mean loss {total / batches:.4f}")
    elapsed = time.perf_counter() - start

    model.eval()
    with torch.no_grad():
        predicted = net(x_test).argmax(dim=1)
        accuracy = (predicted == y_test).float().mean().item()
    print(f"test accuracy {accuracy:.4f}")
    print(f"training time {elapsed:.2f} s")


if __name__ == "__main__":
    main()
