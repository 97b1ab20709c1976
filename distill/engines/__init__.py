"""Other engines driven with this project's drafts (llama.cpp, vLLM), each a module, each in its own environment, and the helpers only their benchmarks use."""
