"""The ceiling for bench/api.py: a FastAPI endpoint that answers a create with a fixed 201, served by
the same uvicorn settings as corral. Whatever corral costs above this is corral's own.

    python bench/bare_app.py PORT [--tls-dir D]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from corral.api.server import api_server

BODY: dict[str, object] = {
    "id": "sb-00000000000000000000",
    "name": None,
    "tenant": "t-0000",
    "template": "default",
    "host_id": "host-01",
    "state": "running",
    "memory_mb": 512,
    "cpus": 1.0,
    "stateful": False,
    "metadata": {},
    "created_at": "2026-01-01T00:00:00Z",
    "expires_at": None,
}

app = FastAPI()


@app.post("/v1/sandboxes", status_code=201)
async def create(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse(BODY, status_code=201)


@app.get("/readyz")
async def ready() -> dict[str, str]:
    return {"status": "ready"}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--tls-dir", type=Path, help="serve HTTPS with the certificate there")
    args = parser.parse_args()
    api_server(app, "127.0.0.1", args.port, tls_dir=args.tls_dir).run()
