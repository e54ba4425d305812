"""Inference: token-level decoding (generate.py), text in and out on top of it
(completion.py), the CPU's one-call decoding step (kernels.py, decode.c) and int8 weights
(quantize.py)."""
