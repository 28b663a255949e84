-- The fleet's latest look at each schedule that handled it (wrote its due
-- ticks or found none due), by that look's clock. A host that starts while
-- others have been looking counts the ticks since their last look as due,
-- not missed: whether a tick was missed while no host looked is the
-- database's to say, not one host's memory. Null until a host records a
-- look (hosts before this version never do: their looks count as before).
ALTER TABLE jobhost.schedules ADD COLUMN looked_at timestamptz;
