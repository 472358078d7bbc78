"""The search index on PostgreSQL: a keyword index beside the messages and the record of the index's embedder.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03

Frozen once released: change the schema with a new revision instead.

On PostgreSQL, ``chatkeep_search`` holds one row per indexed message (its role and its keywords as a
``tsvector`` under a GIN index), deleted with its message (a foreign key ``ON DELETE CASCADE``), and
``chatkeep_search_index`` the one row naming the embedder the index was built with. The vector column is not
made here: its width is the embedder's, known when the first message is indexed, so the store adds it then
(``embedding vector(N)`` with an HNSW index, in the pgvector extension's schema; see ``chatkeep.sql._search``).
SQLite and MySQL/MariaDB: no change (SQLite keeps its index in virtual tables the store makes on a transport
that loads sqlite-vec; MySQL and MariaDB cannot search).
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        "CREATE TABLE chatkeep_search_index (id SMALLINT PRIMARY KEY CHECK (id = 1), embedder TEXT, dimensions INTEGER)"
    )
    op.execute("INSERT INTO chatkeep_search_index (id, embedder, dimensions) VALUES (1, NULL, NULL)")
    op.execute(
        "CREATE TABLE chatkeep_search ("
        "session_ref BIGINT NOT NULL, seq BIGINT NOT NULL, role TEXT NOT NULL, terms TSVECTOR NOT NULL, "
        "PRIMARY KEY (session_ref, seq), "
        "CONSTRAINT fk_chatkeep_search_message FOREIGN KEY (session_ref, seq) "
        "REFERENCES chatkeep_messages (session_ref, seq) ON DELETE CASCADE)"
    )
    op.execute("CREATE INDEX ix_chatkeep_search_terms ON chatkeep_search USING gin (terms)")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TABLE chatkeep_search")
    op.execute("DROP TABLE chatkeep_search_index")
