"""The playground page that `gptcli serve` serves at /, in a real headless browser
(Playwright driving the system's chromium, never a downloaded one): type a prompt, send,
wait for the stream to end, read the tokens and a top-k popup from the DOM. Runs with
`make test-browser` (marker browser)."""

from __future__ import annotations

import math
import re

import pytest

pytestmark = pytest.mark.browser
playwright = pytest.importorskip("playwright.sync_api")

from tests.helpers import chromium  # noqa: E402

expect = playwright.expect
from tests.test_serve import Server  # noqa: E402


@pytest.fixture(scope="module")
def browser():
    if chromium() is None:
        pytest.skip("no chromium on this machine")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def test_the_playground_streams_tokens_shaded_with_their_alternatives(trained, browser):
    server = Server(trained, key="pg-key")
    try:
        want = server.client.completions.create(
            model=server.model, prompt="The fox", max_tokens=8, temperature=0, logprobs=8
        ).choices[0]
        page = browser.new_page()
        page.goto(server.url + "/")
        page.fill("#key", "pg-key")
        page.evaluate("loadModel()")  # the key was typed after the page asked
        expect(page.locator("#model")).to_have_text("run")
        page.fill("#prompt", "The fox")
        page.fill("#max-tokens", "8")
        page.fill("#temperature", "0")
        page.click("#send")
        expect(page.locator("#status")).to_have_text(re.compile("^done"), timeout=30_000)
        assert page.text_content("#status") == "done (length), 8 tokens"
        assert page.text_content("#output .prompt") == "The fox"
        tokens = page.locator("#output .token")
        assert "".join(tokens.all_text_contents()) == want.text
        # the shading follows each token's probability: the least likely is the darkest
        probs = [math.exp(lp) for lp in want.logprobs.token_logprobs]
        alphas = [
            float(tokens.nth(i).evaluate("e => e.style.background").rsplit(",", 1)[1].rstrip(")"))
            for i in range(tokens.count())
        ]
        assert alphas.index(max(alphas)) == probs.index(min(probs))
        # hovering a token shows the model's alternatives, the chosen one marked
        tokens.nth(0).hover()
        popup = page.locator("#popup")
        popup.wait_for(state="visible")
        rows = popup.locator("tr")
        assert rows.count() == 8
        chosen = popup.locator("tr.chosen td").first.text_content()
        assert chosen == f'"{want.logprobs.tokens[0]}"'
        shown = [float(rows.nth(i).locator("td").nth(1).text_content()) for i in range(rows.count())]
        assert shown == sorted(shown, reverse=True) and 0 < sum(shown) <= 1.0001
        top = sorted(want.logprobs.top_logprobs[0].values(), reverse=True)
        assert shown == pytest.approx([math.exp(v) for v in top], abs=1e-4)
        # a refusal is shown, not thrown
        page.fill("#temperature", "-1")
        page.click("#send")
        expect(page.locator("#status")).to_have_class("error")
        assert "'temperature' must be at least 0" in page.text_content("#status")
    finally:
        server.stop()
