"""Debian's Chromium, headless, driven over the Chrome DevTools Protocol (one websocket to one tab).

Only the browser's own hosts resolve, 127.0.0.1 alone: a page that reaches for a CDN fails as it would offline, and
says so in its console. Used by tests/test_docs_site.py."""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # the network is off, but for this machine
         "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1", "--window-size=1280,900")


@contextlib.contextmanager
def chromium_tab(profile: Path, timeout: float = 60) -> Iterator[Tab]:
    """A fresh Chromium (its profile in ``profile``) and its one tab, for as long as the ``with`` lasts."""
    from websockets.sync.client import connect

    process = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = devtools_port(process, profile / "DevToolsActivePort", timeout)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as listing:
            page = next(t for t in json.load(listing) if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10) as socket:
            yield Tab(socket, timeout)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def devtools_port(process: subprocess.Popen, active_port: Path, timeout: float) -> int:
    """The port Chromium chose (--remote-debugging-port=0), from the file it writes into its profile."""
    deadline = time.monotonic() + timeout
    while not (active_port.exists() and active_port.read_text().strip()):
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited {process.returncode}: {process.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"chromium wrote no {active_port} in {timeout:.0f} s")
        time.sleep(0.1)
    return int(active_port.read_text().split()[0])


class Tab:
    """One browser tab: navigate, evaluate, read the DOM (closed shadow roots too) and collect console errors."""

    def __init__(self, socket: Any, timeout: float) -> None:
        self.socket, self.timeout = socket, timeout
        self.ids = itertools.count(1)
        self.events: list[dict] = []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params: Any) -> dict:
        """Send one command and wait for its answer; the events that arrive meanwhile are kept in ``events``."""
        ident = next(self.ids)
        self.socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=self.timeout))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def open(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + self.timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load in {self.timeout:.0f} s")
            self.call("Runtime.evaluate", expression="0")  # wait a round trip; events arrive meanwhile

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def document(self) -> dict:
        """The whole DOM, shadow roots included (also closed ones, which page scripts cannot see into)."""
        return self.call("DOM.getDocument", depth=-1, pierce=True)["root"]

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads since the last ``open``."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                found.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(f"exception: {details.get('exception', {}).get('description', details['text'])}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}".rstrip())
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                found.append(f"network: {params['errorText']} ({params.get('type')})")
        return found

    def requested(self) -> list[str]:
        """Every URL the page asked for since the last ``open``."""
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]


def elements(node: dict, name: str) -> list[dict]:
    """Every element called ``name`` (e.g. "svg", "PRE") under ``node``, through shadow roots."""
    found = [node] if node.get("nodeName", "").lower() == name.lower() else []
    for child in [*node.get("children", ()), *node.get("shadowRoots", ())]:
        found += elements(child, name)
    return found


def classes(node: dict) -> set[str]:
    attributes = node.get("attributes", [])
    pairs = dict(zip(attributes[::2], attributes[1::2]))
    return set(pairs.get("class", "").split())
