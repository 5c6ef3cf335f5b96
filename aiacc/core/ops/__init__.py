"""The op registry and every op aiacc knows (ONNX semantics; fused ops in the domain "aiacc")."""
from aiacc.core.ops.registry import (REQUIRED, Attr, InferContext, OpSchema, all_schemas, get_schema,  # noqa: F401
                                     has_side_effects, infer_by_running, infer_node, op)
from aiacc.core.ops import elementwise, nn, tensor  # noqa: F401,E402  (registers the ops)
from aiacc.core.ops import reduce, resize, slicing  # noqa: F401,E402
from aiacc.core.ops import scatter  # noqa: F401,E402  (TopK, ScatterElements, ScatterND)
from aiacc.core.ops import fused  # noqa: F401,E402  (aiacc-domain fused ops; owned by core/passes)
from aiacc.core.ops import quantize  # noqa: F401,E402  (QuantizeLinear/DequantizeLinear; owned by core/quant)
from aiacc.core.ops import guard  # noqa: F401,E402  (aiacc::ValueGuard, a run-time check)
