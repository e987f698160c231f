"""`slmclassify label` in a real browser: headless Chromium (Debian's chromium + chromium-driver)
driven by Selenium labels 30 items by keyboard alone, the server is killed with SIGKILL, started
again, and every answer is still there and the page goes on.

Skipped, saying why, where Selenium, Chromium or chromedriver is missing; .ci/run installs them and
sets SLMCLASSIFY_REQUIRE_BROWSER, under which a missing one fails the test instead.
The screenshot (1280x800) goes to $SLMCLASSIFY_SCREENSHOT when set (docs/label-page.png for the
README), else into the test's temporary folder, so a test run leaves the checkout unchanged.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("sklearn")
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
CHROMEDRIVER = shutil.which("chromedriver")
MISSING = ("needs Chromium and chromedriver on PATH (Debian: apt-get install chromium chromium-driver)"
           if not (CHROMIUM and CHROMEDRIVER) else None)
if os.environ.get("SLMCLASSIFY_REQUIRE_BROWSER"):  # CI (.ci/run) installs them: a skip would hide the test
    assert MISSING is None, MISSING
    from selenium import webdriver
else:
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the 'test' extra)")
    if MISSING:
        pytest.skip(MISSING, allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from label_server import WAIT, Page  # noqa: E402

LABELS = ("billing", "technical", "account")
TASK_TOML = 'labels = ["billing", "technical", "account"]\nuser_template = "Ticket: {text}"\nmin_confidence = 0.5\n'
SUBJECTS = ["My card was charged twice", "The app crashes on start", "I need to change my email",
            "The invoice shows the wrong amount", "Login error after the update", "Please close my account",
            "Refund for the cancelled order", "The settings page is blank", "Password reset link expired",
            "Parcel delivery is late again"]
DETAILS = ["since Monday.", "and nobody answered.", "on my phone.", "for the third time.", "this morning.",
           "after I paid."]


def wait_until(driver, condition):
    """`condition(driver)`'s first true value, checked every 50 ms (selenium's default, 0.5 s, made
    each of the hundreds of waits of a test cost up to half a second), within `WAIT` seconds."""
    return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(condition)


def write_input(path: Path, n: int = 60) -> list[str]:
    texts = [f"{SUBJECTS[i % len(SUBJECTS)]} {DETAILS[(i * 7) % len(DETAILS)]} (ticket {1000 + i})"
             for i in range(n)]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text"])
        writer.writerows([1000 + i, text] for i, text in enumerate(texts))
    return texts


def chromium():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(CHROMEDRIVER), options=options)
    # the page itself at 1280x800, whatever the window's frame takes
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False})
    return driver


def page_state(driver) -> dict:
    """What the page shows now, read in one script (the page re-renders between two reads):
    the item's row and text, the guess, the action count, the status line, the header, the counts."""
    return driver.execute_script("""
        const text = (id) => document.getElementById(id).textContent;
        const row = text("row"), guess = document.querySelector("#guess b");
        return {row: row ? Number(row.split(" ").pop()) : null, text: text("text"),
                guess: guess ? guess.textContent : null,
                actions: Number(document.getElementById("main").dataset.actions || 0),
                status: text("status"), error: document.getElementById("status").className === "error",
                header: text("pool"),
                counts: Object.fromEntries([...document.querySelectorAll("#counts .bar")].map(
                    (b) => [b.querySelector(".name").textContent, Number(b.querySelector(".n").textContent)]))};
    """)


def press(driver, key: str) -> dict:
    """Press one key on the page and wait until the page has acted on it."""
    before = page_state(driver)["actions"]
    driver.find_element(By.TAG_NAME, "body").send_keys(key)
    wait_until(driver, lambda d: page_state(d)["actions"] > before or page_state(d)["error"])
    after = page_state(driver)
    assert not after["error"], after["status"]
    return after


def wait_for_item(driver) -> dict:
    wait_until(driver, lambda d: page_state(d)["row"] is not None)
    return page_state(driver)


def screenshot(driver, variable: str, default: Path) -> None:
    """The page as it is, without its status line, to $`variable` when set (the docs' picture), else `default`."""
    driver.execute_script("document.getElementById('status').textContent = ''")
    path = Path(os.environ.get(variable) or default)
    path.parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(path))


def exported(path: Path) -> dict[int, str]:
    with path.open(newline="") as f:
        return {int(r["id"]) - 1000: r["gold"] for r in csv.DictReader(f)}


