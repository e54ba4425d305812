"""Training: the loop (trainer.py), optimizers and schedules (optim.py), what a run saves and
resume restores (state.py), where the model lives under torchrun (parallel.py), and setting
runs up from Python (recipes.py)."""
