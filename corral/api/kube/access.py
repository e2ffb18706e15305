"""Who is asking, and which namespaces (tenants) they may see: a tenant's token its own namespace
only (any other is forbidden, whether it exists or not, so none is seen to exist); the admin's every
namespace. Namespaces are tenants' names."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from corral.api.auth import as_user
from corral.api.kube.frontproxy import FrontProxy
from corral.control.errors import Forbidden, ResourceNotFound
from corral.control.plane import ControlPlane
from corral.store import Principal, Role, TenantRecord


@dataclass(frozen=True, slots=True)
class Access:
    principal: Principal
    # The namespace the request names (None: all the caller may see) and its tenant (None: the admin
    # named one that does not exist).
    namespace: str | None
    tenant: TenantRecord | None
    own: str  # the caller's own namespace: where shared objects show in an all-namespaces list

    @property
    def admin(self) -> bool:
        return self.principal.role is Role.ADMIN

    def tenant_or_404(self) -> TenantRecord:
        if self.tenant is None:
            raise ResourceNotFound(f'namespaces "{self.namespace}" not found')
        return self.tenant

    def need_admin(self, what: str) -> None:
        if not self.admin:
            raise Forbidden(f"{what} are the fleet's, shared by every namespace: only the admin writes them")


def bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class Namespaces:
    """Tenants by id, cached (an id is never given to another tenant), and by name, read each time: a
    name is freed when its tenant is removed, on any replica, and may then name a new tenant."""

    def __init__(self, plane: ControlPlane, front_proxy: FrontProxy | None = None) -> None:
        self.plane = plane
        self.front_proxy = front_proxy
        self._by_id: dict[str, TenantRecord] = {}

    async def name_of(self, tenant_id: str) -> str:
        t = self._by_id.get(tenant_id)
        if t is None:
            t = await self.plane.store.get_tenant(tenant_id)
            if t is None:
                return tenant_id
            self._by_id[tenant_id] = t
        return t.name

    async def by_name(self, name: str) -> TenantRecord | None:
        t = await self.plane.store.get_tenant_by_name(name)
        if t is not None:
            self._by_id[t.id] = t
        return t

    async def all(self) -> list[TenantRecord]:
        tenants = await self.plane.store.list_tenants()
        self._by_id.update({t.id: t for t in tenants})
        return tenants

    async def caller(self, request: Request) -> Principal:
        """The front proxy's user, when a trusted front proxy sent the request; else its token's."""
        if self.front_proxy is not None:
            p = await self.front_proxy.principal(request)
            if p is not None:
                return p
        return as_user(await self.plane.authenticate(bearer(request)))

    async def access(self, request: Request, namespace: str | None) -> Access:
        p = await self.caller(request)
        own_id = p.tenant_id or self.plane.default_tenant_id
        own = await self.name_of(own_id) if own_id else "default"
        if namespace is None:
            tenant = None if p.role is Role.ADMIN else await self._own(p)
            return Access(p, None, tenant, own)
        tenant = await self.by_name(namespace)
        if p.role is not Role.ADMIN and (tenant is None or tenant.id != p.tenant_id):
            raise Forbidden(f'this token may not act in namespace "{namespace}"')
        return Access(p, namespace, tenant, own)

    async def _own(self, p: Principal) -> TenantRecord:
        if p.tenant_id is None:
            raise Forbidden("this token belongs to no tenant")
        t = await self.plane.store.get_tenant(p.tenant_id)
        if t is None:
            raise Forbidden("this token's tenant is gone")
        return t
