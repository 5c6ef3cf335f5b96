"""Where aiacc keeps what it compiles (numba kernel modules, MXNet extension libraries): one root,
$AIACC_CACHE_DIR, else $XDG_CACHE_HOME/aiacc, else ~/.cache/aiacc, with one folder per kind."""
from __future__ import annotations

import os


def cache_dir(kind: str) -> str:
    """The folder for compiled artefacts of `kind` ("numba", "mxnet_ext") under aiacc's cache root."""
    root = os.environ.get("AIACC_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "aiacc")
    return os.path.join(root, kind)
