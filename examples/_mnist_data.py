"""Data for the MNIST examples: the real MNIST IDX files, or scikit-learn's bundled 8x8
digits so that the examples run offline.

The IDX format (http://yann.lecun.com/exdb/mnist/): two zero bytes, a type code, the
number of dims, each dim as a big-endian uint32, then the values, big-endian. Files
may be gzipped (recognized by their first two bytes, whatever their name).

Images come back flattened to ``[N, side * side]`` float32 in [0, 1], labels int64.
"""

from __future__ import annotations

import gzip
import os
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

# IDX type code -> big-endian numpy dtype.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


class Dataset(NamedTuple):
    train_x: torch.Tensor  # [N, features] float32 in [0, 1]
    train_y: torch.Tensor  # [N] int64
    test_x: torch.Tensor
    test_y: torch.Tensor
    name: str

    def describe(self) -> str:
        return (f"{self.name}: {len(self.train_y)} train / {len(self.test_y)} test samples, "
                f"{self.train_x.shape[1]} features")


def parse_idx(raw: bytes, what: str = "IDX data") -> torch.Tensor:
    """Decode the bytes of one IDX file (gzipped or not) into a tensor of its shape."""
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{what}: not an IDX file (magic bytes {raw[:4].hex() or 'missing'})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{what}: truncated IDX header ({len(raw)} bytes, need {header})")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != want:
        raise ValueError(f"{what}: IDX shape {list(shape)} needs {want} bytes of data, found {len(raw) - header}")
    values = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return torch.from_numpy(values.astype(dtype.newbyteorder("="), copy=True))


def read_idx(path: str) -> torch.Tensor:
    with open(path, "rb") as f:
        return parse_idx(f.read(), path)


def _find(data_dir: str, base: str) -> str:
    for name in (base, base + ".gz"):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{data_dir}: no {base} (or {base}.gz); the MNIST files are "
                            + ", ".join(MNIST_FILES.values()))


def _pixels(images: torch.Tensor) -> torch.Tensor:
    """uint8 images [N, H, W] -> float32 [N, H * W] in [0, 1]."""
    return (images.reshape(len(images), -1).float() / 255.0).contiguous()


def load_mnist(data_dir: str) -> Dataset:
    """The four MNIST IDX files in ``data_dir`` (their standard names, optionally .gz)."""
    t = {key: read_idx(_find(data_dir, base)) for key, base in MNIST_FILES.items()}
    for split in ("train", "test"):
        images, labels = t[f"{split}_images"], t[f"{split}_labels"]
        if images.dim() != 3 or labels.dim() != 1 or len(images) != len(labels):
            raise ValueError(f"{data_dir}: {split} images of shape {list(images.shape)} do not go with "
                             f"labels of shape {list(labels.shape)}")
    return Dataset(_pixels(t["train_images"]), t["train_labels"].long(), _pixels(t["test_images"]),
                   t["test_labels"].long(), f"MNIST IDX from {data_dir}")


def load_digits(side: int = 8, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """scikit-learn's 1797 bundled 8x8 digits (values 0..16, scaled to [0, 1]), split
    into train and test by a permutation drawn from ``seed``.

    ``side=28`` makes MNIST-shaped images the way MNIST itself was made: each digit is
    resized to 20x20 (bilinear, ``align_corners=False``) and centred in a 28x28 frame
    by 4 zero pixels on each side. Other sides: plain bilinear resize to side x side.
    """
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0  # [N, 1, 8, 8]
    labels = torch.tensor(bunch.target, dtype=torch.int64)
    if side == 28:
        images = F.pad(F.interpolate(images, size=(20, 20), mode="bilinear", align_corners=False), (4, 4, 4, 4))
    elif side != 8:
        images = F.interpolate(images, size=(side, side), mode="bilinear", align_corners=False)
    images = images.clamp(0.0, 1.0).reshape(len(images), -1)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_test = round(len(labels) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return Dataset(images[train].contiguous(), labels[train], images[test].contiguous(), labels[test],
                   f"scikit-learn digits {side}x{side}")


def load(data_dir: str | None, side: int = 8, seed: int = 0) -> Dataset:
    """MNIST from ``data_dir`` if given, else the offline digits at ``side`` x ``side``."""
    return load_mnist(data_dir) if data_dir else load_digits(side=side, seed=seed)
