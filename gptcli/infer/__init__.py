"""Inference: token-level decoding (generate.py), text in and out on top of it
(completion.py), and the CPU's compiled bf16 decoding kernels (kernels.py)."""
