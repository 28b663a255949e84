-- jobhost.archive_flag_late: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migration 0048_history_late.sql holds its first copy as history.

-- Runs at the commit of every transaction that archived a job (a deferred
-- constraint trigger): a row whose finished_at (the transaction's start)
-- lies in a minute that has already ended commits late, and the history
-- may have computed that minute without it, so the minute is flagged for
-- the next pass to compute again (src/store/postgres/history.rs). Checked
-- at the commit, not at the insert, so no lock wait after the insert can
-- slip a row past the check. A flag already there is updated, not left
-- alone: the update holds its row until this commit, so a pass taking the
-- flags (DELETE) waits for this transaction and then sees its row.
CREATE OR REPLACE FUNCTION jobhost.archive_flag_late() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.finished_at < date_trunc('minute', clock_timestamp()) THEN
        INSERT INTO jobhost.history_late (minute) VALUES (date_trunc('minute', NEW.finished_at))
        ON CONFLICT (minute) DO UPDATE SET minute = EXCLUDED.minute;
    END IF;
    RETURN NULL;
END;
$$;
