"""The first schema: sessions and their messages.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Frozen: this file must never change once released (tests/schema_v1_*.sql hold its DDL). Change the
schema with a new revision instead.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _hash(size: int) -> sa.types.TypeEngine[bytes]:
    # Fixed-size binary keys: BINARY(n) on MySQL/MariaDB (a BLOB cannot be a unique key), bytea/BLOB elsewhere.
    return sa.LargeBinary().with_variant(mysql.BINARY(size), "mysql", "mariadb")


def _text() -> sa.types.TypeEngine[str]:
    # TEXT on MySQL/MariaDB holds 64 KB: records and documents need LONGTEXT, compared as binary utf8mb4.
    return sa.Text().with_variant(mysql.LONGTEXT(charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb")


_MYSQL: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "chatkeep_sessions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("key_hash", _hash(32), nullable=False),
        sa.Column("tenant_hash", _hash(32), nullable=False),
        sa.Column("tenant", sa.LargeBinary(), nullable=False),
        sa.Column("session_id", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.Column("next_seq", sa.BigInteger(), nullable=False),
        sa.Column("message_count", sa.BigInteger(), nullable=False),
        sa.Column("document", _text(), nullable=True),
        sa.Column("doc_version", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("owner", sa.LargeBinary(), nullable=True),
        sa.UniqueConstraint("key_hash", name="uq_chatkeep_sessions_key"),
        sqlite_autoincrement=True,  # row ids are never reused, so a document version of a deleted session never returns
        **_MYSQL,
    )
    op.create_index("ix_chatkeep_sessions_tenant_updated", "chatkeep_sessions", ["tenant_hash", "updated_at", "id"])
    op.create_index("ix_chatkeep_sessions_updated", "chatkeep_sessions", ["updated_at"])
    op.create_table(
        "chatkeep_messages",
        sa.Column(
            "session_ref",
            sa.BigInteger(),
            sa.ForeignKey("chatkeep_sessions.id", ondelete="CASCADE", name="fk_chatkeep_messages_session"),
            nullable=False,
        ),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("message_hash", _hash(16), nullable=False),
        sa.Column("record", _text(), nullable=False),
        sa.PrimaryKeyConstraint("session_ref", "seq"),
        sa.UniqueConstraint("session_ref", "message_hash", name="uq_chatkeep_messages_message"),
        **_MYSQL,
    )


def downgrade() -> None:
    op.drop_table("chatkeep_messages")
    op.drop_index("ix_chatkeep_sessions_updated", "chatkeep_sessions")
    op.drop_index("ix_chatkeep_sessions_tenant_updated", "chatkeep_sessions")
    op.drop_table("chatkeep_sessions")
