-- Enqueue from SQL, for any language: the same rules as the host's own
-- enqueue (a registered job type, a JSON-object payload, the type's
-- defaults and concurrency key). Errors are raised with SQLSTATE 22023.

-- Renders a key template ("account:{account_id}") from a payload's top-level
-- fields, exactly as jobhost::template::KeyTemplate does: strings as
-- themselves, numbers and booleans as their JSON text, "{{" and "}}" as braces.
CREATE FUNCTION jobhost.render_key(template text, payload jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
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

CREATE FUNCTION jobhost.enqueue(
    job text,
    payload jsonb,
    queue text DEFAULT NULL,
    priority smallint DEFAULT NULL,
    run_at timestamptz DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    config jsonb;
    new_id bigint;
    due timestamptz := greatest(coalesce(run_at, now()), now());
    chosen_queue text;
BEGIN
    SELECT t.config INTO config FROM jobhost.job_types t WHERE t.name = job;
    IF config IS NULL THEN
        RAISE EXCEPTION 'unknown job type "%": no host has loaded a component for it', job USING ERRCODE = '22023';
    END IF;
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'payload of job "%" must be a JSON object', job USING ERRCODE = '22023';
    END IF;
    chosen_queue := coalesce(queue, config ->> 'queue');
    IF chosen_queue !~ '^[a-z0-9_.-]{1,128}$' THEN
        RAISE EXCEPTION 'queue "%" must be 1 to 128 characters of a-z, 0-9, _, . and -', chosen_queue
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO jobhost.jobs (job, queue, priority, payload, state, max_attempts, run_at, concurrency_key)
    VALUES (
        job,
        chosen_queue,
        coalesce(priority, (config ->> 'priority')::smallint),
        payload,
        CASE WHEN due > now() THEN 'scheduled' ELSE 'available' END,
        (config ->> 'max_attempts')::integer,
        due,
        CASE WHEN jsonb_typeof(config -> 'concurrency') = 'object'
             THEN jobhost.render_key(config -> 'concurrency' ->> 'key', payload) END
    )
    RETURNING id INTO new_id;
    RETURN new_id;
END;
$$;
