-- jobhost.batch_open: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0009_batches.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.batch_open(label text DEFAULT NULL::text, on_finish text DEFAULT NULL::text, on_success text DEFAULT NULL::text, on_failure text DEFAULT NULL::text, callback_payload jsonb DEFAULT '{}'::jsonb) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_variable
DECLARE
    callback text;
    new_id bigint;
BEGIN
    FOREACH callback IN ARRAY ARRAY[on_finish, on_success, on_failure] LOOP
        IF callback IS NOT NULL AND NOT EXISTS (SELECT 1 FROM jobhost.job_types t WHERE t.name = callback) THEN
            RAISE EXCEPTION 'unknown job type "%": no host has loaded a component for it', callback
                USING ERRCODE = '22023';
        END IF;
    END LOOP;
    IF callback_payload IS NULL OR jsonb_typeof(callback_payload) <> 'object' THEN
        RAISE EXCEPTION 'a batch''s callback payload must be a JSON object' USING ERRCODE = '22023';
    END IF;
    INSERT INTO jobhost.batches (label, on_finish, on_success, on_failure, callback_payload)
    VALUES (label, on_finish, on_success, on_failure, callback_payload)
    RETURNING id INTO new_id;
    RETURN new_id;
END;
$$;
