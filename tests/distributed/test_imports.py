"""The TensorFlow and MXNet Horovod modules (and the torch-free parts of aiacc.distributed) import without
torch: torch is the transport, imported only when a job is joined (hvd.init())."""
import subprocess
import sys

import pytest

CHECK = ("import sys, os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'; import {module}; "
         "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')); "
         "print('TORCH_LOADED' if loaded else 'NO_TORCH', loaded[:5])")


def _imports_without_torch(module):
    res = subprocess.run([sys.executable, "-c", CHECK.format(module=module)], capture_output=True, text=True,
                         timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "NO_TORCH" in res.stdout, f"importing {module} imported torch: {res.stdout}"


TORCH_FREE = ["aiacc.distributed", "aiacc.distributed.compression", "aiacc.distributed.process",
              "aiacc.distributed.optimizer", "aiacc.distributed.launch", "aiacc.distributed.testbed"]
EACH = ("import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "    if any(m == 'torch' or m.startswith('torch.') for m in sys.modules):\n"
        "        print('TORCH_LOADED_BY', name); break\n"
        "else:\n"
        "    print('NO_TORCH')\n")


def test_torch_free_parts_of_the_package():
    """Each module in turn in one interpreter (torch, once loaded, stays in sys.modules: the first module
    after whose import it is there loaded it)."""
    res = subprocess.run([sys.executable, "-c", EACH, *TORCH_FREE], capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "NO_TORCH", f"importing {res.stdout.split()[-1]} imported torch"


def test_tf_horovod_imports_without_torch():
    pytest.importorskip("tensorflow")
    _imports_without_torch("aiacc.plugins.tf.horovod")


def test_mxnet_horovod_imports_without_torch():
    from aiacc.plugins.mxnet._import import import_mxnet

    try:
        import_mxnet()
    except ImportError:
        pytest.skip("mxnet is not installed")
    _imports_without_torch("aiacc.plugins.mxnet.horovod")


def test_one_definition_of_average_sum_compression():
    from aiacc.distributed import compression

    modules = ["aiacc.plugins.torch.horovod", "aiacc.plugins.tf.horovod", "aiacc.plugins.mxnet.horovod"]
    found = 0
    for name in modules:
        try:
            mod = __import__(name, fromlist=["x"])
        except ImportError:
            continue
        found += 1
        assert mod.Compression is compression.Compression
        assert (mod.Average, mod.Sum) == (compression.Average, compression.Sum)
    if not found:
        pytest.skip("no framework installed")
