"""Routing policies: which model writes each token."""

from .base import PeerMessage, Policy, Route, StepResult, Verdict, VerifyResult, normalized_entropy
from .bild import BiLD
from .citer import CITER
from .collm import CoLLM
from .escalation import Escalation
from .fields import ENTROPY, HIDDEN, HISTORY, STEP_FIELDS, TOKEN_EMBEDDING, VERIFY
from .lookup import PromptLookup
from .r2r import R2R
from .routers import (
    R2R_TOP_K,
    ModelIdentity,
    RouterConfig,
    RouterNet,
    load_router,
    model_identity,
    read_saved,
    save_router,
)
from .rstitch import RStitch
from .scripted import ScriptedRouter
from .single import Single
from .speculative import Speculative

__all__ = ["BiLD", "CITER", "CoLLM", "Escalation", "R2R", "ENTROPY", "HIDDEN", "PeerMessage", "Policy", "RStitch"]
__all__ += ["Route", "STEP_FIELDS", "Single", "Speculative", "StepResult", "TOKEN_EMBEDDING", "VERIFY", "Verdict"]
__all__ += ["VerifyResult", "normalized_entropy", "ModelIdentity", "R2R_TOP_K", "RouterConfig", "RouterNet"]
__all__ += ["load_router", "model_identity", "read_saved", "save_router", "HISTORY", "PromptLookup"]
__all__ += ["ScriptedRouter"]
