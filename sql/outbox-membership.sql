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
-- cdc-outbox run installs it itself, and registers its patterns, when its
-- role is a superuser (event triggers need one). Otherwise install it once
-- per database, as a superuser; safe to run twice:
--
--   psql -d app -v ON_ERROR_STOP=1 -f sql/outbox-membership.sql -c "SELECT cdc_outbox.watch('cdc_outbox', '*', 'outbox')"
--
-- cdc_outbox.watch(publication, schema, table) registers one pattern: each
-- part is a name as the catalog stores it (unquoted names in lower case),
-- in which * stands for any run of characters, as in cdc-outbox's --table.
-- Register every pattern cdc-outbox streams; cdc_outbox.unwatch removes one.
-- cdc_outbox.watch(publication, schema, table, row_filter) registers a
-- pattern whose tables join the publication with that row filter: a
-- shard's (cdc-outbox run --shards, docs/sharding.md), one registration per
-- shard's publication. A table the filter does not fit (its aggregate id
-- column missing, or not text or varchar) does not join: a WARNING to the
-- session that made it, the DDL succeeds.
--
-- What joins: a table created (CREATE TABLE, CREATE TABLE ... AS,
-- SELECT INTO, CREATE SCHEMA ... CREATE TABLE), renamed or moved
-- (ALTER TABLE ... RENAME / SET SCHEMA), or in a schema renamed
-- (ALTER SCHEMA ... RENAME) so that it matches, and an UNLOGGED one made
-- LOGGED (ALTER TABLE ... SET LOGGED). CREATE TABLE ... AS writes its rows
-- before the table can join, so they would not be streamed: the trigger
-- writes them again (deleted and inserted with the same values, in the same
-- transaction) once the table is in the publication, so that they are.
--
-- What never joins: a TEMPORARY table (never written to the WAL, private
-- to its session: never an outbox) and an UNLOGGED one (its rows are not
-- written to the WAL), which PostgreSQL refuses to publish. The trigger
-- skips them, so the DDL succeeds; an UNLOGGED one is a WARNING to the
-- session that made it, and cdc-outbox's slot monitor and status report
-- either as a table that matches a pattern and cannot be streamed.
--
-- Where a gap is still possible: tables that existed before the pattern was
-- registered (add them by hand, then republish their rows with cdc-outbox
-- republish); a table created while the trigger is disabled, or by a
-- session with session_replication_role = replica (event triggers do not
-- fire there); rows written into an UNLOGGED table before it was made
-- LOGGED. A publication FOR ALL TABLES needs none of this (it publishes
-- every table from its creation on).

SET client_min_messages = warning;

CREATE SCHEMA IF NOT EXISTS cdc_outbox;

CREATE TABLE IF NOT EXISTS cdc_outbox.membership (
    publication    name NOT NULL,
    schema_pattern text NOT NULL,  -- * is any run of characters
    table_pattern  text NOT NULL,
    PRIMARY KEY (publication, schema_pattern, table_pattern)
);
-- The row filter a matching table joins with ('' none); a table of an
-- earlier version of this file gets it.
ALTER TABLE cdc_outbox.membership ADD COLUMN IF NOT EXISTS row_filter text NOT NULL DEFAULT '';

