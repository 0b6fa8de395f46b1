"""Admission errors: each names the limit it enforces, so the HTTP layer can answer 413/429 with a JSON body
that tells the caller what to change (shorten the prompt, pick another lane, back off)."""

from __future__ import annotations

from typing import Any

from temper.core.errors import TemperError


class AdmissionError(TemperError):
    """A request the engine refuses before doing any work for it."""

    status_code = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, limit: dict[str, Any]) -> None:
        super().__init__(message)
        self.message = message
        self.limit = limit

    def body(self) -> dict[str, Any]:
        """OpenAI's error shape (``error.message/type/code/param``) plus ``error.limit``."""
        return {"error": {"message": self.message, "type": self.error_type, "code": self.status_code,
                          "param": self.limit.get("param"), "limit": self.limit}}


class PromptTooLong(AdmissionError):
    """The prompt exceeds every lane's ``max_prompt_tokens``, or prompt + max_tokens exceeds the context."""

    status_code = 413
    error_type = "prompt_too_long"


class QueueFull(AdmissionError):
    """The lane the request belongs to has ``max_queued`` requests waiting."""

    status_code = 429
    error_type = "queue_full"


class EngineClosed(AdmissionError):
    status_code = 503
    error_type = "engine_closed"
