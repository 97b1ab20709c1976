"""vLLM's own draft_model speculative decoding with this project's drafts, against its target alone, in vLLM's
environment (`distill vllm-env`; logic: distill/engines/vllm.py; skipped with a message when it is absent).

    R=~/.cache/distill-real
    python scripts/bench_vllm.py --target $R/coder-1.5b --draft base=$R/coder-0.5b \
        --draft gsm8k=published/qwen2.5-coder-0.5b-gsm8k-draft --ours eval-output/real-fp32/report.json \
        --json eval-output/vllm/report.json
"""

from distill.engines.vllm import main

if __name__ == "__main__":  # vLLM's engine starts processes of its own
    raise SystemExit(main())