-- like is a pattern with * as a LIKE pattern: every other character literal.
CREATE OR REPLACE FUNCTION cdc_outbox.like(pattern text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
    RETURN replace(replace(replace(replace(pattern, '\', '\\'), '%', '\%'), '_', '\_'), '*', '%');

CREATE OR REPLACE FUNCTION cdc_outbox.watch(publication name, schema_pattern text, table_pattern text) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
        INSERT INTO cdc_outbox.membership VALUES (publication, schema_pattern, table_pattern) ON CONFLICT DO NOTHING;
    END;

CREATE OR REPLACE FUNCTION cdc_outbox.watch(publication name, schema_pattern text, table_pattern text, row_filter text) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
        INSERT INTO cdc_outbox.membership VALUES (publication, schema_pattern, table_pattern, row_filter)
        ON CONFLICT (publication, schema_pattern, table_pattern) DO UPDATE SET row_filter = EXCLUDED.row_filter;
    END;

CREATE OR REPLACE FUNCTION cdc_outbox.unwatch(publication name, schema_pattern text, table_pattern text) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
        DELETE FROM cdc_outbox.membership m
        WHERE m.publication = unwatch.publication AND m.schema_pattern = unwatch.schema_pattern AND m.table_pattern = unwatch.table_pattern;
    END;

-- The patterns are not secret: any role may read them, so that a
-- cdc-outbox whose role is no superuser can tell whether its patterns are
-- registered.
GRANT USAGE ON SCHEMA cdc_outbox TO PUBLIC;
GRANT SELECT ON cdc_outbox.membership TO PUBLIC;

-- The event trigger's function: each table the command created or altered,
-- or that lies in a schema the command created or renamed, that matches a
-- registered pattern and is not yet published by that publication, is
-- added to it. Partitions are left out: their table's membership covers
-- them. SECURITY DEFINER: whoever creates a tenant's outbox need not own
-- the publication.
CREATE OR REPLACE FUNCTION cdc_outbox.add_matching_tables() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    t record;
    filled oid[] := '{}';  -- tables created with their rows (CREATE TABLE ... AS) and added
BEGIN
    FOR t IN
        WITH touched AS (
            SELECT d.objid AS oid, d.command_tag IN ('CREATE TABLE AS', 'SELECT INTO') AS filled
            FROM pg_event_trigger_ddl_commands() d WHERE d.classid = 'pg_class'::regclass
            UNION ALL
            -- CREATE SCHEMA ... CREATE TABLE reports its tables too; ALTER
            -- SCHEMA ... RENAME reports only the schema.
            SELECT c.oid, false FROM pg_event_trigger_ddl_commands() d JOIN pg_class c ON c.relnamespace = d.objid
            WHERE d.classid = 'pg_namespace'::regclass
        )
        SELECT DISTINCT m.publication, n.nspname, c.relname, c.oid, c.relpersistence, m.row_filter, bool_or(tc.filled) OVER (PARTITION BY c.oid) AS filled
        FROM touched tc
        JOIN pg_class c ON c.oid = tc.oid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN cdc_outbox.membership m ON n.nspname LIKE cdc_outbox.like(m.schema_pattern) AND c.relname LIKE cdc_outbox.like(m.table_pattern)
        JOIN pg_publication p ON p.pubname = m.publication
        WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND NOT p.puballtables
        -- A temporary table is private to its session and never in the
        -- WAL: never an outbox, whatever its name.
        AND c.relpersistence <> 't'
        -- Not a member itself, nor published otherwise (FOR TABLES IN
        -- SCHEMA): adding it again would be an error.
        AND NOT EXISTS (SELECT 1 FROM pg_publication_rel pr WHERE pr.prpubid = p.oid AND pr.prrelid = c.oid)
        AND NOT EXISTS (SELECT 1 FROM pg_publication_tables pt
            WHERE pt.pubname = m.publication AND pt.schemaname = n.nspname AND pt.tablename = c.relname)
    LOOP
        IF t.relpersistence = 'u' THEN
            -- PostgreSQL refuses to publish it; failing the DDL would help
            -- no one. ALTER TABLE ... SET LOGGED adds it.
            RAISE WARNING 'table %.% matches an outbox pattern of publication % but is UNLOGGED: its rows are not written to the WAL, so they cannot be streamed',
                quote_ident(t.nspname), quote_ident(t.relname), quote_ident(t.publication)
                USING HINT = format('ALTER TABLE %I.%I SET LOGGED adds it to the publication; rows written before are not streamed.', t.nspname, t.relname);
            CONTINUE;
        END IF;
        IF t.row_filter <> '' THEN
            -- A shard's: a filter the table does not fit (no such column,
            -- or another type than hashtext takes) would fail the DDL.
            BEGIN
                EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I.%I WHERE (%s)', t.publication, t.nspname, t.relname, t.row_filter);
            EXCEPTION WHEN others THEN
                RAISE WARNING 'table %.% matches an outbox pattern of publication % but cannot join it with the shard''s row filter %: %',
                    quote_ident(t.nspname), quote_ident(t.relname), quote_ident(t.publication), t.row_filter, SQLERRM
                    USING HINT = 'Its aggregate id column must be text or varchar; its rows are not streamed until it is added by hand.';
                CONTINUE;
            END;
        ELSE
            EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I.%I', t.publication, t.nspname, t.relname);
        END IF;
        IF t.filled AND NOT t.oid = ANY (filled) THEN
            filled := filled || t.oid;
        END IF;
    END LOOP;
    -- The rows CREATE TABLE ... AS wrote went to the WAL before the table
    -- joined the publication: written again now, in the same transaction,
    -- they are streamed. The table is new, so no trigger, constraint or
    -- reference of the user's sees this.
    FOR t IN SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ANY (filled) LOOP
        EXECUTE format('WITH moved AS (DELETE FROM ONLY %I.%I RETURNING *) INSERT INTO %I.%I SELECT * FROM moved',
            t.nspname, t.relname, t.nspname, t.relname);
    END LOOP;
END
$$;

-- The commands that may make a table match. A trigger installed by an
-- earlier version of this file with fewer of them is replaced, a disabled
-- one enabled.
DO $$
DECLARE
    tags text[] := ARRAY['CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE', 'CREATE SCHEMA', 'ALTER SCHEMA'];
BEGIN
    IF EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cdc_outbox_membership' AND evttags IS DISTINCT FROM tags) THEN
        DROP EVENT TRIGGER cdc_outbox_membership;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cdc_outbox_membership') THEN
        EXECUTE format('CREATE EVENT TRIGGER cdc_outbox_membership ON ddl_command_end WHEN TAG IN (%s) EXECUTE FUNCTION cdc_outbox.add_matching_tables()',
            (SELECT string_agg(quote_literal(tag), ', ') FROM unnest(tags) tag));
    END IF;
    -- Installing it is asking for it to work: a disabled one is enabled.
    ALTER EVENT TRIGGER cdc_outbox_membership ENABLE;
END
$$;

-- What cdc-outbox run compares to tell whether this version is installed:
-- change it with the file.
COMMENT ON EVENT TRIGGER cdc_outbox_membership IS 'cdc-outbox membership 3';
