"""llama.cpp's speculative decoding with this project's drafts exported as GGUFs, against its target alone
(logic: distill/engines/llamacpp.py; skipped with a message when llama.cpp is absent).

    python scripts/bench_llamacpp.py --llama-cpp "$(../shared/tools/build-llamacpp)" \
        --target ~/.cache/distill-real/qwen2.5-coder-1.5b-instruct.gguf \
        --draft base=~/.cache/distill-real/coder-0.5b --draft distilled=runs/qwen2.5-coder-0.5b-from-1.5b-cpu \
        --draft base-q4km=~/.cache/distill-real/qwen2.5-coder-0.5b-instruct.gguf \
        --ours eval-output/real/report.json --json llamacpp-report.json
"""

from distill.engines.llamacpp import main

raise SystemExit(main())
