"""`python -m gptcli` runs the command-line app."""

from gptcli.cli.app import main

if __name__ == "__main__":
    main()
