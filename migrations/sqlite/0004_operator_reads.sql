-- Operators count archived jobs by state and queue (`jobhost stats`) and
-- list them by state (`jobhost jobs --state`). Both columns are stored after
-- the payload, so without this index each read walked every archived
-- payload; with it, counts and the choice of rows read the index alone.
CREATE INDEX archive_state_queue ON archive (state, queue);
