"""distill: train draft models on a target's logits and measure the speculative-decoding gain."""

__version__ = "0.1.0"