def test_label_30_by_keyboard_kill_restart_and_go_on(tmp_path, llama_dir):
    input_path, task, store = tmp_path / "tickets.csv", tmp_path / "support.toml", tmp_path / "tickets.labels.sqlite"
    texts = write_input(input_path)
    task.write_text(TASK_TOML)
    args = [str(input_path), "--task", str(task), "--store", str(store), "--model", str(llama_dir), "--port", "0",
            "--seed", "3"]
    expected: dict[int, str] = {}
    done: list[int] = []  # rows in the order they were answered or skipped (undo pops)
    page = Page(args)
    driver = chromium()
    try:
        driver.get(page.url)
        shown = wait_for_item(driver)
        keys = ["1", "2", "3", Keys.ENTER, "2", "S", "1", Keys.BACK_SPACE, "3"]
        step = 0
        while len(expected) < 30:
            key = keys[step % len(keys)]
            step += 1
            row, guess = shown["row"], shown["guess"]
            assert shown["text"] == texts[row]
            shown = press(driver, key)
            if key == Keys.BACK_SPACE:
                undone = done.pop()
                expected.pop(undone, None)
                assert shown["row"] == undone, "after an undo the page offers the undone item again"
                continue
            done.append(row)
            if key == "S":
                continue
            if key == Keys.ENTER:  # the guess on screen when the key went (a poll may have changed it)
                assert shown["status"].startswith(f"row {row}: ") and shown["status"].endswith(" (the guess)")
                guess = shown["status"].removeprefix(f"row {row}: ").removesuffix(" (the guess)")
            expected[row] = guess if key == Keys.ENTER else LABELS[int(key) - 1]
            assert shown["row"] not in expected, "an answered item was offered again"
        first_url = page.url
    except BaseException:
        driver.quit()
        raise
    finally:
        page.kill()  # SIGKILL: no shutdown code runs
    assert page.proc.returncode == -signal.SIGKILL
    # the open tab says the server stopped, rather than a raw "Failed to fetch"
    wait_until(driver, 
        lambda d: d.execute_script("return document.getElementById('main').classList.contains('stopped')"))

    page = Page(args)
    try:
        assert page.url == first_url  # the port and token are kept in the store
        # the same tab carries on by itself once the server is back
        wait_until(driver, 
            lambda d: not d.execute_script("return document.getElementById('main').classList.contains('stopped')"))
        shown = wait_for_item(driver)
        assert shown["row"] not in expected and shown["row"] not in done
        counts = {label: 0 for label in LABELS}
        for label in expected.values():
            counts[label] += 1
        assert shown["header"].startswith(f"{len(expected)} labelled · ") and shown["counts"] == counts
        row = shown["row"]
        shown = press(driver, "2")  # the page goes on where it stopped
        expected[row] = LABELS[1]
        assert shown["row"] not in expected
        # the history: the latest answer shown again and changed
        before = page_state(driver)["actions"]
        driver.find_element(By.CSS_SELECTOR, "#history li").click()
        wait_until(driver, lambda d: page_state(d)["actions"] > before)
        assert page_state(driver)["row"] == row
        shown = press(driver, "3")
        expected[row] = LABELS[2]
        assert shown["row"] != row
        driver.find_element(By.ID, "export").click()
        wait_until(driver, lambda d: page_state(d)["status"].startswith("wrote "))
        assert page_state(driver)["status"] == f"wrote {len(expected)} rows to {tmp_path / 'tickets.labelled.csv'}"
        driver.find_element(By.ID, "fit").click()
        wait_until(driver, lambda d: page_state(d)["status"].endswith(".npz"))
        assert page_state(driver)["status"] == f"wrote {tmp_path / 'tickets.head.npz'}"
        screenshot(driver, "SLMCLASSIFY_SCREENSHOT", tmp_path / "label-page.png")
    finally:
        driver.quit()
        page.kill()
    assert exported(tmp_path / "tickets.labelled.csv") == expected
    assert (tmp_path / "tickets.head.npz").stat().st_size > 0


MANY = tuple(f"topic{i:02d}" for i in range(1, 13))  # 12 labels: keys 1-9, 0, A, B


