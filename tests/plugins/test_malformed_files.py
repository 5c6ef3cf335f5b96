"""Malformed framework files (issue 16): prototxt/caffemodel pairs, MXNet symbol JSON and params, SavedModels,
made from the zoo's own files by truncation, bit flips and field mutations. Each one ends in an AiaccError
that says what is wrong, or loads and optimizes with verified results (`aiacc optimize`'s path: the file's
own framework against aiacc's result on random inputs), within a time limit; never another exception type,
a crash or a hang.

A framework's C++ loader can crash the process on a bad file, so each framework's batch runs in one
subprocess (one per batch, not per case: framework imports dominate the cost). The subprocess is this file
run as a script; it prints one JSON line per case, flushed before the case starts, so a crash names the case.

`aiacc inspect` exits non-zero with a clear message on the files issue 16 names (0-byte .onnx, no graph,
opset 999, an unknown default-domain op, MXNet num_filter=-1, params of the wrong shape).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

CASE_SECONDS = 30.0  # one case: read, optimize, verify a tiny model
BATCH_SECONDS = 240.0  # one batch, framework import included


# ------------------------------------------------------------------------------------------------ mutations
def _truncations(data: bytes, name: str, fractions=(0.0, 0.05, 0.5, 0.9, 0.999)) -> list[tuple[str, bytes]]:
    return [(f"{name} truncated to {int(len(data) * f)} of {len(data)} bytes", data[:int(len(data) * f)])
            for f in fractions]


def _bit_flips(data: bytes, name: str, n: int = 4, seed: int = 0) -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = bytearray(data)
        for pos in rng.integers(0, len(b), size=8):
            b[pos] ^= 1 << int(rng.integers(0, 8))
        out.append((f"{name} with 8 bit flips (seed {seed}, #{len(out)})", bytes(b)))
    return out


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# ------------------------------------------------------------------------------------------------ corpora
def caffe_corpus(d: str) -> list[dict]:
    """lenet from the zoo: the pair, then broken copies (each case: a prototxt, maybe weights, what must be
    named in the error when it is one)."""
    from aiacc.zoo.small import caffe_models

    proto, weights = caffe_models.write(caffe_models.build("lenet"), d, "lenet")
    text, blob = open(proto).read(), open(weights, "rb").read()
    cases = [{"what": "the intact pair", "text": text, "weights": blob, "must_load": True}]
    cases += [{"what": w, "text": t.decode("utf-8", "ignore"), "weights": blob} for w, t in
              _truncations(text.encode(), "prototxt", (0.05, 0.5, 0.9))]
    cases += [{"what": w, "text": text, "weights": b} for w, b in _truncations(blob, "caffemodel")]
    cases += [{"what": w, "text": text, "weights": b} for w, b in _bit_flips(blob, "caffemodel")]
    cases += [{"what": "a binary file named .prototxt", "raw": bytes(range(256)) * 8, "weights": blob,
               "says": "prototxt"},
              {"what": "a caffemodel named .prototxt", "raw": blob, "weights": None, "says": "prototxt"},
              {"what": "an empty prototxt", "text": "", "weights": blob}]
    first_conv = re.search(r'name: "(\w+)"\s+type: "Convolution"', text).group(1)
    n_out = int(re.search(r"num_output: (\d+)", text).group(1))
    mutations = {  # what -> (pattern, replacement, what the error must name); the first match is changed
        "num_output: -1": (r"num_output: \d+", "num_output: -1", "num_output"),
        "num_output: 0": (r"num_output: \d+", "num_output: 0", first_conv),
        "kernel_size: 0": (r"kernel_size: \d+", "kernel_size: 0", first_conv),
        "stride: 0": (r"stride: \d+", "stride: 0", None),
        "a bottom no layer makes": (r'bottom: "pool1"', 'bottom: "nowhere"', "nowhere"),
        "an unknown layer type": (r'type: "ReLU"', 'type: "NoSuchLayer"', "NoSuchLayer"),
        "a weight shape the prototxt contradicts": (r"num_output: \d+", f"num_output: {n_out + 1}", first_conv),
    }
    for what, (pattern, new, says) in mutations.items():
        changed = re.sub(pattern, new, text, count=1)
        assert changed != text, what
        cases.append({"what": what, "text": changed, "weights": blob, "says": says})
    for i, case in enumerate(cases):
        p = os.path.join(d, f"case{i}.prototxt")
        with open(p, "wb") as f:
            f.write(case.pop("raw") if "raw" in case else case.pop("text").encode())
        if case.get("weights") is not None:
            with open(os.path.join(d, f"case{i}.caffemodel"), "wb") as f:
                f.write(case["weights"])
        case.pop("weights", None)
        case["path"] = p
    return cases


def mxnet_corpus(d: str) -> list[dict]:
    """The zoo's MXNet MLP and a small conv net (Gluon, exported as -symbol.json + -0000.params), then broken
    copies."""
    from aiacc.plugins.mxnet._import import import_mxnet
    from aiacc.zoo.small import mxnet_models

    mx = import_mxnet()
    mlp, (x,) = mxnet_models.mlp()
    mlp.hybridize()
    mlp(mx.nd.array(x))
    mlp.export(os.path.join(d, "mlp"))
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, in_channels=3), mx.gluon.nn.BatchNorm(in_channels=4),
            mx.gluon.nn.Activation("relu"), mx.gluon.nn.Dense(5, in_units=4 * 6 * 6))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.ones((1, 3, 8, 8)))
    net.export(os.path.join(d, "conv"))
    cases = []
    for base in ("mlp", "conv"):
        sym = open(os.path.join(d, f"{base}-symbol.json")).read()
        params = open(os.path.join(d, f"{base}-0000.params"), "rb").read()
        shapes = {"data": [3, 20]} if base == "mlp" else {"data": [1, 3, 8, 8]}
        cases.append({"what": f"{base}: the intact pair", "sym": sym, "params": params, "must_load": True,
                      "shapes": shapes})
        cases += [{"what": f"{base}: {w}", "sym": t.decode("utf-8", "ignore"), "params": params, "shapes": shapes}
                  for w, t in _truncations(sym.encode(), "symbol JSON", (0.0, 0.3, 0.95))]
        cases += [{"what": f"{base}: {w}", "sym": sym, "params": b, "shapes": shapes}
                  for w, b in _truncations(params, "params", (0.0, 0.1, 0.5, 0.99))]
        cases += [{"what": f"{base}: {w}", "sym": sym, "params": b, "shapes": shapes}
                  for w, b in _bit_flips(params, "params", 3)]
        cases.append({"what": f"{base}: binary symbol JSON", "rawsym": bytes(range(256)) * 4, "params": params,
                      "shapes": shapes, "says": "symbol"})
    conv = open(os.path.join(d, "conv-symbol.json")).read()
    conv_params = open(os.path.join(d, "conv-0000.params"), "rb").read()
    layer = json.loads(conv)["nodes"]
    conv_name = next(n["name"] for n in layer if n["op"] == "Convolution")
    fc_name = next(n["name"] for n in layer if n["op"] == "FullyConnected")
    shapes = {"data": [1, 3, 8, 8]}
    for what, (old, new, says) in {
        "num_filter=-1": ('"num_filter": "4"', '"num_filter": "-1"', conv_name),
        "num_filter=0": ('"num_filter": "4"', '"num_filter": "0"', conv_name),
        "kernel=(0, 0)": ('"kernel": "(3, 3)"', '"kernel": "(0, 0)"', conv_name),
        "num_hidden=-1": ('"num_hidden": "5"', '"num_hidden": "-1"', fc_name),
        "an unknown op": ('"op": "Activation"', '"op": "NoSuchOp"', "NoSuchOp"),
        "an input index out of range": ('"inputs": [[0, 0, 0]', '"inputs": [[99, 0, 0]', None),
    }.items():
        if old in conv:
            cases.append({"what": f"conv: {what}", "sym": _replace(conv, old, new), "params": conv_params,
                          "shapes": shapes, "says": says, "inspect": what == "num_filter=-1"})
    # params of the wrong shape and a missing weight: rewritten with mxnet itself
    loaded = mx.nd.load(os.path.join(d, "conv-0000.params"))
    conv_node = next(n for n in layer if n["op"] == "Convolution")
    weight = "arg:" + layer[conv_node["inputs"][1][0]]["name"]
    wrong = dict(loaded)
    wrong[weight] = mx.nd.ones((4, 3, 5, 5))
    mx.nd.save(os.path.join(d, "wrong.params"), wrong)
    missing = {k: v for k, v in loaded.items() if k != weight}
    mx.nd.save(os.path.join(d, "missing.params"), missing)
    cases.append({"what": "conv: params of the wrong shape", "sym": conv, "params":
                  open(os.path.join(d, "wrong.params"), "rb").read(), "shapes": shapes, "says": conv_name,
                  "inspect": True})
    cases.append({"what": "conv: a weight missing from the params", "sym": conv, "params":
                  open(os.path.join(d, "missing.params"), "rb").read(), "shapes": shapes,
                  "says": weight.split(":")[-1]})
    for i, case in enumerate(cases):
        base = os.path.join(d, f"case{i}")
        with open(base + "-symbol.json", "wb") as f:
            f.write(case.pop("rawsym") if "rawsym" in case else case.pop("sym").encode())
        with open(base + "-0000.params", "wb") as f:
            f.write(case.pop("params"))
        case["path"] = base + "-symbol.json"
    return cases


def tf_corpus(d: str) -> list[dict]:
    """The zoo's Keras MLP as a SavedModel, then broken copies of saved_model.pb and the variables."""
    import shutil

    import tensorflow as tf

    from aiacc.zoo.small import tf_models

    model, _ = tf_models.mlp()
    src = os.path.join(d, "mlp")
    tf.saved_model.save(model, src)
    pb = open(os.path.join(src, "saved_model.pb"), "rb").read()
    cases = [{"what": "the intact SavedModel", "must_load": True}]
    cases += [{"what": w, "pb": b} for w, b in _truncations(pb, "saved_model.pb", (0.0, 0.3, 0.9))]
    cases += [{"what": w, "pb": b} for w, b in _bit_flips(pb, "saved_model.pb", 2)]
    cases += [{"what": "no variables directory", "drop": "variables"},
              {"what": "variables.index truncated", "cut": ("variables/variables.index", 0.5)},
              {"what": "variables data truncated", "cut": ("variables/variables.data-00000-of-00001", 0.5)},
              {"what": "saved_model.pb replaced by text", "pb": b"this is not a SavedModel\n" * 10}]
    for i, case in enumerate(cases):
        dst = os.path.join(d, f"case{i}")
        shutil.copytree(src, dst)
        if "pb" in case:
            with open(os.path.join(dst, "saved_model.pb"), "wb") as f:
                f.write(case.pop("pb"))
        if "drop" in case:
            shutil.rmtree(os.path.join(dst, case.pop("drop")))
        if "cut" in case:
            rel, frac = case.pop("cut")
            p = os.path.join(dst, rel)
            data = open(p, "rb").read()
            with open(p, "wb") as f:
                f.write(data[:int(len(data) * frac)])
        case["path"] = dst
    return cases


