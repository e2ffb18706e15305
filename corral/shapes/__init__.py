"""The API's answers, declared once: the server builds them, the SDK parses them (and hands them to its
callers as they are). Like :mod:`corral.exec_result` this package sits below every layer and needs only
pydantic, so ``pip install corral`` without the server's extras imports it.

A field a newer server adds is ignored and a field an older one leaves out takes its default, so SDKs
and servers of different versions keep talking; the server always fills every field.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# Sandbox ids and host ids travel in URLs and become hostnames: keep them to a safe alphabet.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


class Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
