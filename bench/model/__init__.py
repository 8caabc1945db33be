"""The scripted OpenAI-compatible model that drives the frameworks' tool loops (see `server` and `policy`)."""

from bench.model.policy import PROOF_PATH, TASK_PROMPT, UNAME_COMMAND
from bench.model.server import DEFAULT_MODEL, ModelEndpoint, ModelServer, Transcript, serving_model

__all__ = [
    "DEFAULT_MODEL",
    "PROOF_PATH",
    "TASK_PROMPT",
    "UNAME_COMMAND",
    "ModelEndpoint",
    "ModelServer",
    "Transcript",
    "serving_model",
]
