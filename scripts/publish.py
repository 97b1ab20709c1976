"""Publish a trained draft: `python scripts/publish.py RUN --out DIR` (same as `distill publish`)."""

from distill.arguments import quiet_cpu_deepspeed
from distill.commands.publish import main

quiet_cpu_deepspeed()
raise SystemExit(main())
