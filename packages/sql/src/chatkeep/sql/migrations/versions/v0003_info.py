"""Forks, and what a store keeps about a session beside its messages: token usage, title, tags and metadata.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03

Frozen once released: change the schema with a new revision instead.

``chatkeep_sessions`` gains ``token_usage`` (the session's token usage as JSON, kept by every write), ``title``,
``tags`` (a JSON list, what ``list_sessions`` reports) and ``metadata`` (JSON); ``chatkeep_messages`` gains
``token_usage`` (the usage of that one message as JSON, ``NULL`` for a message without usage contents), so that a
pop or a trim subtracts what it removes without decoding records. ``chatkeep_tags`` is the tag index that
``list_sessions(tag=...)`` reads: one row per (tag, session), keyed by a hash of the tenant and the tag, deleted
with its session (a foreign key ``ON DELETE CASCADE``). Existing sessions start with no usage, title or tags:
their messages were stored before usage was counted.

Forks refer to their source's messages instead of copying them: ``base_ref`` names the row whose messages below
``base_cut`` a row's history continues, ``first_seq`` is the first sequence number a session shows, ``forks``
counts the rows that refer to a row (such a row never loses a message: a pop or trim of its session moves the
session onto a new row on top of it, and deleting it only hides it), ``doc_ref`` is the row id a moved
session's document versions keep, and ``forked_from``/``forked_through`` say where a fork came from.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_MYSQL: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def _text() -> sa.types.TypeEngine[str]:
    # TEXT on MySQL/MariaDB holds 64 KB: metadata may take 64 KiB of UTF-8, so LONGTEXT, compared as binary.
    return sa.Text().with_variant(mysql.LONGTEXT(charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb")


def upgrade() -> None:
    for column in ("token_usage", "title", "tags", "metadata"):
        op.add_column("chatkeep_sessions", sa.Column(column, _text(), nullable=True))
    # Forks: the row whose messages below base_cut this row's history continues (a chain of rows), the first
    # sequence number the session shows (a trim of a fork raises it), how many rows continue this one, the row
    # whose id a moved session's document versions keep, and where the session was forked from.
    op.add_column("chatkeep_sessions", sa.Column("base_ref", sa.BigInteger(), nullable=True))
    for column in ("base_cut", "first_seq", "forks"):
        op.add_column("chatkeep_sessions", sa.Column(column, sa.BigInteger(), nullable=False, server_default="0"))
    op.add_column("chatkeep_sessions", sa.Column("doc_ref", sa.BigInteger(), nullable=True))
    for column in ("forked_from", "forked_through"):
        op.add_column("chatkeep_sessions", sa.Column(column, sa.LargeBinary(), nullable=True))
    op.add_column("chatkeep_messages", sa.Column("token_usage", _text(), nullable=True))
    op.create_table(
        "chatkeep_tags",
        sa.Column(
            "session_ref",
            sa.BigInteger(),
            sa.ForeignKey("chatkeep_sessions.id", ondelete="CASCADE", name="fk_chatkeep_tags_session"),
            nullable=False,
        ),
        sa.Column("tag_hash", sa.LargeBinary().with_variant(mysql.BINARY(32), "mysql", "mariadb"), nullable=False),
        sa.PrimaryKeyConstraint("session_ref", "tag_hash"),
        **_MYSQL,
    )
    op.create_index("ix_chatkeep_tags_tag", "chatkeep_tags", ["tag_hash", "session_ref"])


def downgrade() -> None:
    op.drop_index("ix_chatkeep_tags_tag", "chatkeep_tags")
    op.drop_table("chatkeep_tags")
    op.drop_column("chatkeep_messages", "token_usage")
    for column in ("forked_through", "forked_from", "doc_ref", "forks", "first_seq", "base_cut", "base_ref"):
        op.drop_column("chatkeep_sessions", column)
    for column in ("metadata", "tags", "title", "token_usage"):
        op.drop_column("chatkeep_sessions", column)
