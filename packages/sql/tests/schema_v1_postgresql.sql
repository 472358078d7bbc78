-- chatkeep-sql schema revision 0001 for postgresql, frozen: the migration tests build a database from it.
-- Generated once with alembic's offline mode (upgrade 0001 --sql); never edit it.

BEGIN;

CREATE TABLE chatkeep_alembic_version (
    version_num VARCHAR(32) NOT NULL, 
    CONSTRAINT chatkeep_alembic_version_pkc PRIMARY KEY (version_num)
);

-- Running upgrade  -> 0001

CREATE TABLE chatkeep_sessions (
    id BIGSERIAL NOT NULL, 
    key_hash BYTEA NOT NULL, 
    tenant_hash BYTEA NOT NULL, 
    tenant BYTEA NOT NULL, 
    session_id BYTEA NOT NULL, 
    created_at BIGINT NOT NULL, 
    updated_at BIGINT NOT NULL, 
    next_seq BIGINT NOT NULL, 
    message_count BIGINT NOT NULL, 
    document TEXT, 
    doc_version BIGINT DEFAULT '0' NOT NULL, 
    owner BYTEA, 
    PRIMARY KEY (id), 
    CONSTRAINT uq_chatkeep_sessions_key UNIQUE (key_hash)
);

CREATE INDEX ix_chatkeep_sessions_tenant_updated ON chatkeep_sessions (tenant_hash, updated_at, id);

CREATE INDEX ix_chatkeep_sessions_updated ON chatkeep_sessions (updated_at);

CREATE TABLE chatkeep_messages (
    session_ref BIGINT NOT NULL, 
    seq BIGINT NOT NULL, 
    message_hash BYTEA NOT NULL, 
    record TEXT NOT NULL, 
    PRIMARY KEY (session_ref, seq), 
    CONSTRAINT uq_chatkeep_messages_message UNIQUE (session_ref, message_hash), 
    CONSTRAINT fk_chatkeep_messages_session FOREIGN KEY(session_ref) REFERENCES chatkeep_sessions (id) ON DELETE CASCADE
);

INSERT INTO chatkeep_alembic_version (version_num) VALUES ('0001') RETURNING chatkeep_alembic_version.version_num;

COMMIT;

