"""The bundled lossless speculative decoder."""

from distill.speculative.decoder import SpeculativeDecoder
from distill.speculative.stats import SpecOutput, SpecStats

__all__ = ["SpecOutput", "SpecStats", "SpeculativeDecoder"]
