-- The fleet's latest look at each schedule that handled it, in
-- milliseconds (see migrations/postgres/0015_schedule_looks.sql).
ALTER TABLE schedules ADD COLUMN looked_at INTEGER;
