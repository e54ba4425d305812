"""What `gptcli serve` shows when it is ready: where it listens and how to call it."""

from __future__ import annotations

from rich.text import Text

from gptcli.cli.render.console import out
from gptcli.messages import printable


def serve_banner(url: str, model: str, key_from: str | None) -> None:
    """The address, the model's name, a curl line and an openai client line; Ctrl-C stops.
    key_from: where the API key came from ("env": GPTCLI_API_KEY, which the lines use;
    "flag": --api-key, which they do not repeat: KEY stands for it), None: no key."""
    keys = {"env": ("$GPTCLI_API_KEY", 'os.environ["GPTCLI_API_KEY"]'), "flag": ("KEY", '"KEY"')}
    shell, key = keys.get(key_from or "", ("", '"none"'))
    auth = f' -H "Authorization: Bearer {shell}"' if key_from else ""
    name = printable(model)
    out.print(Text.assemble(("serving ", "bold"), (name, "bold cyan"), " at ", (url, "bold")), soft_wrap=True)
    out.print(
        Text(
            f"  curl {url}/v1/completions{auth} -H 'Content-Type: application/json' \\\n"
            f'    -d \'{{"model": "{name}", "prompt": "The", "max_tokens": 20}}\'\n'
            f'  OpenAI(base_url="{url}/v1", api_key={key}).completions.create(model="{name}", prompt="The")\n'
            + ("  (KEY: the key given to --api-key)\n" if key_from == "flag" else "")
            + "Ctrl-C stops it.",
            style="dim",
        ),
        soft_wrap=True,
    )
    out.file.flush()
