-- jobhost.render_key: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0002_sql_enqueue.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.render_key(template text, payload jsonb) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
    AS $$
DECLARE
    rendered text := '';
    i integer := 1;
    n integer := length(template);
    c text;
    close_at integer;
    field text;
    value jsonb;
BEGIN
    WHILE i <= n LOOP
        c := substr(template, i, 1);
        IF c = '{' AND substr(template, i + 1, 1) = '{' THEN
            rendered := rendered || '{';
            i := i + 2;
        ELSIF c = '}' AND substr(template, i + 1, 1) = '}' THEN
            rendered := rendered || '}';
            i := i + 2;
        ELSIF c = '{' THEN
            close_at := strpos(substr(template, i + 1), '}');
            field := substr(template, i + 1, close_at - 1);
            value := payload -> field;
            IF value IS NULL OR jsonb_typeof(value) = 'null' THEN
                RAISE EXCEPTION 'payload has no field "%" for key "%"', field, template USING ERRCODE = '22023';
            ELSIF jsonb_typeof(value) IN ('object', 'array') THEN
                RAISE EXCEPTION 'field "%" for key "%" must be a string, number or boolean', field, template
                    USING ERRCODE = '22023';
            END IF;
            rendered := rendered || (payload ->> field);
            i := i + close_at + 1;
        ELSE
            rendered := rendered || c;
            i := i + 1;
        END IF;
    END LOOP;
    RETURN rendered;
END;
$$;
