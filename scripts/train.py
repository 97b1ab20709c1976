"""Train a draft from a recipe: `accelerate launch scripts/train.py recipes/X.yaml [--resume]`."""

from distill.training.train import main

if __name__ == "__main__":
    raise SystemExit(main())
