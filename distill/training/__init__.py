"""Distillation: recipes, datasets and prompts, the teacher (online or cached), the losses, the trainer."""
