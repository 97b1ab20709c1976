"""What every layer uses: the one model loader, vocabularies, atomic writes, provenance, docs sections, tiny models."""
