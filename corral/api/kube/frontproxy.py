"""The aggregated-API mode's authentication: a request whose connection presented a client certificate
the TLS layer verified against the request-header CA (:data:`corral.listener.TLS_PEER`), with a
common name the policy trusts, speaks for the user its ``X-Remote-User`` and ``X-Remote-Group``
headers name, mapped by :func:`corral.core.frontproxy.map_user`. From any other connection those
headers mean nothing: the request is authenticated by its bearer token, or not at all."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from corral.control.errors import Forbidden
from corral.control.plane import ControlPlane
from corral.core.frontproxy import FrontProxyPolicy, map_user
from corral.listener import TLS_PEER
from corral.store import Principal, Role

USER_HEADER = "x-remote-user"
GROUP_HEADER = "x-remote-group"
# Marks a principal as the front proxy's (no token of corral's has this id).
TOKEN_ID_PREFIX = "front-proxy:"


def common_name(certificate: dict[str, Any]) -> str | None:
    """The subject's CN of a certificate as ``ssl.SSLSocket.getpeercert()`` gives it."""
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class FrontProxy:
    def __init__(self, plane: ControlPlane, policy: FrontProxyPolicy) -> None:
        self.plane = plane
        self.policy = policy

    def trusted(self, request: Request) -> bool:
        certificate = request.scope.get("state", {}).get(TLS_PEER)
        return bool(certificate) and self.policy.trusts(common_name(certificate))

    async def principal(self, request: Request) -> Principal | None:
        """Who the front proxy says is asking; None: not a trusted front proxy's request (or it names
        no user), so its identity headers are ignored."""
        if not self.trusted(request):
            return None
        user = request.headers.get(USER_HEADER, "")
        if not user:
            return None
        groups = request.headers.getlist(GROUP_HEADER)
        mapped = map_user(self.policy, user, groups)
        token_id = TOKEN_ID_PREFIX + user
        if mapped.role == "admin":
            return Principal(token_id, self.plane.default_tenant_id, Role.ADMIN)
        if mapped.tenant is None:
            raise Forbidden(mapped.refusal)
        tenant = await self.plane.store.get_tenant_by_name(mapped.tenant)
        if tenant is None:
            raise Forbidden(f'user "{user}" maps to tenant "{mapped.tenant}", which corral does not have')
        return Principal(token_id, tenant.id, Role.TENANT)
