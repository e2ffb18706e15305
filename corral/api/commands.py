"""Background commands over HTTP: ``POST|GET /v1/sandboxes/{id}/commands``, ``GET
/v1/sandboxes/{id}/commands/{pid}`` (``?wait_s=``), ``GET .../commands/{pid}/output`` (``?follow=true``:
the streamed exec's lines until it ends) and ``POST .../commands/{pid}/kill``.

A background command is the caller's explicit choice to keep a command running without a caller: its
reader going away (a follower, a waiter) never ends it; the streamed exec, which a caller leaving
kills, is the other choice. Tenant-scoped like exec: another tenant's sandbox is not found.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import Field

from corral.agent.execstream import ExecResponse, unless_caller_goes
from corral.agent.protocol import MAX_COMMAND_WAIT_S
from corral.api.auth import Plane, User, scope
from corral.api.schemas import ExecBody
from corral.exec_result import MAX_EXEC_TIMEOUT_S, STREAM_MEDIA_TYPE
from corral.shapes.commands import CommandInfo, CommandList, CommandOutput

router = APIRouter()

Pid = Annotated[int, Path(ge=1, lt=2**63)]


class CommandBody(ExecBody):
    # A command started to run on its own runs until it ends, an hour at most, unless it names less.
    timeout_s: float = Field(default=MAX_EXEC_TIMEOUT_S, gt=0, le=MAX_EXEC_TIMEOUT_S)


@router.post("/v1/sandboxes/{sandbox_id}/commands", status_code=201, response_model=CommandInfo)
async def start_command(sandbox_id: str, body: CommandBody, p: User, plane: Plane) -> CommandInfo:
    """Start a command that keeps running after this call (until it ends, its ``timeout_s``, a kill
    or its sandbox's end); its handle, with the ``pid`` the other routes name it by."""
    return await plane.sandboxes.start_command(sandbox_id, scope(p), body.request())


@router.get("/v1/sandboxes/{sandbox_id}/commands", response_model=CommandList)
async def list_commands(sandbox_id: str, p: User, plane: Plane) -> CommandList:
    """The sandbox's background commands: those running and the last few that ended."""
    return await plane.sandboxes.list_commands(sandbox_id, scope(p))


@router.get("/v1/sandboxes/{sandbox_id}/commands/{pid}", response_model=CommandInfo)
async def get_command(
    sandbox_id: str,
    pid: Pid,
    p: User,
    plane: Plane,
    request: Request,
    wait_s: Annotated[float, Query(ge=0, le=MAX_COMMAND_WAIT_S)] = 0.0,
) -> CommandInfo:
    """The command's state; with ``wait_s``, answered once it has ended or after that long."""
    return await unless_caller_goes(request, plane.sandboxes.command(sandbox_id, scope(p), pid, wait_s))


@router.get(
    "/v1/sandboxes/{sandbox_id}/commands/{pid}/output",
    response_model=CommandOutput,
    responses={200: {"content": {STREAM_MEDIA_TYPE: {}}}},
)
async def command_output(
    sandbox_id: str, pid: Pid, p: User, plane: Plane, follow: bool = False
) -> CommandOutput | Response:
    """What its host kept of its output (the last MiB of each stream). With ``follow=true``: that,
    then its output as it is written, in the streamed exec's lines, and last ``{"result": ...}`` once
    it has ended. A follower going away stops following; the command runs on."""
    if follow:
        return ExecResponse(await plane.sandboxes.follow_command(sandbox_id, scope(p), pid))
    return await plane.sandboxes.command_output(sandbox_id, scope(p), pid)


@router.post("/v1/sandboxes/{sandbox_id}/commands/{pid}/kill", response_model=CommandInfo)
async def kill_command(sandbox_id: str, pid: Pid, p: User, plane: Plane) -> CommandInfo:
    """SIGKILL the command and everything it started; its state once it has ended."""
    return await plane.sandboxes.kill_command(sandbox_id, scope(p), pid)
