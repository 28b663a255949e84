-- A promotion of one freed slot of a key that cannot exist (an empty job
-- type), to warm a new session (see warm in finish.rs): it locks, moves and
-- counts nothing, and its search for the key's missing semaphore row
-- promotes nothing.
SELECT r.promoted FROM jobhost.release_slots_leasing('{""}', '{""}', '{default}', '{""}', '{60}', 1, '') r
