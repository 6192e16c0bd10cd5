"""Bearer tokens of the read endpoint: roles, stored hashed, managed by the CLI.

A token is ``rfr_<id>_<secret>``; the file ``$REWARDFLOW_HOME/read-tokens.json``
(mode 0600) keeps, per id, its role, name, trainer and the SHA-256 of the whole
token, never the token itself. Roles:

* ``analyst``: runs read queries;
* ``trainer``: runs read queries and advances the cursor of its own trainer only;
* ``owner``: runs read queries and advances any trainer's cursor. The chDB owner
  writes one such token to ``$REWARDFLOW_HOME/read.token`` (mode 0600), so the
  CLI and trainers of the same OS user on the same machine read without setup,
  and nobody else can.

A reader never sends its token: it signs each request with it
(:func:`~rewardflow.clickhouse.remote.request_signature`, checked by :meth:`TokenStore.signed`), so
the token works as a bearer token only for clients that send it (``curl``).

Contract: :class:`TokenStore` reads the file again whenever it changed, so a
revoked token stops working at the endpoint's next request. Writes replace the
file atomically. Nothing here prints a token except :meth:`TokenStore.create`'s
return value.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from rewardflow.clickhouse.readers import TRAINER_NAME
from rewardflow.clickhouse.remote import LOCAL_TOKEN_FILE, read_local_token, request_signature, token_proof

Role = Literal["analyst", "trainer", "owner"]
ROLES: tuple[Role, ...] = ("analyst", "trainer", "owner")
TOKENS_FILE = "read-tokens.json"
_TOKEN = re.compile(r"^rfr_([0-9a-f]{12})_[A-Za-z0-9_-]{20,}$")


class TokenError(ValueError):
    """A token operation that cannot be done (unknown id, bad role or trainer name)."""


@dataclass(frozen=True)
class Grant:
    """What one token may do."""

    token_id: str
    role: Role
    name: str
    trainer: str | None
    created_at: float
    revoked_at: float | None = None

    def may_move(self, trainer: str) -> bool:
        """Whether this token may advance ``trainer``'s cursor."""
        return self.revoked_at is None and (self.role == "owner" or (self.role == "trainer" and self.trainer == trainer))


class TokenStore:
    """The token file under ``home``."""

    def __init__(self, home: Path) -> None:
        self.path = home / TOKENS_FILE
        self._seen: tuple[float, int] | None = None
        self._grants: dict[str, tuple[Grant, str]] = {}

    # ------------------------------------------------------------------ reading
    def _load(self) -> dict[str, tuple[Grant, str]]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._seen, self._grants = None, {}
            return self._grants
        if self._seen != (st.st_mtime, st.st_size):
            doc = orjson.loads(self.path.read_bytes())
            self._grants = {k: (Grant(**v["grant"]), v["sha256"]) for k, v in doc.items()}
            self._seen = (st.st_mtime, st.st_size)
        return self._grants

    def _unrevoked(self, token_id: str) -> tuple[Grant, str] | None:
        """The grant of token ``token_id`` and the token's SHA-256, unless it is unknown or revoked."""
        entry = self._load().get(token_id)
        return None if entry is None or entry[0].revoked_at is not None else entry

    def verify(self, token: str) -> Grant | None:
        """The grant of a valid, unrevoked ``token``, else None (constant time in the secret)."""
        match = _TOKEN.match(token)
        entry = None if match is None else self._unrevoked(match.group(1))
        if entry is None or not hmac.compare_digest(entry[1], _digest(token)):
            return None
        return entry[0]

    def proof(self, token_id: str, nonce: str) -> str | None:
        """What proves to a client holding token ``token_id`` that this store keeps it: the HMAC-SHA256 of
        ``nonce`` under a key derived from the token's SHA-256 (:func:`~rewardflow.clickhouse.remote.token_proof`;
        never the key requests are signed with), which only the token's holder and this file's owner can
        compute. None for an unknown or revoked id."""
        entry = self._unrevoked(token_id)
        return None if entry is None else token_proof(entry[1], nonce)

    def signed(self, token_id: str, route: str, ts: int, nonce: str, content_type: str, body: bytes,
               sig: str) -> Grant | None:
        """The grant of an unrevoked token ``token_id`` whose holder signed this request (``sig`` is
        :func:`~rewardflow.clickhouse.remote.request_signature` of it), else None (constant time in the
        signature). The caller checks the time and that the nonce is new."""
        entry = self._unrevoked(token_id)
        if entry is None:
            return None
        want = request_signature(entry[1], route, ts, nonce, content_type, body)
        return entry[0] if hmac.compare_digest(want, sig) else None

    def list(self) -> list[Grant]:
        return sorted((g for g, _ in self._load().values()), key=lambda g: g.created_at)

    # ------------------------------------------------------------------ writing
    def create(self, role: str, name: str = "", trainer: str | None = None) -> tuple[Grant, str]:
        """A new token: its grant and the token itself (shown once; only its hash is kept)."""
        if role not in ROLES:
            raise TokenError(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
        if role == "trainer" and (trainer is None or not TRAINER_NAME.match(trainer)):
            raise TokenError("a trainer token needs --trainer NAME (letters, digits, . _ : -, at most 128)")
        if role != "trainer" and trainer is not None:
            raise TokenError("--trainer goes with --role trainer only")
        grants = dict(self._load())
        token_id = secrets.token_hex(6)
        token = f"rfr_{token_id}_{secrets.token_urlsafe(32)}"
        grant = Grant(token_id, role, name[:128], trainer, time.time())
        grants[token_id] = (grant, _digest(token))
        self._save(grants)
        return grant, token

    def revoke(self, token_id: str) -> Grant:
        grants = dict(self._load())
        if token_id not in grants:
            raise TokenError(f"no token with id {token_id!r} (see rewardflow tokens list)")
        grant, digest = grants[token_id]
        revoked = Grant(**{**asdict(grant), "revoked_at": grant.revoked_at or time.time()})
        grants[token_id] = (revoked, digest)
        self._save(grants)
        return revoked

    def _save(self, grants: dict[str, tuple[Grant, str]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {k: {"grant": asdict(g), "sha256": d} for k, (g, d) in grants.items()}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        os.replace(tmp, self.path)
        self._seen = None


def ensure_local_token(home: Path) -> None:
    """Make sure ``home/read.token`` holds a valid owner token (the chDB owner calls this at start)."""
    store, path = TokenStore(home), home / LOCAL_TOKEN_FILE
    current = read_local_token(home)
    if current is not None and store.verify(current) is not None:
        return
    _, token = store.create("owner", "local (this machine's user)")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
