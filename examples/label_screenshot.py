"""The README's picture of the labelling page (docs/label-page.png, 1280x800): `slmclassify label`
with the embedded model on the demo tickets, 24 answers given by keyboard from the gold column,
then a screenshot once the head's refit has settled. Needs what tests/test_label_browser.py needs
(selenium, chromium, chromium-driver). Run from the repository root:

    .venv/bin/python examples/label_screenshot.py docs/label-page.png
"""

from __future__ import annotations

import csv
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_label_browser as browser  # noqa: E402

LABELS = ["billing", "technical", "account", "shipping", "feedback"]  # examples/support.toml's order


def main(out: str, answers: int = 24) -> None:
    examples = Path("examples").resolve()
    gold = [row["gold"] for row in csv.DictReader(open(examples / "tickets.csv", newline=""))]
    with tempfile.TemporaryDirectory() as folder:  # the store and the page's outputs, named as a user sees them
        page = browser.Page([str(examples / "tickets.csv"), "--task", str(examples / "support.toml"), "--port", "0"],
                            cwd=folder)
        driver = browser.chromium()
        try:
            driver.get(page.url)
            shown = browser.wait_for_item(driver)
            for _ in range(answers):
                shown = browser.press(driver, str(LABELS.index(gold[shown["row"]]) + 1))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and "refitting" in driver.find_element(browser.By.ID,
                                                                                      "accuracy-note").text:
                time.sleep(1)
            time.sleep(2.5)  # the page's next poll shows the settled estimate
            driver.execute_script("document.getElementById('status').textContent = ''")
            driver.save_screenshot(out)
        finally:
            driver.quit()
            page.kill()


if __name__ == "__main__":
    main(sys.argv[1])
