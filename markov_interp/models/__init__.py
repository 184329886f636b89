"""Models: configs, the one initialiser, the one fused (stacked) forward, its optimiser and the hooked model.

Read left to right, each module importing only those before it:

- `config`: `ModelConfig` (architecture and init, heads per layer), `preset`, `PRESETS`;
- `hooks`: every hook name (`act_name`, as TransformerLens's `get_act_name`) and the intervention points;
- `init`: `initial_state(cfg, seed)`, a model's first weights in the on-disk layout (`state_shapes`);
- `memory`: the memory a model, its training and its forward need, estimated before allocating (`PlanTooLarge`);
- `hooked`: the TransformerLens model of the installed version (HookedTransformer on TL 2 / 3, TransformerBridge
  on TL 4; the conversions in `_tl`), built in one place (`hooked_model(cfg, state)`; `build`, `load`), `save`;
- `stack`: K models of one shape as stacked tensors and `stacked_forward`, the only training forward (K >= 1);
- `optim`: the weight-decay rule (by parameter name) and the stacked AdamW / SGD;
- `reduction`: the canonical (e, w, b) family as a training constraint (gradients projected onto it).

`from markov_interp.models import build, preset, ModelConfig, save, load, heads_per_layer` is the public face.
"""

from markov_interp.models import config, hooks, init, memory, hooked, stack, optim, reduction  # noqa: F401  (submodules by name)
from markov_interp.models.config import INIT_FIELDS, PRESETS, ModelConfig, preset, shape_config
from markov_interp.models.hooked import *  # noqa: F403  (its __all__: build, save, load, hooked_model, ...)
from markov_interp.models.hooked import __all__ as _hooked_all
from markov_interp.models.init import initial_state, state_shapes

__all__ = [
    "ModelConfig",
    "PRESETS",
    "preset",
    "INIT_FIELDS",
    "shape_config",
    "initial_state",
    "state_shapes",
    *_hooked_all,
]
