-- jobhost.batch_add_members: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0009_batches.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.batch_add_members(batch_ids bigint[], closed_ok boolean[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    wanted record;
    found_batch record;
BEGIN
    FOR wanted IN
        SELECT m.batch_id, count(*) AS n, bool_and(m.closed_ok) AS closed_ok
        FROM unnest(batch_ids, closed_ok) AS m(batch_id, closed_ok)
        WHERE m.batch_id IS NOT NULL
        GROUP BY m.batch_id
        ORDER BY m.batch_id
    LOOP
        SELECT b.id, b.closed_at INTO found_batch FROM jobhost.batches b WHERE b.id = wanted.batch_id FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'batch % does not exist', wanted.batch_id USING ERRCODE = '22023';
        END IF;
        IF found_batch.closed_at IS NOT NULL AND NOT wanted.closed_ok THEN
            RAISE EXCEPTION 'batch % is closed: it takes no more jobs', wanted.batch_id USING ERRCODE = '22023';
        END IF;
        UPDATE jobhost.batches SET total = total + wanted.n WHERE id = wanted.batch_id;
    END LOOP;
END;
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;