CORPORA = {"caffe": caffe_corpus, "mxnet": mxnet_corpus, "tf": tf_corpus}
NEEDS = {"caffe": "google.protobuf", "mxnet": "mxnet", "tf": "tensorflow"}


# ------------------------------------------------------------------------------------------------ one batch
def _run_case(case: dict, out_dir: str) -> dict:
    """Optimize one file as `aiacc optimize` does; the outcome as a JSON-able dict."""
    import warnings

    from aiacc import cli
    from aiacc.errors import AiaccError

    t0 = time.perf_counter()
    opts = {"input_shapes": case["shapes"]} if "shapes" in case else {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = cli.optimize_file(case["path"], os.path.join(out_dir, "out"), **opts)
        result = {"outcome": "ok", "verified": report.verified}
    except AiaccError as e:
        result = {"outcome": "aiacc", "error": f"{type(e).__name__}: {e}"}
    except BaseException as e:  # noqa: BLE001 - what the test exists to find
        import traceback

        result = {"outcome": "other", "error": f"{type(e).__name__}: {e}"[:500],
                  "where": traceback.format_exc()[-1500:]}
    result["seconds"] = time.perf_counter() - t0
    if case.get("inspect"):  # `aiacc inspect FILE` (no input shapes given) must fail and say why
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result["inspect_rc"] = cli.main(["inspect", case["path"]])
        result["inspect_err"] = err.getvalue()
    return result


def run_batch(framework: str, d: str) -> None:
    """Build the corpus in `d` and print one JSON line per case ("start" before it, the result after)."""
    cases = CORPORA[framework](d)
    print(json.dumps({"cases": len(cases)}), flush=True)
    for i, case in enumerate(cases):
        print(json.dumps({"start": i, "what": case["what"]}), flush=True)
        out = os.path.join(d, f"out{i}")
        os.makedirs(out, exist_ok=True)
        print(json.dumps({"case": i, **{k: v for k, v in case.items()}, **_run_case(case, out)}), flush=True)


def _batch(framework: str, tmp_path) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")]), CI="1")
    p = subprocess.run([sys.executable, __file__, framework, str(tmp_path)], capture_output=True, text=True,
                       timeout=BATCH_SECONDS, env=env, cwd=_ROOT)
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    started = [ln for ln in lines if "start" in ln]
    done = [ln for ln in lines if "case" in ln]
    assert p.returncode == 0 and lines and len(done) == lines[0]["cases"], (
        f"{framework} batch died (exit {p.returncode}) in case "
        f"{started[-1]['what'] if started else '(corpus)'}: {p.stderr[-3000:]}")
    return done


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _check(framework: str, done: list[dict]) -> None:
    bad = []
    for c in done:
        if c["outcome"] == "other":
            bad.append(f"{c['what']}: not an aiacc error: {c['error']}\n{c.get('where', '')}")
        elif c["seconds"] > CASE_SECONDS:
            bad.append(f"{c['what']}: took {c['seconds']:.0f} s")
        elif c.get("must_load") and c["outcome"] != "ok":
            bad.append(f"{c['what']}: the intact file failed: {c['error']}")
        elif c["outcome"] == "ok" and not c["verified"].startswith("verified"):
            bad.append(f"{c['what']}: loaded but was not verified: {c['verified']}")
        elif c["outcome"] == "aiacc" and c.get("says") and c["says"] not in c["error"]:
            bad.append(f"{c['what']}: the error does not name {c['says']!r}: {c['error']}")
        elif c["outcome"] == "aiacc" and len(c["error"].split(": ", 1)[-1]) < 15:
            bad.append(f"{c['what']}: the error says too little: {c['error']}")
        elif c.get("inspect") and (c["inspect_rc"] == 0 or c["says"] not in c["inspect_err"]):
            bad.append(f"{c['what']}: aiacc inspect exits {c['inspect_rc']}: {c['inspect_err']!r}")
    passed = len(done) - len(bad)
    print(f"{framework}: {passed}/{len(done)} malformed-file cases end in an aiacc error or verified results "
          f"({sum(c['outcome'] == 'ok' for c in done)} loaded and verified)")
    assert not bad, "\n".join(bad)


def _skip_without(framework: str) -> None:
    import pytest

    if importlib.util.find_spec(NEEDS[framework].split(".")[0]) is None:
        pytest.skip(f"{NEEDS[framework]} is not installed")


def _onnx_files(d) -> dict[str, tuple[str, str]]:
    """The ONNX files issue 16 names: path -> what `aiacc inspect`'s error must say."""
    import onnx
    from onnx import TensorProto, helper

    def model(op: str, opset: int = 17):
        g = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="n0")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()

    no_graph = onnx.ModelProto()
    no_graph.ir_version = 8
    files = {"empty.onnx": (b"", "no graph"), "no_graph.onnx": (no_graph.SerializeToString(), "no graph"),
             "opset999.onnx": (model("Relu", 999), "opset 999"), "unknown_op.onnx": (model("NoSuchOp"), "NoSuchOp")}
    out = {}
    for name, (data, says) in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        out[os.path.join(d, name)] = (name, says)
    return out


def test_inspect_fails_clearly_on_the_broken_onnx_files(tmp_path, capsys):
    import pytest

    pytest.importorskip("onnx")
    from aiacc import cli

    for path, (name, says) in _onnx_files(tmp_path).items():
        assert cli.main(["inspect", path]) == 1, name
        err = capsys.readouterr().err
        assert err.startswith("aiacc: error:") and says in err, (name, err)
    # optimize may keep the unknown op opaque (it is written back as it was), but says it could not verify it
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = cli.optimize_file(str(tmp_path / "unknown_op.onnx"), str(tmp_path / "out.onnx"))
    assert report.verified.startswith("not verified") and "NoSuchOp" in report.verified
    assert any("NoSuchOp" in str(w.message) for w in caught)


def test_caffe_files(tmp_path):
    _skip_without("caffe")
    _check("caffe", _batch("caffe", tmp_path))


def test_mxnet_files(tmp_path):
    _skip_without("mxnet")
    _check("mxnet", _batch("mxnet", tmp_path))


def test_saved_models(tmp_path):
    _skip_without("tf")
    _check("tf", _batch("tf", tmp_path))


if __name__ == "__main__":
    run_batch(sys.argv[1], sys.argv[2])
