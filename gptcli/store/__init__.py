"""Models on disk, in and out: weights and metadata from elsewhere checked before anything
is built (validate.py), gptcli run directories (checkpoint.py; which directory is which,
without torch, layout.py), Hugging Face GPT-2 (hf.py, hf_tokenizer.py), and what a --ckpt
names, loaded (loading.py). Every file is written through gptcli/files.py."""
