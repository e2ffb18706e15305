"""The versioned schema. One list, one logical schema; each step is spelled once per dialect only where
the types differ. Versions are applied in order, each exactly once, recorded in ``schema_migrations``;
a backend applies them under a lock (an advisory lock on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite) so
replicas starting at once do not race.

Times are epoch seconds as floating point; CPU amounts of reservations and of tenants' quotas and
usage are integer millicores.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.store.records import DEFAULT_MAX_CPUS, to_millicores
from corral.store.rows import SANDBOX_CPU_M


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]
    # Statements spelled once per dialect (triggers, functions), run after the common ones.
    per_dialect: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


# Written in the common subset; ``{real}``, ``{bool}``, ``{false}`` are the dialect's spellings.
_V1 = (
    """CREATE TABLE hosts (
        id TEXT PRIMARY KEY,
        address TEXT NOT NULL DEFAULT '',
        heartbeat_at {real} NOT NULL DEFAULT 0,
        seq BIGINT NOT NULL DEFAULT -1,
        cpu_total {real} NOT NULL DEFAULT 0,
        cpu_used {real} NOT NULL DEFAULT 0,
        memory_mb_total BIGINT NOT NULL DEFAULT 0,
        memory_mb_used BIGINT NOT NULL DEFAULT 0,
        memory_mb_admittable BIGINT NOT NULL DEFAULT 0,
        memory_admission TEXT NOT NULL DEFAULT 'working-set',
        templates TEXT,
        runtime TEXT NOT NULL DEFAULT 'sim',
        gpu TEXT,
        role TEXT NOT NULL DEFAULT 'worker',
        state TEXT NOT NULL DEFAULT 'ready',
        stream_restore {bool} NOT NULL DEFAULT {false},
        sandbox_ids TEXT NOT NULL DEFAULT '[]',
        registered_at {real} NOT NULL DEFAULT 0,
        reserved_mb BIGINT NOT NULL DEFAULT 0 CHECK (reserved_mb >= 0),
        reserved_cpu_m BIGINT NOT NULL DEFAULT 0 CHECK (reserved_cpu_m >= 0)
    )""",
    """CREATE TABLE reservations (
        id TEXT PRIMARY KEY,
        host_id TEXT NOT NULL,
        memory_mb BIGINT NOT NULL CHECK (memory_mb >= 0),
        cpu_m BIGINT NOT NULL CHECK (cpu_m >= 0),
        owner TEXT NOT NULL,
        sandbox_id TEXT,
        created_at {real} NOT NULL,
        expires_at {real} NOT NULL
    )""",
    # Only outstanding reservations are rows (an ended one is deleted), so the table stays small and
    # every index is paid for inside the hot path's row locks: keep the two that reads lean on.
    "CREATE INDEX reservations_host_expiry ON reservations (host_id, expires_at)",
    "CREATE INDEX reservations_expiry ON reservations (expires_at)",
    """CREATE TABLE tenants (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        max_sandboxes BIGINT NOT NULL,
        max_memory_mb BIGINT NOT NULL,
        created_at {real} NOT NULL
    )""",
    """CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        hash TEXT NOT NULL UNIQUE,
        tenant_id TEXT,
        role TEXT NOT NULL,
        created_at {real} NOT NULL
    )""",
    """CREATE TABLE templates (
        name TEXT PRIMARY KEY,
        cpus {real} NOT NULL,
        memory_mb BIGINT NOT NULL,
        stateful {bool} NOT NULL,
        runtime TEXT,
        description TEXT NOT NULL DEFAULT '',
        created_at {real} NOT NULL
    )""",
    """INSERT INTO templates (name, cpus, memory_mb, stateful, runtime, description, created_at)
       VALUES ('default', 1, 512, {false}, NULL, 'built-in: 1 cpu, 512 MiB', 0)""",
    """CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL,
        name TEXT,
        template TEXT NOT NULL,
        host_id TEXT,
        state TEXT NOT NULL,
        memory_mb BIGINT NOT NULL,
        cpus {real} NOT NULL,
        stateful {bool} NOT NULL,
        metadata TEXT NOT NULL DEFAULT '{{}}',
        created_at {real} NOT NULL,
        updated_at {real} NOT NULL,
        expires_at {real},
        reservation_id TEXT,
        version BIGINT NOT NULL DEFAULT 1
    )""",
    # A name is unique among the tenant's sandboxes that are not deleted (NULL names never collide).
    "CREATE UNIQUE INDEX sandboxes_tenant_name ON sandboxes (tenant_id, name) WHERE state <> 'deleted'",
    "CREATE INDEX sandboxes_tenant_page ON sandboxes (tenant_id, created_at, id)",
    "CREATE INDEX sandboxes_page ON sandboxes (created_at, id)",
    "CREATE INDEX sandboxes_host ON sandboxes (host_id)",
    "CREATE INDEX sandboxes_expiry ON sandboxes (expires_at) WHERE expires_at IS NOT NULL",
    """CREATE TABLE idempotency_keys (
        tenant_id TEXT NOT NULL,
        key TEXT NOT NULL,
        request_hash TEXT,
        sandbox_id TEXT NOT NULL,
        record TEXT NOT NULL,
        created_at {real} NOT NULL,
        PRIMARY KEY (tenant_id, key)
    )""",
    "CREATE TABLE replicas (id TEXT PRIMARY KEY, expires_at {real} NOT NULL)",
    "CREATE TABLE leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at {real} NOT NULL)",
)

# A tenant's usage as running counters, kept in the same transaction as every change to its sandboxes:
# the quota check on each create reads one row instead of counting the tenant's sandboxes.
_LIVE = "('reserved', 'starting', 'running', 'waiting_capacity', 'orphaned')"
_V2 = (
    "ALTER TABLE tenants ADD COLUMN live_sandboxes BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE tenants ADD COLUMN live_memory_mb BIGINT NOT NULL DEFAULT 0",
    f"""UPDATE tenants SET
        live_sandboxes = (SELECT count(*) FROM sandboxes s WHERE s.tenant_id = tenants.id AND s.state IN {_LIVE}),
        live_memory_mb = (SELECT coalesce(sum(memory_mb), 0) FROM sandboxes s
                          WHERE s.tenant_id = tenants.id AND s.state IN {_LIVE})""",
)

# Host identity and token lifecycle. An agent token names its host (``tokens.host_id``), so a token
# speaks for one host only. ``tokens.source`` marks a token adopted from a server's configuration, so the
# next start with another one can revoke it. ``host_keys`` holds the key the control plane presents
# when it calls a host's agent. ``auth_epoch`` counts revocations: replicas poll this one row to drop
# their cached tokens instead of asking the store about every token on every request.
# ``revoked_tokens`` remembers revoked hashes, so a replica restarted with a stale configured token
# cannot bring it back.
_V3 = (
    "ALTER TABLE tokens ADD COLUMN host_id TEXT",
    "ALTER TABLE tokens ADD COLUMN source TEXT",
    "CREATE INDEX tokens_host ON tokens (host_id)",
    "CREATE TABLE host_keys (host_id TEXT PRIMARY KEY, key TEXT NOT NULL, created_at {real} NOT NULL)",
    "CREATE TABLE auth_epoch (id INTEGER PRIMARY KEY, epoch BIGINT NOT NULL)",
    "INSERT INTO auth_epoch (id, epoch) VALUES (1, 0)",
    "CREATE TABLE revoked_tokens (hash TEXT PRIMARY KEY, revoked_at {real} NOT NULL)",
)

# Each sandbox's pids limit comes from its template; OOM kills inside a sandbox are reported by its
# host's heartbeats and kept on its record.
_V4 = (
    "ALTER TABLE templates ADD COLUMN pids BIGINT NOT NULL DEFAULT 512",
    "ALTER TABLE sandboxes ADD COLUMN oom_kills BIGINT NOT NULL DEFAULT 0",
)

# Warm pools as intent: one row per pool and one per (pool, host) target, never a row per warm
# sandbox. A host's warm counts ride on its heartbeat row; a claimed sandbox's record says it was warm.
_V5 = (
    """CREATE TABLE pools (
        template TEXT PRIMARY KEY,
        size BIGINT NOT NULL CHECK (size >= 0),
        max_per_host BIGINT CHECK (max_per_host IS NULL OR max_per_host > 0),
        created_at {real} NOT NULL,
        updated_at {real} NOT NULL
    )""",
    """CREATE TABLE pool_targets (
        template TEXT NOT NULL,
        host_id TEXT NOT NULL,
        target BIGINT NOT NULL CHECK (target > 0),
        PRIMARY KEY (template, host_id)
    )""",
    "ALTER TABLE hosts ADD COLUMN warm TEXT NOT NULL DEFAULT '{{}}'",
    "ALTER TABLE sandboxes ADD COLUMN warm {bool} NOT NULL DEFAULT {false}",
)

# Secrets every replica of one deployment shares, each made once by whichever replica needs it first
# (the key that signs sandboxes' data-plane access tokens): a replica restarted or rotated keeps them.
_V7 = ("CREATE TABLE fleet_secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL, created_at {real} NOT NULL)",)

# Why a create went where it went: a compact JSON document written by the same UPDATE that marks the
# sandbox placed, so a sandbox and its explanation never disagree.
_V6 = ("ALTER TABLE sandboxes ADD COLUMN placement TEXT",)

# Failover. ``failover`` is a sandbox's policy when its host dies (recreate elsewhere, or orphan);
# ``epoch`` counts its owners, bumped by the one conditional write that gives it a new host;
# ``spec`` is its environment and secrets sealed (AES-GCM, the id as associated data), never plaintext.
# A row of ``fences`` says: this host's copy of this sandbox, if older than ``epoch``, must stop;
# it is written with the reassignment and read by that host's heartbeats until the copy is gone.
# A create that may wait for capacity is a record in ``waiting_capacity`` until ``wait_until``.
_V8 = (
    "ALTER TABLE sandboxes ADD COLUMN failover TEXT NOT NULL DEFAULT 'orphan'",
    "ALTER TABLE sandboxes ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE sandboxes ADD COLUMN recreated_at {real}",
    "ALTER TABLE sandboxes ADD COLUMN spec TEXT",
    # A create parked in ``waiting_capacity`` is placed by the leader until this deadline.
    "ALTER TABLE sandboxes ADD COLUMN wait_until {real}",
    "ALTER TABLE templates ADD COLUMN failover TEXT NOT NULL DEFAULT 'orphan'",
    """CREATE TABLE fences (
        host_id TEXT NOT NULL,
        sandbox_id TEXT NOT NULL,
        epoch BIGINT NOT NULL,
        PRIMARY KEY (host_id, sandbox_id)
    )""",
)

# Reads by state or by host that page in creation order find their rows through an index instead of
# scanning (or sorting) every sandbox: the reconciler looks for reserved, orphaned and deleted records
# every round, and a fleet of 100,000 live sandboxes made each of those lookups a full scan.
# A host's list of sandbox ids (tens of thousands on a full host) moves to a row of its own: every
# reservation updates its host's counters, and SQLite rewrites a whole row, list included, on each.
_V9 = (
    "CREATE INDEX sandboxes_state_page ON sandboxes (state, created_at, id)",
    "CREATE INDEX sandboxes_host_page ON sandboxes (host_id, created_at, id)",
    "DROP INDEX sandboxes_host",
    "CREATE TABLE host_sandboxes (host_id TEXT PRIMARY KEY, sandbox_ids TEXT NOT NULL)",
    "INSERT INTO host_sandboxes (host_id, sandbox_ids) SELECT id, sandbox_ids FROM hosts",
    "ALTER TABLE hosts DROP COLUMN sandbox_ids",
)

# A host's listing as one row per sandbox, so a heartbeat that carries only what changed costs what
# changed: ``present`` false keeps a gone entry for a while, so the reconciler finds what went as well as
# what came by ``changed_at`` instead of reading every record. The host row holds which heartbeat's
# listing it is (``listed_seq``; NULL: none to trust, send the whole set), its digest, when it was last
# brought up to date and its size. The old JSON lists are dropped: each agent is asked for its whole set
# at its next heartbeat.
_V10 = (
    "DROP TABLE host_sandboxes",
    """CREATE TABLE listed_sandboxes (
        host_id TEXT NOT NULL,
        sandbox_id TEXT NOT NULL,
        epoch BIGINT NOT NULL DEFAULT 0,
        present {bool} NOT NULL,
        changed_at {real} NOT NULL,
        PRIMARY KEY (host_id, sandbox_id)
    )""",
    "CREATE INDEX listed_sandboxes_changed ON listed_sandboxes (changed_at)",
    "CREATE INDEX listed_sandboxes_sandbox ON listed_sandboxes (sandbox_id)",
    "ALTER TABLE hosts ADD COLUMN listed_seq BIGINT",
    "ALTER TABLE hosts ADD COLUMN listed_digest BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE hosts ADD COLUMN listed_at {real} NOT NULL DEFAULT 0",
    "ALTER TABLE hosts ADD COLUMN listed_count BIGINT NOT NULL DEFAULT 0",
)

# Which replica's create wrote a sandbox record: one left ``reserved`` by a replica whose lease lapsed
# is settled as soon as that is known, not only after the longest create a live replica could make.
_V11 = ("ALTER TABLE sandboxes ADD COLUMN owner TEXT",)

# Every create moves its record from reserved to running and gives it a host: full indexes by state and
# by host each took a delete and an insert for that move. The reads they serve ask for the few records
# that are not running (reserved, orphaned, deleted) or for one host's: the state index now holds only
# records that are not running, the host index only records with a host. A list of running sandboxes
# pages through the creation-order index (nearly every record matches).
_V12 = (
    "DROP INDEX sandboxes_state_page",
    "CREATE INDEX sandboxes_state_page ON sandboxes (state, created_at, id) WHERE state <> 'running'",
    "DROP INDEX sandboxes_host_page",
    "CREATE INDEX sandboxes_host_page ON sandboxes (host_id, created_at, id) WHERE host_id IS NOT NULL",
)

# A live name is unique within its tenant; most sandboxes have none, and a record without one can never
# conflict (NULLs are distinct). Kept in the index, they all shared one key prefix that every create's
# insert and every change of state (the index's condition reads it) searched and rewrote.
_V13 = (
    "DROP INDEX sandboxes_tenant_name",
    "CREATE UNIQUE INDEX sandboxes_tenant_name ON sandboxes (tenant_id, name) "
    "WHERE name IS NOT NULL AND state <> 'deleted'",
)

# A tenant's CPU quota beside its count and memory, counted like them: ``live_cpu_m`` is what its live
# sandboxes ask for, in millicores, kept in the same transaction as every change to them. Tenants made
# before it get the default quota, raised to what they already hold, so none is over it at once.
_LIVE_NOW = "('reserved', 'starting', 'running', 'waiting_capacity', 'orphaned', 'recreating')"
_V14 = (
    f"ALTER TABLE tenants ADD COLUMN max_cpu_m BIGINT NOT NULL DEFAULT {to_millicores(DEFAULT_MAX_CPUS)}",
    "ALTER TABLE tenants ADD COLUMN live_cpu_m BIGINT NOT NULL DEFAULT 0",
    f"""UPDATE tenants SET live_cpu_m = (SELECT coalesce(sum({SANDBOX_CPU_M}), 0) FROM sandboxes s
                                         WHERE s.tenant_id = tenants.id AND s.state IN {_LIVE_NOW})""",
    "UPDATE tenants SET max_cpu_m = live_cpu_m WHERE live_cpu_m > max_cpu_m",
)

# Templates name an image (a digest) and how its sandboxes run in it (its config, JSON) and their own
# disk's size; a sandbox keeps the image it was created from (a rebuild of its template names a new
# one) and its disk's size. NULL: the host's own system directories, as before images.
_V15 = (
    "ALTER TABLE templates ADD COLUMN image TEXT",
    "ALTER TABLE templates ADD COLUMN image_config TEXT",
    "ALTER TABLE templates ADD COLUMN disk_mb BIGINT",
    "ALTER TABLE sandboxes ADD COLUMN image TEXT",
    "ALTER TABLE sandboxes ADD COLUMN disk_mb BIGINT",
)

# Images. A blob store on PostgreSQL keeps each image's bytes as rows of one chunk each (any replica
# serves any image, a read is one short query per chunk), and its ``image_blobs`` row, written last in
# the same transaction as the chunks, says the bytes are whole and hashed to the digest. A host's
# heartbeat says which images it holds (``hosts.images``, a JSON list of digests, O(images)): placement
# scores a host that need not fetch the image above one that must.
_V16 = (
    """CREATE TABLE image_blobs (
        digest TEXT PRIMARY KEY,
        size BIGINT NOT NULL,
        chunks BIGINT NOT NULL,
        created_at {real} NOT NULL
    )""",
    """CREATE TABLE image_chunks (
        digest TEXT NOT NULL,
        seq BIGINT NOT NULL,
        data {blob} NOT NULL,
        PRIMARY KEY (digest, seq)
    )""",
    "ALTER TABLE hosts ADD COLUMN images TEXT NOT NULL DEFAULT '[]'",
)

# The change feed: every write to a sandbox, template or pool row gets one store-wide version, kept in
# ``changes`` (a bounded history, pruned by the leader), so a watch on any replica reads what changed
# since a version. Written by triggers, so no write path can forget it. On PostgreSQL the version is
# taken from one counter row by a trigger deferred to commit: the counter's lock is the last one a
# transaction takes (no deadlock with any other order) and is held until it commits, so versions are
# visible in their order; ``pg_notify`` wakes every replica's watches at that commit. SQLite commits
# one writer at a time, so an AUTOINCREMENT key is already in commit order.
_V17 = (
    """CREATE TABLE changes (
        version BIGINT PRIMARY KEY,
        kind TEXT NOT NULL,
        key TEXT NOT NULL,
        tenant_id TEXT,
        name TEXT,
        deleted {bool} NOT NULL
    )""",
)
_SQLITE_CHANGE = (
    "INSERT INTO changes (version, kind, key, tenant_id, name, deleted) VALUES ("
    "(SELECT version + 1 FROM changes_seq), '{kind}', {row}.{key}, {tenant}, {name}, {deleted}); "
    "UPDATE changes_seq SET version = version + 1"
)


def _sqlite_triggers(table: str, kind: str, key: str, tenant: bool, name: bool) -> tuple[str, ...]:
    out = []
    for op, row, deleted in (("INSERT", "NEW", 0), ("UPDATE", "NEW", 0), ("DELETE", "OLD", 1)):
        body = _SQLITE_CHANGE.format(
            kind=kind,
            row=row,
            key=key,
            tenant=f"{row}.tenant_id" if tenant else "NULL",
            name=f"{row}.name" if name else "NULL",
            deleted=deleted,
        )
        out.append(f"CREATE TRIGGER {table}_change_{op.lower()} AFTER {op} ON {table} BEGIN {body}; END")
    return tuple(out)


_V17_SQLITE = (
    "CREATE TABLE changes_seq (version INTEGER NOT NULL)",
    "INSERT INTO changes_seq VALUES (0)",
    *_sqlite_triggers("sandboxes", "sandbox", "id", tenant=True, name=True),
    *_sqlite_triggers("templates", "template", "name", tenant=False, name=False),
    *_sqlite_triggers("pools", "pool", "template", tenant=False, name=False),
)
_V17_POSTGRES = (
    "CREATE TABLE changes_seq (version BIGINT NOT NULL)",
    "INSERT INTO changes_seq VALUES (0)",
    """CREATE FUNCTION corral_change() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        v BIGINT;
        r RECORD;
    BEGIN
        IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
        UPDATE changes_seq SET version = version + 1 RETURNING version INTO v;
        IF TG_TABLE_NAME = 'sandboxes' THEN
            INSERT INTO changes VALUES (v, 'sandbox', r.id, r.tenant_id, r.name, TG_OP = 'DELETE');
        ELSIF TG_TABLE_NAME = 'templates' THEN
            INSERT INTO changes VALUES (v, 'template', r.name, NULL, NULL, TG_OP = 'DELETE');
        ELSE
            INSERT INTO changes VALUES (v, 'pool', r.template, NULL, NULL, TG_OP = 'DELETE');
        END IF;
        PERFORM pg_notify('corral_changes', v::text);
        RETURN NULL;
    END $$""",
    *(
        f"CREATE CONSTRAINT TRIGGER {t}_change AFTER INSERT OR UPDATE OR DELETE ON {t} "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION corral_change()"
        for t in ("sandboxes", "templates", "pools")
    ),
)

# A sandbox's egress policy (canonical JSON; NULL: no interface but loopback, as before networks).
_V18 = ("ALTER TABLE sandboxes ADD COLUMN network TEXT",)

# A tenant's create rate (a token bucket: creates a second, and at most at once), summed over every
# replica. NULL: the control plane's configured default, so tenants made before it keep that.
_V19 = (
    "ALTER TABLE tenants ADD COLUMN create_rate {real}",
    "ALTER TABLE tenants ADD COLUMN create_burst INTEGER",
)

# What a sandbox's timeout does (corral.core.lifecycle's text; NULL: it is killed), and how it is
# paused while the control plane has paused it (memory or filesystem; NULL: not paused).
_V20 = (
    "ALTER TABLE sandboxes ADD COLUMN lifecycle TEXT",
    "ALTER TABLE sandboxes ADD COLUMN paused TEXT",
)

# Custom domains: a hostname is its own key, so of two binds of one name one commits.
_V21 = (
    "CREATE TABLE sandbox_domains (hostname TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, "
    "tenant_id TEXT NOT NULL, port INTEGER NOT NULL, created_at {real} NOT NULL)",
    "CREATE INDEX sandbox_domains_by_sandbox ON sandbox_domains (sandbox_id)",
)

_V22 = ("ALTER TABLE templates ADD COLUMN version INTEGER NOT NULL DEFAULT 1",)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "hosts, reservations, sandboxes, tenants, leases", _V1),
    Migration(2, "tenant usage counters", _V2),
    Migration(3, "host identity: per-host agent tokens and keys, token sources, revocation epoch", _V3),
    Migration(4, "template pids limit, sandbox OOM kills", _V4),
    Migration(5, "warm pools and per-host targets", _V5),
    Migration(6, "placement explanation on the sandbox row", _V6),
    Migration(7, "secrets shared by every replica", _V7),
    Migration(8, "failover policy, epochs, fences, sealed specs", _V8),
    Migration(9, "sandbox indexes by state and by host; hosts' sandbox lists in their own table", _V9),
    Migration(10, "hosts' listings one row per sandbox, with digest and acknowledged seq", _V10),
    Migration(11, "the replica whose create wrote a sandbox record", _V11),
    Migration(12, "sandbox indexes by state and by host hold only records not running, with a host", _V12),
    Migration(13, "the unique index of live names holds only named sandboxes", _V13),
    Migration(14, "tenant CPU quota and its usage counter", _V14),
    Migration(15, "templates name an image, its config and a disk size; sandboxes keep theirs", _V15),
    Migration(16, "image blobs in chunks; the images each host holds", _V16),
    Migration(
        17,
        "a store-wide change feed of sandboxes, templates and pools",
        _V17,
        {"sqlite": _V17_SQLITE, "postgres": _V17_POSTGRES},
    ),
    Migration(18, "sandboxes keep their egress policy", _V18),
    Migration(19, "tenant create rates", _V19),
    Migration(
        20, "sandboxes keep their lifecycle (pause on timeout, auto-resume) and how they are paused", _V20
    ),
    Migration(21, "custom domains bound to sandboxes' ports", _V21),
    Migration(22, "templates count their versions (a rebuild is the next one)", _V22),
)

LATEST = MIGRATIONS[-1].version

DIALECTS = {
    "sqlite": {"real": "REAL", "bool": "INTEGER", "false": "0", "blob": "BLOB"},
    "postgres": {"real": "DOUBLE PRECISION", "bool": "BOOLEAN", "false": "FALSE", "blob": "BYTEA"},
}


def statements(migration: Migration, dialect: str) -> list[str]:
    words = DIALECTS[dialect]
    return [s.format(**words) for s in migration.statements] + list(migration.per_dialect.get(dialect, ()))
