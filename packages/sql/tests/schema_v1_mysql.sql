-- chatkeep-sql schema revision 0001 for mysql, frozen: the migration tests build a database from it.
-- Generated once with alembic's offline mode (upgrade 0001 --sql); never edit it.

CREATE TABLE chatkeep_alembic_version (
    version_num VARCHAR(32) NOT NULL, 
    CONSTRAINT chatkeep_alembic_version_pkc PRIMARY KEY (version_num)
);

-- Running upgrade  -> 0001

CREATE TABLE chatkeep_sessions (
    id BIGINT NOT NULL AUTO_INCREMENT, 
    key_hash BINARY(32) NOT NULL, 
    tenant_hash BINARY(32) NOT NULL, 
    tenant BLOB NOT NULL, 
    session_id BLOB NOT NULL, 
    created_at BIGINT NOT NULL, 
    updated_at BIGINT NOT NULL, 
    next_seq BIGINT NOT NULL, 
    message_count BIGINT NOT NULL, 
    document LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, 
    doc_version BIGINT NOT NULL DEFAULT '0', 
    owner BLOB, 
    PRIMARY KEY (id), 
    CONSTRAINT uq_chatkeep_sessions_key UNIQUE (key_hash)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE INDEX ix_chatkeep_sessions_tenant_updated ON chatkeep_sessions (tenant_hash, updated_at, id);

CREATE INDEX ix_chatkeep_sessions_updated ON chatkeep_sessions (updated_at);

CREATE TABLE chatkeep_messages (
    session_ref BIGINT NOT NULL, 
    seq BIGINT NOT NULL, 
    message_hash BINARY(16) NOT NULL, 
    record LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, 
    PRIMARY KEY (session_ref, seq), 
    CONSTRAINT uq_chatkeep_messages_message UNIQUE (session_ref, message_hash), 
    CONSTRAINT fk_chatkeep_messages_session FOREIGN KEY(session_ref) REFERENCES chatkeep_sessions (id) ON DELETE CASCADE
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

INSERT INTO chatkeep_alembic_version (version_num) VALUES ('0001');

