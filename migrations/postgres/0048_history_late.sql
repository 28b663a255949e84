-- Minutes of the history to compute again: an archived job whose
-- transaction began in a minute that ended before it committed (a result
-- write that waited on an application's lock) may have been missed by a
-- pass that computed that minute and moved the mark past it. The deferred
-- trigger flags such minutes at commit; the next history pass computes them
-- again and removes the flags.
CREATE TABLE jobhost.history_late (
    minute timestamptz PRIMARY KEY
);

-- Its living copy is src/store/postgres/functions/archive_flag_late.sql.
CREATE FUNCTION jobhost.archive_flag_late() RETURNS trigger
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

CREATE CONSTRAINT TRIGGER archive_flag_late AFTER INSERT ON jobhost.archive
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION jobhost.archive_flag_late();
