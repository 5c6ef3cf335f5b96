"""The IR-level reference networks live in the package catalogue (aiacc.zoo.ir_models); re-exported here
for the tests that import them from the test zoo."""
from aiacc.zoo.ir_models import (FULL, SMALL, Builder, bert_encoder, breadth_first, densenet,  # noqa: F401
                                 example_feeds, inception, mobilenet_v2, resnet50)
