-- A least-privilege role for cdc-outbox. Run it with psql as a superuser in
-- the outbox's database, after sql/publication.sql; safe to run again (an
-- existing role gets the attributes and the password again):
--
--   psql -v ON_ERROR_STOP=1 -v role=cdc_outbox -v password="$CDC_OUTBOX_DB_PASSWORD" \
--        -d payments -f sql/role.sql
--
-- psql fills in :"role" (quoted as a name), :'password' (quoted as a
-- string) and :"DBNAME" (the database psql is connected to).
--
-- The administrator, not cdc-outbox, owns the publication and creates the
-- slot, once, in the same database:
--
--   SELECT pg_create_logical_replication_slot('cdc_outbox', 'pgoutput');
--
-- and cdc-outbox runs as this role with --create-publication=false and
-- --create-slot=false. Creating a publication takes CREATE on the database
-- and ownership of the table; cdc-outbox also writes the slots it created
-- into the publication's comment, which only the owner may do, so that a
-- dropped slot is never re-created silently. With --create-slot=false a
-- missing slot stops cdc-outbox instead, which protects the same way.
--
-- What REPLICATION itself allows, no GRANT can narrow: the role may create
-- and drop replication slots, and a slot of its own with another output
-- plugin decodes the changes of every table in the databases it can connect
-- to. In pg_hba.conf, allow the role only on this database (a logical
-- replication connection matches the database name), over TLS with
-- scram-sha-256, and never on the `replication` keyword, which would let it
-- take a physical copy of the whole cluster:
--
--   hostssl  payments  cdc_outbox  10.0.0.0/8  scram-sha-256

SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'role') AS cdc_outbox_role_missing \gset
\if :cdc_outbox_role_missing
CREATE ROLE :"role";
\endif

-- LOGIN to connect; REPLICATION for the replication connection
-- (START_REPLICATION on the slot). Nothing else: not a superuser, no
-- databases, roles or row-level-security bypass. The server stores the
-- password as a SCRAM-SHA-256 verifier (password_encryption, the default
-- since PostgreSQL 14); this statement carries it in clear text, so do not
-- run it with log_statement = 'all'.
ALTER ROLE :"role" WITH LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS PASSWORD :'password';

-- Connect to the outbox's database. PUBLIC has this by default; servers
-- that revoke it from PUBLIC need it granted.
GRANT CONNECT ON DATABASE :"DBNAME" TO :"role";

-- Find the outbox table by name (cdc-outbox checks at start that it
-- exists). USAGE on a schema allows name lookups only, no access to any
-- table in it. PUBLIC has it on schema public by default; an outbox in a
-- schema of its own needs this line with that schema.
--
-- Up to PostgreSQL 14, PUBLIC also has CREATE on schema public, so this
-- role (like every role) can create tables there; no grant can take that
-- from one role alone. PostgreSQL 15 revoked it; on 14, do what 15 does,
-- once, if no other role relies on it:
--
--   REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO :"role";

-- No SELECT on the outbox table, nor on anything else: the walsender reads
-- the outbox's inserts from the WAL through the publication and checks no
-- table privilege for that (only a subscription's initial copy of a table
-- would need SELECT, and cdc-outbox makes none). The catalog views it reads
-- (pg_replication_slots, pg_publication, pg_publication_tables, pg_roles)
-- are readable by every role.
