-- jobhost.audit_write: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
--
-- Records a change made through a function applications call
-- (`jobhost.schedule_upsert`, `jobhost.schedule_remove`) in the audit
-- trail, in the caller's transaction (docs/audit.md). The actor is the one
-- a host set for the transaction in `jobhost.actor` (a JSON object: via,
-- who, address, user_agent), so a change through the API or the CLI is
-- recorded once, as its caller; `-` marks a job's own change, recorded with
-- its run and not here; with neither, the change is an application's SQL,
-- recorded as the session's login role at its address.
--
-- It writes with its owner's rights (the role that applies the functions,
-- which owns the table), its search path pinned: an application role that
-- may call `jobhost.schedule_upsert` needs no grant on `jobhost.audit`.
CREATE OR REPLACE FUNCTION jobhost.audit_write(audit_action text, audit_object text, audit_outcome text)
    RETURNS void
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    actor text := coalesce(current_setting('jobhost.actor', true), '');
BEGIN
    IF actor = '-' THEN
        RETURN;
    END IF;
    IF actor = '' THEN
        INSERT INTO jobhost.audit (via, who, address, user_agent, action, object, outcome)
        VALUES ('sql', session_user, host(inet_client_addr()),
                left(nullif(current_setting('application_name', true), ''), 200),
                audit_action, audit_object, audit_outcome);
    ELSE
        INSERT INTO jobhost.audit (via, who, address, user_agent, action, object, outcome)
        SELECT a.via, a.who, a.address, a.user_agent, audit_action, audit_object, audit_outcome
        FROM jsonb_to_record(actor::jsonb) AS a(via text, who text, address text, user_agent text);
    END IF;
END
$$;
