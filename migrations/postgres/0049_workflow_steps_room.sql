-- Room on each page of the steps table for a row's next versions. A step
-- row is rewritten three times after it is stored (counted down, released,
-- ended); the count-down changes no indexed column, so with room on the
-- page its new version stays there (a heap-only update) and none of the
-- table's indexes is written. Applies to pages written from now on.
ALTER TABLE jobhost.workflow_steps SET (fillfactor = 70);
