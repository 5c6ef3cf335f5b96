"""Precision planning in the IR: calibration (calibration.py), Q/DQ placement (qdq.py), the int8 plan with
its per-layer sensitivity and report (plan.py). Framework-free: graphs are run by the reference executor
or by a run function a backend supplies (aiacc.backends.quant)."""
from aiacc.core.quant.calibration import Range, check_calibration, choose_range, reference_run  # noqa: F401
from aiacc.core.quant.plan import (DEFAULT_TOLERANCE, LayerError, QuantReport, Tolerance,  # noqa: F401
                                   parse_tolerance, quantize, score, suggestion)

PRECISIONS = ("fp32", "bf16", "fp16", "int8")
