"""The bench cases, one module each with `run(args) -> list[Result]`; CASES names them in
the order `python bench/run.py` runs them. A new case is a module here and one line."""

CASES = {
    "train": "train",
    "equal-time": "equal_time",
    "decode": "decode",
    "decode-long": "decode_long",
    "decode-static": "decode_static",
    "decode-isa": "decode_isa",
    "llama-cpp": "llama_cpp",
    "serve": "serve",
    "beam": "beam",
    "bpe": "bpe",
    "help": "help",
    "eval-text": "eval_text",
    "eval-choice": "eval_choice",
    "chart": "chart",
    "formats": "formats",
    "lora": "lora",
    "muon": "muon",
}
