"""Text as it arrives and as the model reads it: files from outside checked (inputs.py),
corpora read in every format (sources.py), the tokenizers (tokenizer.py), corpora encoded into
token shards (corpus.py), and finetuning records (records.py)."""
