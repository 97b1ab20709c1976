"""The bundled lossless speculative decoder."""

from distill.speculative.decoder import SpecOutput, SpeculativeDecoder
from distill.speculative.stats import SpecStats

__all__ = ["SpecOutput", "SpecStats", "SpeculativeDecoder"]
