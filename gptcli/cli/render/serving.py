"""What `gptcli serve` shows when it is ready: where it listens and how to call it."""

from __future__ import annotations

from rich.text import Text

from gptcli.cli.render.console import out
from gptcli.messages import printable


def serve_banner(url: str, model: str, keyed: bool) -> None:
    """The address, the model's name, a curl line and an openai client line; Ctrl-C stops."""
    auth = ' -H "Authorization: Bearer $GPTCLI_API_KEY"' if keyed else ""
    key = 'os.environ["GPTCLI_API_KEY"]' if keyed else '"none"'
    name = printable(model)
    out.print(Text.assemble(("serving ", "bold"), (name, "bold cyan"), " at ", (url, "bold")), soft_wrap=True)
    out.print(
        Text(
            f"  curl {url}/v1/completions{auth} -H 'Content-Type: application/json' \\\n"
            f'    -d \'{{"model": "{name}", "prompt": "The", "max_tokens": 20}}\'\n'
            f'  OpenAI(base_url="{url}/v1", api_key={key}).completions.create(model="{name}", prompt="The")\n'
            "Ctrl-C stops it.",
            style="dim",
        ),
        soft_wrap=True,
    )
    out.file.flush()
