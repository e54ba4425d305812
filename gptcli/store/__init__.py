"""Models on disk, in and out: every file written (files.py), files from elsewhere checked
(validate.py), gptcli run directories (checkpoint.py), Hugging Face GPT-2 (hf.py,
hf_tokenizer.py), and what a --ckpt names, loaded (loading.py)."""
