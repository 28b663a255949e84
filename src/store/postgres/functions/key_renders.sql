-- jobhost.key_renders: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0024_rate_limits.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.key_renders(template text, payload jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT
    AS $$
    SELECT jsonb_typeof(payload) = 'object'
       AND NOT EXISTS (
           SELECT 1
           FROM regexp_matches(replace(replace(template, '{{', ''), '}}', ''), '\{([^{}]*)\}', 'g') AS m(field)
           WHERE coalesce(jsonb_typeof(payload -> m.field[1]), 'null') NOT IN ('string', 'number', 'boolean'))
$$;
