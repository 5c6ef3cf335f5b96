"""Execution of IR graphs: the reference executor (numpy kernels), numba kernels, arena execution."""
from aiacc.core.runtime.executor import Interpreter, check_inputs, run  # noqa: F401
