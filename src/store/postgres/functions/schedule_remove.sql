-- jobhost.schedule_remove: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
--
-- Removes the schedule of a job type and key in the caller's transaction:
-- no tick after that transaction commits (a pass holding the row finishes
-- first; one after it finds no row). True when there was one. The change
-- is recorded in the audit trail (`jobhost.audit_write`).
CREATE OR REPLACE FUNCTION jobhost.schedule_remove(schedule_job text, schedule_key text)
    RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    removed boolean;
BEGIN
    DELETE FROM jobhost.keyed_schedules s WHERE s.job = schedule_job AND s.key = schedule_key;
    removed := FOUND;
    PERFORM jobhost.audit_write('schedule.remove', 'schedule ' || schedule_job || '/' || schedule_key,
                                CASE WHEN removed THEN 'removed' ELSE 'absent' END);
    RETURN removed;
END
$$;
