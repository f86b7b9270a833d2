"""``deepspeed.runtime.zero.leaf_module_config``: the ``zero_optimization.leaf_module`` block and its defaults."""

from zerorun.config.schema_zero import DEFAULT_LEAF_MODULE_CLASSES as _CLASSES
from zerorun.config.schema_zero import LeafModuleConfig as DeepSpeedZeroLeafModuleConfig  # noqa: F401

DEFAULT_LEAF_MODULE_CLASSES = list(_CLASSES)
DEFAULT_LEAF_MODULE_NAMES: list = []
DEFAULT_LEAF_MODULE_NAME_SUFFIXES: list = []
