"""gptcli: train, finetune, sample and look inside small GPTs from the command line."""

__version__ = "0.1.0"
