"""The view in a real browser: headless Chromium driven by selenium (chromedriver), both from Debian's
packages (`apt-get install chromium chromium-driver`; .ci/run installs them where it can). Loads the
reports of ResNet-50 and of the BERT-style encoder and checks through the DOM that every node is drawn,
that a click shows the node's attributes, that fused nodes link to what they replaced, that the memory
plot has its peak marked; takes a screenshot; and loads a Chrome trace (validated against the
trace-event schema) into the page's recorded timeline. One browser for the module keeps it quick.
"""
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("AIACC_CHROMIUM", "/usr/bin/chromium")
DRIVER = os.environ.get("AIACC_CHROMEDRIVER", "/usr/bin/chromedriver")


def _why_not() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium; it is in aiacc's test extras)"
    for path, pkg in ((CHROMIUM, "chromium"), (DRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return f"{path} is missing: apt-get install chromium chromium-driver (Debian's {pkg} package)"
    if shutil.which("dot") is None:
        return "Graphviz `dot` is missing: apt-get install graphviz"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="aiacc-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                 "--window-size=1600,1000"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    import aiacc
    from aiacc.core.onnx import from_onnx
    from aiacc.examples import EXAMPLES

    d = tmp_path_factory.mktemp("view")
    out = {}
    for name, dims in (("resnet50", {"N": 1}), ("bert", {"N": 1, "S": 16})):
        g = from_onnx(EXAMPLES[name](None))
        html = aiacc.view(g, optimize=True, output=d / f"{name}.html", dims=dims, data_parallel=8,
                          trace=d / f"{name}.trace.json", title=f"example {name}")
        out[name] = (g, html, d / f"{name}.trace.json")
    return out


def _load(browser, path):
    from selenium.webdriver.common.by import By

    browser.get(Path(path).resolve().as_uri())
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1"
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


@pytest.mark.parametrize("name", ["resnet50", "bert"])
def test_report_in_chromium(browser, reports, name, tmp_path):
    from selenium.webdriver.common.by import By

    graph, html, _ = reports[name]
    _load(browser, html)
    drawn = browser.find_elements(By.CSS_SELECTOR, "#canvas-before g.irnode")
    assert sorted(e.get_attribute("id") for e in drawn) == sorted(f"bn{k}" for k in range(len(graph)))
    titles = {t.get_attribute("textContent") for t in browser.find_elements(By.CSS_SELECTOR, "#canvas-before g.irnode > title")}
    assert len(titles) == len(graph)
    after = browser.find_elements(By.CSS_SELECTOR, "#canvas-after g.irnode")
    assert 0 < len(after) < len(graph)
    # a click on a (visible) fused node shows its attributes and links the nodes it replaced
    fused = browser.find_elements(By.CSS_SELECTOR, "#canvas-after g.irnode.fused")
    assert fused
    target = fused[0]
    browser.execute_script("aiaccSelect(arguments[0])", target.get_attribute("id"))  # pan it into view
    target.click()
    info = browser.find_element(By.ID, "info")
    assert info.get_attribute("data-node") == target.get_attribute("id")
    data = json.loads(browser.execute_script("return document.getElementById('aiacc-data').textContent"))
    facts = data["graphs"]["after"]["nodes"][target.get_attribute("id")]
    text = info.text
    assert facts["name"] in text and facts["op"] in text
    for key in facts["attrs"]:
        assert key in text
    assert facts["fused_from"] and all(n in text for n in facts["fused_from"])
    linked = browser.find_elements(By.CSS_SELECTOR, "#canvas-before g.irnode.linked")
    assert {e.get_attribute("id") for e in linked} == {data["graphs"]["before"]["ids"][n] for n in facts["fused_from"]}
    # the memory plot marks its peak at the plan's peak step, labelled with the peak node
    peak = browser.find_element(By.ID, "mem-peak")
    assert int(peak.get_attribute("data-step")) == data["memory"]["peak_step"]
    assert int(peak.get_attribute("data-bytes")) == data["memory"]["lower_bound"] == max(data["memory"]["profile"])
    assert data["memory"]["peak_node"] in peak.text
    assert peak.find_element(By.TAG_NAME, "circle").is_displayed()
    # the buckets and the timeline
    rows = browser.find_elements(By.CSS_SELECTOR, "#bucket-table tr")
    assert len(rows) == len(data["comm"]["buckets"]) + 1
    assert browser.find_elements(By.CSS_SELECTOR, "#timeline rect.tl-event")
    shot = tmp_path / f"{name}.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_trace_validates_and_loads(browser, reports, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    import aiacc

    graph, _, trace = reports["bert"]
    doc = json.loads(trace.read_text())
    jsonschema.validate(doc, json.loads((Path(__file__).parent / "trace_event_schema.json").read_text()))
    html = aiacc.view(graph, output=tmp_path / "t.html", memory=False, timeline=trace)
    _load(browser, html)
    from selenium.webdriver.common.by import By

    bars = browser.find_elements(By.CSS_SELECTOR, "#recorded-timeline rect.tl-event")
    assert len(bars) == sum(1 for e in doc["traceEvents"] if e["ph"] == "X")
    parsed = browser.execute_script("return JSON.parse(arguments[0]).traceEvents.length", trace.read_text())
    assert parsed == len(doc["traceEvents"])


def test_a_graph_of_1200_nodes_stays_responsive(browser, tmp_path):
    """1,200 nodes (dot's fast settings): every node drawn, 20 wheel zooms and a select-and-pan each well
    under a second (the page transforms one SVG group; one delegated click listener)."""
    import aiacc
    from aiacc.core.ir import Graph
    from selenium.webdriver.common.by import By

    g = Graph("wide")
    v = g.add_input("x", "float32", (1, 64))
    for i in range(400):
        v = g.op("Add", g.op("Relu", v, name=f"b{i}.relu"), g.op("Sigmoid", v, name=f"b{i}.sig"), name=f"b{i}.add")
    g.add_output(v)
    html = aiacc.view(g, output=tmp_path / "wide.html", memory=False)
    assert "fast settings" in html.read_text()
    _load(browser, html)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#canvas-before g.irnode")) == 1200
    ms = browser.execute_async_script("""
        var done = arguments[arguments.length - 1], svg = document.querySelector('#canvas-before svg');
        var t0 = performance.now();
        for (var i = 0; i < 20; i++) {
          svg.dispatchEvent(new WheelEvent('wheel', {deltaY: i % 2 ? 120 : -120, clientX: 300, clientY: 300,
                                                     bubbles: true, cancelable: true}));
          document.body.getBoundingClientRect();
        }
        requestAnimationFrame(function () { done(performance.now() - t0); });""")
    assert ms < 1000, f"20 zooms took {ms:.0f} ms"
    t0 = browser.execute_script("return performance.now()")
    browser.execute_script("aiaccSelect('bn1100')")
    assert browser.execute_script("return performance.now()") - t0 < 1000
    assert browser.find_element(By.ID, "info").get_attribute("data-node") == "bn1100"


def test_the_panel_shows_the_framework_layers(browser, tmp_path):
    """A click on a node of a torch model's view names the module it came from; on a fused node, every
    layer it replaced."""
    from selenium.webdriver.common.by import By

    import aiacc
    from tests.view.test_sources import _torch_net

    model, x = _torch_net()
    _load(browser, aiacc.view(model, x, optimize=True, output=tmp_path / "net.html"))
    data = json.loads(browser.execute_script("return document.getElementById('aiacc-data').textContent"))
    info = browser.find_element(By.ID, "info")
    for side, want in (("before", lambda f: f["name"] == "head"),
                       ("after", lambda f: "block_conv" in f["fused_from"])):
        nid = next(k for k, f in data["graphs"][side]["nodes"].items() if want(f))
        browser.execute_script("aiaccSelect(arguments[0])", nid)
        browser.find_element(By.ID, nid).click()
        assert info.get_attribute("data-node") == nid
        facts = data["graphs"][side]["nodes"][nid]
        assert facts["sources"] and all(s in info.text for s in facts["sources"]), info.text
    assert "layers" in info.text and "block.bn (BatchNorm2d)" in info.text
