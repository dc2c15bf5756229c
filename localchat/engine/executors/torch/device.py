"""Which device the torch engine runs on: CUDA if present, else Apple MPS, else CPU;
The device setting overrides. Weights are built for the device at load (4-bit layers are packed
per device), so moving a loaded model is not supported: load it where it will run."""

from __future__ import annotations

import torch

from localchat.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda", "mps")


def pick_device(requested: str | None = None) -> torch.device:
    requested = (requested or "auto").strip().lower()
    kind = requested.split(":", 1)[0]
    if kind not in DEVICES:
        raise ConfigError("device", f"{requested!r} is unknown (choose from: {', '.join(DEVICES)}, "
                         "or cuda:N)")
    cuda = torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if kind == "auto":
        return torch.device("cuda" if cuda else "mps" if mps else "cpu")
    if kind == "cuda" and not cuda:
        raise ConfigError("device", "cuda: no CUDA device is available to PyTorch here "
                         f"(torch {torch.__version__}, built for CUDA: {torch.version.cuda or 'no'})")
    if kind == "mps" and not mps:
        raise ConfigError("device", "mps: Apple's Metal backend is not available here")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise ConfigError("device", f"{requested!r} is not a device") from None
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError("device", f"{requested}: there are {torch.cuda.device_count()} CUDA devices")
    return device


def move_module(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """Dense and NF4 layers move as they are (their tensors are plain attributes or
    buffers); int4 layers are built on their device instead."""
    for name, value in list(vars(module).items()):
        if isinstance(value, torch.Tensor):
            setattr(module, name, value.to(device))
    return module.to(device)
