"""Publish a trained draft: `python scripts/publish.py RUN --out DIR` (same as `distill publish`)."""

from distill.publish import main

raise SystemExit(main())
