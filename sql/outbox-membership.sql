-- Keeps a publication's tables in step with cdc-outbox's outbox patterns
-- (--table '*.outbox', 'tenant_*.outbox'): a table created, renamed or moved
-- so that its name matches joins the publication in the same transaction,
-- so that every row of it, those written in that transaction included, is
-- streamed. A publication publishes a table only from the WAL point where
-- the table was added; without this, a new tenant's first rows are a gap
-- (cdc-outbox warns of a matching table that is not in the publication,
-- and counts it in cdc_outbox_outboxes_unpublished, but cannot stream what
-- was not published).
--
-- Install it once per database, as a superuser (event triggers need one);
-- safe to run twice:
--
--   psql -d app -f sql/outbox-membership.sql
--   psql -d app -c "SELECT cdc_outbox.watch('cdc_outbox', '*', 'outbox')"
--
-- cdc_outbox.watch(publication, schema, table) registers one pattern: each
-- part is a name as the catalog stores it (unquoted names in lower case),
-- in which * stands for any run of characters, as in cdc-outbox's --table.
-- Register every pattern cdc-outbox streams; cdc_outbox.unwatch removes one.
--
-- Where a gap is still possible: tables that existed before the pattern was
-- registered (add them by hand, then republish their rows with cdc-outbox
-- republish); a table created while the trigger is disabled, or by a
-- session with session_replication_role = replica (event triggers do not
-- fire there); a publication FOR ALL TABLES needs none of this (it
-- publishes every table from its creation on).

SET client_min_messages = warning;

CREATE SCHEMA IF NOT EXISTS cdc_outbox;

CREATE TABLE IF NOT EXISTS cdc_outbox.membership (
    publication    name NOT NULL,
    schema_pattern text NOT NULL,  -- * is any run of characters
    table_pattern  text NOT NULL,
    PRIMARY KEY (publication, schema_pattern, table_pattern)
);

-- like is a pattern with * as a LIKE pattern: every other character literal.
CREATE OR REPLACE FUNCTION cdc_outbox.like(pattern text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
    RETURN replace(replace(replace(replace(pattern, '\', '\\'), '%', '\%'), '_', '\_'), '*', '%');

CREATE OR REPLACE FUNCTION cdc_outbox.watch(publication name, schema_pattern text, table_pattern text) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
        INSERT INTO cdc_outbox.membership VALUES (publication, schema_pattern, table_pattern) ON CONFLICT DO NOTHING;
    END;

CREATE OR REPLACE FUNCTION cdc_outbox.unwatch(publication name, schema_pattern text, table_pattern text) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
        DELETE FROM cdc_outbox.membership m
        WHERE m.publication = unwatch.publication AND m.schema_pattern = unwatch.schema_pattern AND m.table_pattern = unwatch.table_pattern;
    END;

-- The event trigger's function: each table the command created or altered
-- that matches a registered pattern, and is not yet published by that
-- publication, is added to it. Partitions are left out: their table's
-- membership covers them. SECURITY DEFINER: whoever creates a tenant's
-- outbox need not own the publication.
CREATE OR REPLACE FUNCTION cdc_outbox.add_matching_tables() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT DISTINCT m.publication, n.nspname, c.relname, c.oid
        FROM pg_event_trigger_ddl_commands() d
        JOIN pg_class c ON c.oid = d.objid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN cdc_outbox.membership m ON n.nspname LIKE cdc_outbox.like(m.schema_pattern) AND c.relname LIKE cdc_outbox.like(m.table_pattern)
        JOIN pg_publication p ON p.pubname = m.publication
        WHERE d.classid = 'pg_class'::regclass AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND NOT p.puballtables
        -- Not a member itself, nor published otherwise (FOR TABLES IN
        -- SCHEMA): adding it again would be an error.
        AND NOT EXISTS (SELECT 1 FROM pg_publication_rel pr WHERE pr.prpubid = p.oid AND pr.prrelid = c.oid)
        AND NOT EXISTS (SELECT 1 FROM pg_publication_tables pt
            WHERE pt.pubname = m.publication AND pt.schemaname = n.nspname AND pt.tablename = c.relname)
    LOOP
        EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I.%I', t.publication, t.nspname, t.relname);
    END LOOP;
END
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cdc_outbox_membership') THEN
        CREATE EVENT TRIGGER cdc_outbox_membership ON ddl_command_end
            WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE')
            EXECUTE FUNCTION cdc_outbox.add_matching_tables();
    END IF;
END
$$;
