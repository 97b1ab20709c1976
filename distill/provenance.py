"""What produced an output: Python and package versions, recorded beside every run and report."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

# Every package whose version can move a result: the tokenizer trainer (tokenizers), data order (datasets,
# numpy), kernels (torch), training loops (transformers, trl, peft, accelerate, deepspeed), GGUF dequantising.
PACKAGES = ("distill", "torch", "transformers", "tokenizers", "trl", "peft", "accelerate", "datasets", "numpy", "deepspeed", "safetensors", "gguf")


def package_version(name: str) -> str | None:
    """The installed version of `name`, or None when it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Python's version and each package's installed version (None when absent)."""
    return {"python": platform.python_version(), **{name: package_version(name) for name in packages}}
