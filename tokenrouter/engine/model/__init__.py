"""One model loaded and run: every form of checkpoint to one, the weights filled tensor by tensor,
a batch packed into one forward (graph or eager), torch's threads per computing thread."""

from .loader import Checkpoint, LoadedModel, dense_checkpoint, load_model, load_tokenizer, locate_checkpoint
from .runner import ForwardOutput, HiddenCapture, ModelRunner
from .torch_threads import usable_cores, use_threads

__all__ = ["Checkpoint", "LoadedModel", "dense_checkpoint", "load_model", "load_tokenizer", "locate_checkpoint"]
__all__ += ["ForwardOutput", "HiddenCapture", "ModelRunner", "usable_cores", "use_threads"]
