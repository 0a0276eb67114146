"""One model's worker, in rooms: `ModelCore` (the step) and what it is made of at the top; the
worker thread, the model, its quantized kernels, attention, the scheduler, the KV cache and the
native code below it (docs/architecture.md). What code outside the engine uses is named here."""

from .attention import AttentionMetadata
from .handoff import MAX_STALLS
from .model import ForwardOutput, HiddenCapture, LoadedModel, dense_checkpoint, load_tokenizer, usable_cores
from .model_core import ModelCore
from .native import cpu_flags, cpu_identity, cpu_level, torch_capability, trim_heap
from .outbox import Outbox, WorkerEvent
from .quant import clear_probes, list_probes, probe_dir, tensor_places
from .sched import ScheduledBatch
from .sequence import Request, SeqStatus, Sequence
from .worker import (
    Abort,
    CoreShare,
    HandOff,
    LockstepDriver,
    Release,
    Sink,
    Stop,
    Submit,
    Worker,
    WorkerSettings,
    WorkerStats,
    WorkerThread,
)

__all__ = ["AttentionMetadata", "MAX_STALLS", "ModelCore", "Outbox", "WorkerEvent", "trim_heap", "ForwardOutput"]
__all__ += ["cpu_flags", "cpu_identity", "cpu_level", "torch_capability"]
__all__ += ["HiddenCapture", "LoadedModel", "dense_checkpoint", "load_tokenizer", "usable_cores", "clear_probes"]
__all__ += ["list_probes", "probe_dir", "tensor_places", "ScheduledBatch", "Request", "SeqStatus", "Sequence"]
__all__ += ["Abort", "CoreShare", "HandOff", "LockstepDriver", "Release", "Sink", "Stop", "Submit", "Worker"]
__all__ += ["WorkerSettings", "WorkerStats", "WorkerThread"]
