-- jobhost.event_matches, jobhost.match_one: their current definitions.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
--
-- Whether an event's payload holds every field of a wait's match, each as
-- the same text (`->>`: strings as themselves, numbers in numeric's form,
-- booleans as true/false); a null, an object or an array never matches.
-- The same rule as src/store/wait.rs's `matches`, for SQLite.

CREATE OR REPLACE FUNCTION jobhost.event_matches(wanted jsonb, payload jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT
    AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM jsonb_each_text(wanted) m
        WHERE jsonb_typeof(payload -> m.key) IS DISTINCT FROM 'string'
              AND jsonb_typeof(payload -> m.key) IS DISTINCT FROM 'number'
              AND jsonb_typeof(payload -> m.key) IS DISTINCT FROM 'boolean'
           OR (payload ->> m.key) IS DISTINCT FROM m.value
    )
$$;

-- A match of exactly one field as `["field", "value"]`, else NULL: the
-- form an event's own fields are looked up by (event_send).
CREATE OR REPLACE FUNCTION jobhost.match_one(wanted jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
    AS $$
    SELECT CASE WHEN count(*) = 1 THEN jsonb_build_array(min(m.key), min(m.value))::text END
    FROM jsonb_each_text(wanted) m
$$;