def test_more_than_nine_labels_have_keys_and_a_hint_that_matches(tmp_path, llama_dir):
    """Labels 10, 11 and 12 are answered with 0, A and B; the buttons and the hint show those keys."""
    input_path, task, store = tmp_path / "tickets.csv", tmp_path / "topics.toml", tmp_path / "tickets.labels.sqlite"
    write_input(input_path, n=20)
    task.write_text("labels = [" + ", ".join(f'"{name}"' for name in MANY) + ']\nuser_template = "Ticket: {text}"\n')
    page = Page([str(input_path), "--task", str(task), "--store", str(store), "--model", str(llama_dir),
                 "--port", "0", "--seed", "1"])
    driver = chromium()
    try:
        driver.get(page.url)
        shown = wait_for_item(driver)
        keys = driver.execute_script(
            "return [...document.querySelectorAll('#labels button')].map((b) => b.querySelector('kbd').textContent)")
        assert keys == [*"123456789", "0", "A", "B"]
        assert driver.find_element(By.CSS_SELECTOR, "#keys kbd").text == "1–9, 0, A–B"
        expected = {}
        for key, label in (("0", MANY[9]), ("a", MANY[10]), ("B", MANY[11]), ("9", MANY[8])):
            row = shown["row"]
            shown = press(driver, key)
            expected[row] = label
            assert shown["status"] == f"row {row}: {label}", shown["status"]
        driver.find_element(By.ID, "export").click()
        wait_until(driver, lambda d: page_state(d)["status"].startswith("wrote "))
    finally:
        driver.quit()
        page.kill()
    assert exported(tmp_path / "tickets.labelled.csv") == expected


def test_multi_label_page_toggles_labels_and_submits_sets(tmp_path, llama_dir):
    """A multi-label task: each item appears with its guess toggled on; number keys toggle labels,
    Enter submits the set (an empty one too). 10 items labelled with several labels each; the
    export's gold column holds each set in the task's order, and Fit writes one-vs-rest heads."""
    from slmclassify.head.model import Head

    input_path, task, store = tmp_path / "tickets.csv", tmp_path / "multi.toml", tmp_path / "tickets.labels.sqlite"
    write_input(input_path, n=30)
    task.write_text('labels = ["billing", "technical", "account"]\nmulti_label = true\nuser_template = "Ticket: {text}"\n')
    page = Page([str(input_path), "--task", str(task), "--store", str(store), "--model", str(llama_dir),
                 "--port", "0", "--seed", "2"])
    driver = chromium()
    on = "return [...document.querySelectorAll('#labels button.on')].map((b) => b.dataset.label)"
    # 10 answers, most of several labels, each label with 2+ answers that have it and 2+ without
    targets = [{"billing", "technical"}, {"account"}, {"billing", "account"}, {"technical", "account"},
               {"billing", "technical", "account"}, set(), {"billing"}, {"technical", "billing"},
               {"account", "technical"}, {"billing", "account"}]
    expected = {}
    try:
        driver.get(page.url)
        shown = wait_for_item(driver)
        assert "toggle a label" in driver.find_element(By.ID, "keys").text
        for target in targets:
            row = shown["row"]
            # the guess and the labels toggled on, read at once (a refit may change the guess meanwhile)
            toggled, guess = driver.execute_script(on.replace("return ", "return [") +
                                                   ", document.querySelector('#guess b').textContent]")
            toggled = set(toggled)
            assert toggled == (set() if guess == "none of them" else set(guess.split(", "))), (toggled, guess)
            # a toggle there and back: the selection is the person's now, a refit no longer moves it
            driver.find_element(By.TAG_NAME, "body").send_keys("1", "1")
            toggled = set(driver.execute_script(on))
            for i, label in enumerate(LABELS):  # toggle what differs from the pre-selected guess
                if (label in target) != (label in toggled):
                    driver.find_element(By.TAG_NAME, "body").send_keys(str(i + 1))
            assert set(driver.execute_script(on)) == target
            shown = press(driver, Keys.ENTER)
            names = [label for label in LABELS if label in target]
            assert shown["status"] == f"row {row}: {', '.join(names) or 'none of them'}", shown["status"]
            expected[row] = ";".join(names)
            assert shown["row"] not in expected
        counts = {label: sum(label in t for t in targets) for label in LABELS}
        assert page_state(driver)["counts"] == counts
        driver.find_element(By.ID, "export").click()
        wait_until(driver, lambda d: page_state(d)["status"].startswith("wrote "))
        driver.find_element(By.ID, "fit").click()
        wait_until(driver, lambda d: page_state(d)["status"].endswith(".npz") or page_state(d)["error"])
        assert page_state(driver)["status"] == f"wrote {tmp_path / 'tickets.head.npz'}"
    finally:
        driver.quit()
        page.kill()
    assert exported(tmp_path / "tickets.labelled.csv") == expected
    head = Head.load(tmp_path / "tickets.head.npz")
    assert head.multi_label and head.labels == LABELS
