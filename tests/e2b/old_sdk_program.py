"""A program written for E2B, run by an older SDK's own interpreter (see test_old_sdks.py): it makes
the calls such a program makes and prints what each answered as one JSON object. It imports nothing of
corral's: only the SDK installed beside it."""

import json
import os
import sys
from importlib.metadata import version

from e2b import Sandbox, SandboxQuery

out: dict[str, object] = {"version": version("e2b")}
tag = sys.argv[1]
try:
    Sandbox.create(api_key="not-an-e2b-key")
    out["odd_key"] = "sent"
except Exception as exc:  # what the SDK raises is what is reported
    out["odd_key"] = f"{type(exc).__name__}: {exc}"

sb = Sandbox.create(metadata={"tag": tag}, timeout=120)
out["run"] = sb.commands.run("echo hi; id -un").stdout
sb.files.write("/tmp/note", "written")
out["listed"] = [
    s.sandbox_id == sb.sandbox_id
    for s in Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items()
]
sb.pause()
out["running_while_paused"] = sb.is_running()
again = Sandbox.connect(sb.sandbox_id, timeout=60)
out["read_after_resume"] = again.files.read("/tmp/note")
out["state"] = again.get_info().state.value
out["key_prefix"] = os.environ["E2B_API_KEY"][:4]
out["killed"] = again.kill()
print(json.dumps(out))
